// The Cache's GPU tier: placing device copies of a prefix's blocks for
// same-host workers, and dropping them. See cache.h ("The GPU tier"),
// device_tier.h and docs/tiers.md.
#include <algorithm>
#include <tuple>
#include <utility>

#include "absl/strings/str_cat.h"
#include "server/common/status_macros.h"
#include "server/core/block_move.h"
#include "server/core/cache.h"

namespace kvcache {
namespace {

// Device copies one write may drop for room before it gives up (a size
// class may need several).
constexpr int kMaxDeviceDropsPerWrite = 64;
// Device copies one Migrate() pass drops at most.
constexpr int kMaxDeviceDropsPerPass = 4096;

}  // namespace

void Cache::DropDeviceCopyLocked(IndexNode* node, DeviceDrop why) {
  const StoredRef* copy = device_copies_.Find(node);
  if (copy == nullptr) return;
  const char* reason = "";
  switch (why) {
    case DeviceDrop::kRoom:
      ++tier_.device_drops_room;
      reason = "room";
      break;
    case DeviceDrop::kPressure:
      ++tier_.device_drops_pressure;
      reason = "pressure";
      break;
    case DeviceDrop::kRecompressed:
      ++tier_.device_drops_invalidated;
      reason = "recompressed";
      break;
    case DeviceDrop::kRestored:
      ++tier_.device_drops_invalidated;
      reason = "restored";
      break;
  }
  const uint64_t size = (*copy)->seal().size;
  --tier_.device_blocks;
  tier_.device_payload_bytes -= size;
  tiers_->LogMove(*node, "gpu", "none", reason, size);
  // The slot is freed here unless a lease still holds the copy (then when
  // the lease ends).
  device_copies_.Take(node);
}

bool Cache::DropDeviceVictimLocked(DeviceDrop why) {
  // Only the tier's own map holds it: no lease, no placement in flight.
  IndexNode* victim =
      device_copies_.PickVictim([](const StoredRef& copy) { return !copy->pins().pinned(); });
  if (victim == nullptr) return false;
  DropDeviceCopyLocked(victim, why);
  return true;
}

absl::StatusOr<StoredRef> Cache::WriteDevice(uint64_t key, const BlockPayload& payload) {
  for (int attempt = 0;; ++attempt) {
    absl::StatusOr<StoredRef> copy = device_->Write(key, payload);
    if (copy.ok() || !absl::IsResourceExhausted(copy.status()) ||
        attempt == kMaxDeviceDropsPerWrite) {
      return copy;
    }
    WriteLock lock(this);
    if (!DropDeviceVictimLocked(DeviceDrop::kRoom)) return copy;
  }
}

bool Cache::DeviceNeedsMigration() const {
  if (device_ == nullptr) return false;
  const TierStats s = device_->GetStats();
  return static_cast<double>(s.allocated_bytes) >
         options_.tiers.device_high_watermark * static_cast<double>(s.capacity_bytes);
}

uint64_t Cache::MigrateDevice() {
  const uint64_t capacity = device_->GetStats().capacity_bytes;
  const auto target =
      static_cast<uint64_t>(options_.tiers.device_low_watermark * static_cast<double>(capacity));
  uint64_t dropped = 0;
  WriteLock lock(this);
  while (dropped < kMaxDeviceDropsPerPass && device_->GetStats().allocated_bytes > target &&
         DropDeviceVictimLocked(DeviceDrop::kPressure)) {
    ++dropped;
  }
  return dropped;
}

absl::StatusOr<DevicePlacement> Cache::PlaceOnDevice(const ModelKey& model,
                                                     std::span<const Token> tokens,
                                                     absl::Duration lease_ttl) {
  if (device_ == nullptr) {
    return absl::FailedPreconditionError(
        "this kvcached has no GPU tier (gpu_tier.kind is off, or no device was usable at "
        "start-up); fetch the blocks instead");
  }
  KVCACHE_RETURN_IF_ERROR(CheckTokenCount(tokens.size()));
  KVCACHE_RETURN_IF_ERROR(CheckLeaseTtl(lease_ttl));
  absl::StatusOr<BlockHashes> hashes = HashBlocks(model, tokens);
  if (!hashes.ok()) return hashes.status();

  // 1. The exact prefix, under the lock; blocks already on the device are
  // held from here on.
  DevicePlacement out;
  std::vector<TieredBlock> blocks;
  std::vector<BlockMove> moves;  // host or SSD -> GPU, one per block
  const PrefixIndex* index;
  uint32_t bt;
  std::vector<BlockRef> expired;  // released after the lock
  {
    WriteLock lock(this);
    auto state = FindModelLocked(model);
    if (!state.ok()) return state.status();
    ModelState& m = **state;
    std::vector<IndexNode*> path;
    MatchLocked(m, tokens, *hashes, &path, &expired);
    bt = m.layout.block_tokens;
    const size_t exact = ReadableBlocks(path, /*accept_lossy=*/false);
    out.withheld_tokens = (path.size() - exact) * bt;
    path.resize(exact);
    m.hit_tokens += exact * bt;
    m.miss_tokens += (tokens.size() / bt) * bt - exact * bt;
    blocks.reserve(path.size());
    moves.reserve(path.size());
    for (IndexNode* n : path) {
      moves.push_back(BlockMove::Claim(*n));
      TieredBlock b = TakeBlock(*n, PinReason::kLease);
      if (const StoredRef* copy = device_copies_.Find(n); copy != nullptr) {
        b.device = PinnedCopy(*copy, PinReason::kLease);
        device_copies_.Touch(n);
      }
      blocks.push_back(std::move(b));
    }
    index = &m.index;
  }
  const size_t matched = blocks.size();

  // 2. Bytes for the blocks the device lacks: host copies as they are,
  // SSD-only ones read back (verified; a corrupt one ends the prefix).
  size_t usable = blocks.size();
  const bool needs_lower = std::any_of(blocks.begin(), blocks.end(), [](const TieredBlock& b) {
    return b.device == nullptr && b.host == nullptr;
  });
  if (needs_lower) usable = tiers_->ReadBack(index, blocks, TierManager::ReadFor::kDevice);
  blocks.resize(usable);

  // 3. The device writes, outside the lock (each verifies the bytes against
  // the block's checksum before they reach the device).
  std::vector<bool> written(blocks.size(), false);
  size_t placed = blocks.size();
  absl::Status write_error;
  for (size_t i = 0; i < blocks.size(); ++i) {
    TieredBlock& b = blocks[i];
    if (b.device != nullptr) continue;
    absl::StatusOr<StoredRef> copy = WriteDevice(b.key, *b.host);
    if (!copy.ok()) {
      write_error = copy.status();
      placed = i;
      break;
    }
    b.device = PinnedCopy(*std::move(copy), PinReason::kLease);
    written[i] = true;
  }
  blocks.resize(placed);

  // 4. Install the new copies on blocks that did not change meanwhile, and
  // lease the placed prefix.
  WriteLock lock(this);
  if (!write_error.ok() && !absl::IsResourceExhausted(write_error)) ++tier_.device_write_failures;
  for (size_t i = 0; i < blocks.size(); ++i) {
    const TieredBlock& b = blocks[i];
    if (!written[i]) {
      ++tier_.device_hits;
      continue;
    }
    const BlockSeal& seal = b.device->seal();
    ++tier_.device_placements;
    tier_.device_placed_bytes += seal.size;
    // Still the bytes the copy was made from, in whichever tier.
    IndexNode* node = moves[i].RefindSealed(models_);
    if (node == nullptr || device_copies_.Find(node) != nullptr) {
      continue;  // gone or changed, or placed by another placement meanwhile
    }
    device_copies_.Put(node, b.device.ref());
    ++tier_.device_blocks;
    tier_.device_payload_bytes += seal.size;
    tiers_->LogMove(*node, node->in_host() ? "host" : "ssd", "gpu", "place", seal.size);
  }
  out.matched_tokens = blocks.size() * bt;
  out.unplaced_tokens = (matched - blocks.size()) * bt;
  out.copied_blocks = static_cast<uint32_t>(std::count(written.begin(), written.end(), true));
  if (blocks.empty()) return out;
  if (models_.OfIndex(index) == nullptr) {
    return absl::AbortedError(
        absl::StrCat("model \"", model.model_id, "\" was unregistered during the placement"));
  }
  out.blocks.reserve(blocks.size());
  for (const TieredBlock& b : blocks) {
    out.blocks.push_back({.index = b.depth,
                          .key = b.key,
                          .checksum = b.device->seal().checksum,
                          .slot = device_->Slot(*b.device)});
  }
  auto lease = CreateLeaseLocked(model, index, std::vector<Token>(tokens.begin(), tokens.end()),
                                 out.matched_tokens, std::move(blocks), lease_ttl);
  if (!lease.ok()) return lease.status();
  std::tie(out.lease_id, out.lease_expires) = *lease;
  return out;
}

}  // namespace kvcache
