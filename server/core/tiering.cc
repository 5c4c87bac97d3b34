// The Cache's tier moves: demotion of host blocks to the lower tier, the
// lower tier's eviction, reading lower blocks back for a fetch, and
// promotion. See cache.h ("Tiers") and docs/tiers.md.
#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "server/core/block_move.h"
#include "server/core/cache.h"

namespace kvcache {
namespace {

// Evictions from the lower tier one write may cause before it gives up
// (its size class may need several).
constexpr int kMaxLowerEvictionsPerWrite = 32;

}  // namespace

void Cache::DropHostCopyLocked(IndexNode* node, std::vector<BlockRef>* dropped) {
  policy_->Release(node);
  payload_bytes_ -= node->payload->size();
  dropped->push_back(std::move(node->payload));
  lower_policy_->Adopt(node);
  ++tier_.lower_only_blocks;
}

void Cache::SetHostCopyLocked(IndexNode* node, BlockRef payload) {
  lower_policy_->Release(node);
  payload_bytes_ += payload->size();
  node->payload = std::move(payload);
  policy_->Adopt(node);
  --tier_.lower_only_blocks;
}

void Cache::DropLowerCopyLocked(IndexNode* node) {
  if (node->lower == nullptr) return;
  --tier_.lower_blocks;
  tier_.lower_payload_bytes -= node->lower->seal().size;
  node->lower.reset();
}

bool Cache::AdmitLowerLocked(const IndexNode& node) {
  const TierOptions& o = options_.tiers;
  if (node.references < o.lower_admit_min_references) return false;
  return lower_writes_.TryTake(node.payload->size(), clock_->Now());
}

bool Cache::EvictLowerOneLocked(std::vector<BlockRef>* dropped) {
  // A lower-only leaf that nothing pins (leases and reads in flight do).
  IndexNode* victim = lower_policy_->PickVictim(
      [](const IndexNode& n) { return n.is_leaf() && !n.lower->pins().pinned(); });
  if (victim == nullptr) return false;
  LogMoveLocked(*victim, "ssd", "none", "capacity", victim->lower->seal().size);
  RemoveSubtreeLocked(*models_.OfIndex(victim->index), victim, dropped);
  ++tier_.lower_evictions;
  return true;
}

absl::StatusOr<StoredRef> Cache::WriteLower(uint64_t key, const BlockPayload& payload) {
  for (int attempt = 0;; ++attempt) {
    absl::StatusOr<StoredRef> copy = lower_->Write(key, payload);
    if (copy.ok() || !absl::IsResourceExhausted(copy.status()) ||
        attempt == kMaxLowerEvictionsPerWrite) {
      return copy;
    }
    std::vector<BlockRef> dropped;  // freed after the lock
    WriteLock lock(this);
    if (!EvictLowerOneLocked(&dropped)) return copy;
  }
}

void Cache::LogMoveLocked(const IndexNode& node, const char* from, const char* to,
                          const char* reason, uint64_t bytes, absl::Duration took) {
  // One tier: nothing moves, nothing drains the log.
  if (lower_ == nullptr && device_ == nullptr) return;
  if (pending_moves_.size() >= kMaxPendingMoves) {
    pending_moves_.erase(pending_moves_.begin(),
                         pending_moves_.begin() + static_cast<ptrdiff_t>(kMaxPendingMoves / 2));
    tier_.moves_unlogged += kMaxPendingMoves / 2;
  }
  pending_moves_.push_back({.when = clock_->Now(),
                            .key = node.key,
                            .from = from,
                            .to = to,
                            .reason = reason,
                            .bytes = bytes,
                            .took = took});
}

std::vector<MoveRecord> Cache::DrainMoves() {
  std::vector<MoveRecord> out;
  WriteLock lock(this);
  out.swap(pending_moves_);
  return out;
}

Cache::DemoteOutcome Cache::DemoteOne(uint64_t* bytes, bool* refused, const char* reason) {
  *refused = false;
  BlockMove move;  // its claim keeps the victim from being picked (or compacted) twice
  {
    std::vector<BlockRef> dropped;  // freed after the lock
    WriteLock lock(this);
    ExpireLeasesLocked(clock_->Now());
    IndexNode* victim =
        policy_->PickVictim([](const IndexNode& n) { return !n.payload->pins().pinned(); });
    if (victim == nullptr) return DemoteOutcome::kNothing;
    if (victim->lower != nullptr) {  // clean: the lower tier has it already
      *bytes = victim->payload->size();
      LogMoveLocked(*victim, "host", "ssd", "clean", *bytes);
      DropHostCopyLocked(victim, &dropped);
      ++tier_.clean_drops;
      return DemoteOutcome::kCleanDrop;
    }
    if (!AdmitLowerLocked(*victim)) {
      *refused = true;
      ++tier_.admissions_refused;
      // Not worth an SSD write: evict it, or the host's coldest leaf when it
      // has children (they stay, below it).
      if (victim->is_leaf()) {
        LogMoveLocked(*victim, "host", "none", "not_admitted", victim->payload->size());
        RemoveSubtreeLocked(*models_.OfIndex(victim->index), victim, &dropped);
      } else if (!EvictHostLeafLocked(&dropped)) {
        return DemoteOutcome::kNothing;
      }
      ++tier_.not_admitted_evictions;
      ++capacity_evictions_;
      return DemoteOutcome::kEvicted;
    }
    move = BlockMove::Claim(*victim);
  }
  // The write, outside the lock.
  const BlockPayload& payload = *move.host();
  const absl::Time start = absl::Now();
  absl::StatusOr<StoredRef> copy = WriteLower(move.key(), payload);
  const absl::Duration took = absl::Now() - start;

  std::vector<BlockRef> dropped;
  WriteLock lock(this);
  IndexNode* node = move.Refind(models_);
  if (node == nullptr || node->lower != nullptr) return DemoteOutcome::kRaced;
  if (!copy.ok()) {
    ++tier_.lower_write_failures;
    // The lower tier cannot take it: evict it instead, if it is still a
    // leaf nothing but this move pins.
    if (node->is_leaf() && node->payload->pins().only(PinReason::kMove, 1)) {
      LogMoveLocked(*node, "host", "none", "write_failed", payload.size(), took);
      RemoveSubtreeLocked(*models_.OfIndex(move.index()), node, &dropped);
      ++tier_.not_admitted_evictions;
      ++capacity_evictions_;
      return DemoteOutcome::kEvicted;
    }
    return DemoteOutcome::kRaced;
  }
  node->lower = *std::move(copy);
  ++tier_.lower_blocks;
  tier_.lower_payload_bytes += payload.size();
  ++tier_.demotions;
  tier_.demoted_bytes += payload.size();
  *bytes = payload.size();
  LogMoveLocked(*node, "host", "ssd", reason, payload.size(), took);
  DropHostCopyLocked(node, &dropped);
  return DemoteOutcome::kDemoted;
}

uint64_t Cache::CommittedHostBytes() const {
  const uint64_t allocated = pool_->GetStats().allocated_bytes;
  return allocated - std::min(allocated, staged_bytes_.load(std::memory_order_relaxed));
}

bool Cache::NeedsMigration() const { return DeviceNeedsMigration() || HostNeedsMigration(); }

bool Cache::HostNeedsMigration() const {
  if (lower_ == nullptr) return false;
  const double capacity = static_cast<double>(pool_->GetStats().capacity_bytes);
  return static_cast<double>(CommittedHostBytes()) > options_.tiers.host_high_watermark * capacity;
}

MigrationResult Cache::Migrate() {
  MigrationResult result;
  if (DeviceNeedsMigration()) result.device_drops = MigrateDevice();
  if (!HostNeedsMigration()) {
    WriteLock lock(this);
    ++tier_.migrate_passes;
    return result;
  }
  const uint64_t capacity = pool_->GetStats().capacity_bytes;
  uint64_t target =
      static_cast<uint64_t>(options_.tiers.host_low_watermark * static_cast<double>(capacity));
  target = std::min(target, capacity - std::min(capacity, options_.append_staging_bytes));
  for (uint32_t i = 0; i < options_.tiers.max_demotions_per_pass && CommittedHostBytes() > target;
       ++i) {
    uint64_t bytes = 0;
    bool refused = false;
    const DemoteOutcome outcome = DemoteOne(&bytes, &refused, "pressure");
    if (outcome == DemoteOutcome::kNothing) break;
    switch (outcome) {
      case DemoteOutcome::kDemoted:
        ++result.demoted_blocks;
        result.demoted_bytes += bytes;
        break;
      case DemoteOutcome::kCleanDrop:
        ++result.clean_drops;
        break;
      case DemoteOutcome::kEvicted:
        ++result.evicted_blocks;
        if (refused) ++result.refused_blocks;
        break;
      default:
        break;
    }
  }
  WriteLock lock(this);
  ++tier_.migrate_passes;
  return result;
}

std::shared_ptr<WorkTicket> Cache::StartPrefetch(const ModelKey& model,
                                                 std::span<const Token> tokens, bool accept_lossy) {
  if (lower_ == nullptr) return nullptr;
  auto job = [this, model, tokens = std::vector<Token>(tokens.begin(), tokens.end()),
              accept_lossy] {
    // The plan is dropped at once: what matters is the promotion on the way.
    // Into pool memory only: a prefetch that cannot promote has nothing to
    // keep, so it reads nothing into the heap.
    (void)PlanFetch(model, tokens, accept_lossy, /*max_blocks=*/0, LoadFor::kPromotion);
  };
  return prefetcher_->Submit(std::move(job));
}

void Cache::CountLatePrefetch() { prefetcher_->CountLate(); }

bool Cache::Prefetch(const ModelKey& model, std::span<const Token> tokens, bool accept_lossy,
                     PrefetchMode mode, absl::Duration timeout) {
  if (lower_ == nullptr || mode == PrefetchMode::kNone) return true;
  std::shared_ptr<WorkTicket> ticket = StartPrefetch(model, tokens, accept_lossy);
  if (ticket == nullptr || mode == PrefetchMode::kBestEffort) return false;
  if (ticket->WaitFor(timeout == absl::ZeroDuration() ? absl::InfiniteDuration() : timeout)) {
    return true;
  }
  CountLatePrefetch();
  return false;
}

size_t Cache::LoadLowerBlocks(const PrefixIndex* index, std::vector<TieredBlock>& blocks,
                              LoadFor load_for) {
  // Read into pool memory (to promote) while the pool has room; else into
  // the heap, for this request only, up to max_fetch_heap_bytes (the plan
  // ends before the block that would pass it). A promotion may pass the high
  // watermark: the block was just asked for, and the migrator demotes colder
  // ones.
  const bool promote = options_.tiers.promote_on_fetch || load_for == LoadFor::kPromotion;
  std::vector<StoredRead> reads;
  std::vector<size_t> which;
  std::vector<bool> pooled;
  std::vector<BlockMove> moves;      // lower -> host, committed below
  std::vector<StagingBlock> staged;  // what each read lands in
  uint64_t heap_bytes = 0;
  size_t limit = blocks.size();  // blocks past it are not read
  for (size_t i = 0; i < limit; ++i) {
    TieredBlock& b = blocks[i];
    if (b.host != nullptr) continue;
    // A block a placement holds on the device needs no read-back to be
    // placed; a fetch serves host bytes, so it reads it all the same.
    if (load_for == LoadFor::kDevice && b.device != nullptr) continue;
    const uint64_t size = b.lower->seal().size;
    StagingBlock into;
    if (promote) {
      absl::StatusOr<Allocation> a = pool_->Allocate(size);
      if (a.ok()) into = StagingBlock(pool_.get(), *a, size);
    }
    if (into.empty()) {
      const bool over = heap_bytes + size > options_.max_fetch_heap_bytes && !reads.empty();
      if (load_for == LoadFor::kPromotion || over) {
        limit = i;
        break;
      }
      heap_bytes += size;
      into = StagingBlock::OnHeap(size);
      pooled.push_back(false);
    } else {
      pooled.push_back(true);
    }
    moves.push_back(BlockMove::Claim(index, b));
    reads.push_back({.copy = b.lower.get(), .out = into.data()});
    which.push_back(i);
    staged.push_back(std::move(into));
  }
  const absl::Time start = absl::Now();
  lower_->ReadBatch(std::span<StoredRead>(reads));
  const absl::Duration took = absl::Now() - start;

  size_t readable = limit;
  std::vector<BlockRef> dropped;  // freed after the lock
  WriteLock lock(this);
  if (limit < blocks.size() && load_for != LoadFor::kPromotion) ++tier_.heap_bounded_fetches;
  for (size_t k = 0; k < reads.size(); ++k) {
    TieredBlock& b = blocks[which[k]];
    IndexNode* node = moves[k].Refind(models_);
    const bool same = node != nullptr;
    if (!reads[k].status.ok()) {
      readable = std::min(readable, which[k]);
      if (absl::IsDataLoss(reads[k].status)) {
        // Never served: the block leaves the cache (with what hangs below it).
        ++tier_.checksum_failures;
        if (same) {
          LogMoveLocked(*node, "ssd", "none", "checksum", b.lower->seal().size, took);
          ModelState& m = *models_.OfIndex(index);
          ++m.corrupt_blocks;
          RemoveSubtreeLocked(m, node, &dropped);
        }
      }
      continue;
    }
    // Read and verified against the seal it is now born with.
    b.host =
        PinnedBlock(std::move(staged[k]).Seal(b.lower->key(), b.lower->seal()), b.lower.reason());
    ++tier_.lower_reads;
    tier_.lower_read_bytes += b.host->size();
    if (pooled[k] && same) {
      tier_.promoted_bytes += b.host->size();
      ++tier_.promotions;
      LogMoveLocked(*node, "ssd", "host", "fetch", b.host->size(), took);
      SetHostCopyLocked(node, b.host.ref());
    }
  }
  return readable;
}

}  // namespace kvcache
