// TierManager: the GPU tier's moves. Placing device copies of a prefix's
// blocks for same-host workers (host or a lower level -> GPU), the writes
// that drop copies for room, and the migrator's pass past the tier's
// watermark. See tier_manager.h, device_tier.h and docs/tiers.md ("The GPU
// tier").
#include <algorithm>
#include <tuple>
#include <utility>

#include "absl/strings/str_cat.h"
#include "server/common/status_macros.h"
#include "server/core/block_move.h"
#include "server/core/tier_manager.h"

namespace kvcache {
namespace {

// Device copies one write may drop for room before it gives up (a size
// class may need several).
constexpr int kMaxDeviceDropsPerWrite = 64;
// Device copies one Migrate() pass drops at most.
constexpr int kMaxDeviceDropsPerPass = 4096;

}  // namespace

absl::StatusOr<StoredRef> TierManager::WriteDevice(uint64_t key, const BlockPayload& payload) {
  DeviceTier& device = *access_.device_tier();
  for (int attempt = 0;; ++attempt) {
    absl::StatusOr<StoredRef> copy = device.Write(key, payload);
    if (copy.ok() || !absl::IsResourceExhausted(copy.status()) ||
        attempt == kMaxDeviceDropsPerWrite) {
      return copy;
    }
    CacheAccess::Locked locked(access_);
    if (!locked.DropDeviceVictim(DeviceDrop::kRoom)) return copy;
  }
}

bool TierManager::DeviceNeedsMigration() const {
  const DeviceTier* device = access_.device_tier();
  if (device == nullptr) return false;
  const TierStats s = device->GetStats();
  return static_cast<double>(s.allocated_bytes) >
         options_.device_high_watermark * static_cast<double>(s.capacity_bytes);
}

uint64_t TierManager::MigrateDevice() {
  DeviceTier& device = *access_.device_tier();
  const uint64_t capacity = device.GetStats().capacity_bytes;
  const auto target =
      static_cast<uint64_t>(options_.device_low_watermark * static_cast<double>(capacity));
  uint64_t dropped = 0;
  CacheAccess::Locked locked(access_);
  while (dropped < kMaxDeviceDropsPerPass && device.GetStats().allocated_bytes > target &&
         locked.DropDeviceVictim(DeviceDrop::kPressure)) {
    ++dropped;
  }
  return dropped;
}

absl::StatusOr<DevicePlacement> TierManager::PlaceOnDevice(const ModelKey& model,
                                                           std::span<const Token> tokens,
                                                           absl::Duration lease_ttl) {
  DeviceTier* device = access_.device_tier();
  if (device == nullptr) {
    return absl::FailedPreconditionError(
        "this kvcached has no GPU tier (gpu_tier.kind is off, or no device was usable at "
        "start-up); fetch the blocks instead");
  }
  KVCACHE_RETURN_IF_ERROR(access_.CheckTokenCount(tokens.size()));
  KVCACHE_RETURN_IF_ERROR(access_.CheckLeaseTtl(lease_ttl));
  absl::StatusOr<BlockHashes> hashes = access_.HashBlocks(model, tokens);
  if (!hashes.ok()) return hashes.status();

  // 1. The exact prefix, under the lock; blocks already on the device are
  // held from here on.
  DevicePlacement out;
  std::vector<TieredBlock> blocks;
  std::vector<BlockMove> moves;  // host or a lower level -> GPU, one per block
  const PrefixIndex* index;
  uint32_t bt;
  std::vector<BlockRef> expired;  // released after the lock
  {
    CacheAccess::Locked locked(access_);
    absl::StatusOr<CacheAccess::Held::ExactMatch> match =
        locked.MatchExact(model, tokens, *hashes, &expired);
    if (!match.ok()) return match.status();
    bt = match->block_tokens;
    index = match->index;
    out.withheld_tokens = match->withheld_blocks * bt;
    blocks.reserve(match->path.size());
    moves.reserve(match->path.size());
    for (IndexNode* n : match->path) {
      moves.push_back(BlockMove::Claim(*n));
      TieredBlock b = TieredBlock::Of(*n, PinReason::kLease);
      if (const StoredRef* copy = locked.UseDeviceCopy(n); copy != nullptr) {
        b.device = PinnedCopy(*copy, PinReason::kLease);
      }
      blocks.push_back(std::move(b));
    }
  }
  const size_t matched = blocks.size();

  // 2. Bytes for the blocks the device lacks: host copies as they are,
  // lower-only ones read back (verified; a corrupt one ends the prefix).
  size_t usable = blocks.size();
  const bool needs_lower = std::any_of(blocks.begin(), blocks.end(), [](const TieredBlock& b) {
    return b.device == nullptr && b.host == nullptr;
  });
  if (needs_lower) usable = ReadBack(index, blocks, ReadFor::kDevice);
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
  CacheAccess::Locked locked(access_);
  TierCounters& counters = locked.tier_counters();
  if (!write_error.ok() && !absl::IsResourceExhausted(write_error)) {
    ++counters.device_write_failures;
  }
  for (size_t i = 0; i < blocks.size(); ++i) {
    const TieredBlock& b = blocks[i];
    if (!written[i]) {
      ++counters.device_hits;
      continue;
    }
    ++counters.device_placements;
    counters.device_placed_bytes += b.device->seal().size;
    // Still the bytes the copy was made from, in whichever level; else
    // gone or changed (or placed by another placement meanwhile).
    if (IndexNode* node = locked.RefindSealed(moves[i]); node != nullptr) {
      locked.AddDeviceCopy(node, b.device.ref());
    }
  }
  out.matched_tokens = blocks.size() * bt;
  out.unplaced_tokens = (matched - blocks.size()) * bt;
  out.copied_blocks = static_cast<uint32_t>(std::count(written.begin(), written.end(), true));
  if (blocks.empty()) return out;
  if (locked.ModelOf(index) == nullptr) {
    return absl::AbortedError(
        absl::StrCat("model \"", model.model_id, "\" was unregistered during the placement"));
  }
  out.blocks.reserve(blocks.size());
  for (const TieredBlock& b : blocks) {
    out.blocks.push_back({.index = b.depth,
                          .key = b.key,
                          .checksum = b.device->seal().checksum,
                          .slot = device->Slot(*b.device)});
  }
  auto lease = locked.CreateLease(model, index, std::vector<Token>(tokens.begin(), tokens.end()),
                                  out.matched_tokens, std::move(blocks), lease_ttl);
  if (!lease.ok()) return lease.status();
  std::tie(out.lease_id, out.lease_expires) = *lease;
  return out;
}

}  // namespace kvcache
