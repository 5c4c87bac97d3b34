// Cache: making room in the host tier. Evictions for space (an append's
// allocation that found the pool full) and for the budgets (the append
// staging and the metadata budget, after a commit), both in batches so that
// a full cache takes its lock exclusively once per batch of appends
// (docs/architecture.md, "Eviction").
#include <algorithm>

#include "absl/strings/str_cat.h"
#include "server/core/cache.h"
#include "server/core/capacity_arbiter.h"

namespace kvcache {
namespace {

// Sets `slot` to a round of its own for its scope (Cache::eviction_round_).
class RoundScope {
 public:
  explicit RoundScope(CapacityArbiter::Round*& slot) : slot_(slot) { slot_ = &round_; }
  ~RoundScope() { slot_ = nullptr; }
  RoundScope(const RoundScope&) = delete;
  RoundScope& operator=(const RoundScope&) = delete;

 private:
  CapacityArbiter::Round*& slot_;
  CapacityArbiter::Round round_;
};

}  // namespace

bool Cache::EvictOneLocked(std::vector<BlockRef>* dropped) {
  // The lower levels' blocks are colder than the host's: they go first.
  if (EvictLowerLeafLocked([](const IndexNode&) { return true; }, "capacity", dropped)) {
    return true;
  }
  return EvictHostLeafLocked(dropped);
}

IndexNode* Cache::PickHostVictimLocked(absl::FunctionRef<bool(const IndexNode&)> evictable,
                                       const std::string* ns) {
  if (ns == nullptr) return CapacityArbiter::PickVictim(host_policies_, evictable);
  std::vector<EvictionPolicy*> of_namespace;
  for (const auto& [key, m] : models_) {
    if (key.ns == *ns) of_namespace.push_back(m->host_policy.get());
  }
  return CapacityArbiter::PickVictim(of_namespace, evictable);
}

bool Cache::EvictHostLeafLocked(std::vector<BlockRef>* dropped) {
  // Evictable: a leaf nothing pins (exact here: pins are only taken under
  // mu_).
  auto evictable = [](const IndexNode& n) { return n.is_leaf() && !n.payload->pins().pinned(); };
  IndexNode* victim = eviction_round_ != nullptr ? eviction_round_->Pick(host_policies_, evictable)
                                                 : PickHostVictimLocked(evictable);
  if (victim == nullptr) return false;
  tiers_->LogMove(*victim, "host", "none", "evicted", victim->payload->size());
  ModelState& state = *models_.OfIndex(victim->index);
  RemoveSubtreeLocked(state, victim, dropped);
  return true;
}

uint64_t Cache::EnforceBudgetsLocked(std::vector<BlockRef>* dropped) {
  const uint64_t staging = options_.append_staging_bytes;
  const uint64_t meta_cap = options_.max_metadata_bytes;
  if (staging == 0 && meta_cap == 0) return 0;
  const SlabPoolStats pool = pool_->GetStats();
  // Pool memory that committed blocks (and their leases and fetches) hold,
  // less what `dropped` frees once released.
  uint64_t freeing = 0;
  size_t counted = 0;
  auto committed = [&]() {
    mu_.AssertHeld();  // the lambda runs under the lock
    for (; counted < dropped->size(); ++counted) {
      const BlockRef& b = (*dropped)[counted];
      // Out of the index: freed on release unless something pins it.
      if (b != nullptr && !b->pins().pinned()) freeing += b->footprint();
    }
    const uint64_t held = pool.allocated_bytes - std::min(pool.allocated_bytes, freeing);
    return held - std::min(held, staged_bytes_.load(std::memory_order_relaxed));
  };
  const uint64_t target =
      pool.capacity_bytes - std::min(pool.capacity_bytes, staging == 0 ? 0 : staging);
  // Once past the target, on into a batch below it (so EnforceBudgets finds
  // the next commits within it and stays off the exclusive lock): while the
  // batch has room for another block the size of the last one evicted.
  const uint64_t batch_target = target - std::min(target, eviction_batch_bytes_);
  size_t batch = 0;
  uint64_t evicted = 0;
  // Each namespace's metadata within its share first, from its own blocks.
  if (meta_cap != 0 && options_.namespace_share < 1.0) {
    evicted += EnforceNamespaceMetadataLocked(dropped);
  }
  RoundScope round(eviction_round_);
  while (true) {
    // With a lower tier, room is made by demotion (Migrate, MakeRoomForSpace).
    bool for_space = false;
    if (staging != 0 && lower_.empty()) {
      const uint64_t held = committed();
      const uint64_t last =
          dropped->empty() || dropped->back() == nullptr ? 0 : dropped->back()->footprint();
      for_space = held > target ||
                  (batch > 0 && batch < kEvictionBatchBlocks && held >= batch_target + last);
    }
    const bool for_metadata = meta_cap != 0 && MetadataBytesLocked() > meta_cap;
    if (!(for_space || for_metadata) || !EvictOneLocked(dropped)) break;
    ++evicted;
    if (for_space) ++batch;
    ++(for_space ? capacity_evictions_ : metadata_evictions_);
  }
  return evicted;
}

bool Cache::MakeRoomForSpace() {
  if (!lower_.empty()) {
    uint64_t bytes = 0;
    bool refused = false;
    return tiers_->DemoteOne(&bytes, &refused, "append") != TierManager::DemoteOutcome::kNothing;
  }
  std::vector<BlockRef> dropped;  // freed after the lock is released
  WriteLock lock(this);
  ExpireLeasesLocked(clock_->Now());
  RoundScope round(eviction_round_);
  if (!EvictOneLocked(&dropped)) return false;
  ++capacity_evictions_;
  // Room for the appends that come next too, so that a full cache takes
  // its lock exclusively once per batch of appends, not once per block.
  uint64_t freed = 0, last = 0;
  for (size_t counted = 0, evicted = 1;; ++evicted) {
    for (; counted < dropped.size(); ++counted) {
      const BlockRef& b = dropped[counted];
      if (b == nullptr) continue;
      last = b->footprint();
      if (!b->pins().pinned()) freed += last;
    }
    if (evicted >= kEvictionBatchBlocks || freed + last > eviction_batch_bytes_) break;
    if (!EvictOneLocked(&dropped)) break;
    ++capacity_evictions_;
  }
  return true;
}

void Cache::EnforceBudgets() {
  const uint64_t staging = options_.append_staging_bytes;
  const uint64_t meta_cap = options_.max_metadata_bytes;
  bool over = false;
  if (staging != 0 && lower_.empty()) {
    over = CommittedHostBytes() > pool_capacity_bytes_ - std::min(pool_capacity_bytes_, staging);
  }
  if (!over && meta_cap != 0) {
    ReaderMutexLock lock(&mu_);  // for the leases' metadata
    over = MetadataBytesLocked() > meta_cap;
  }
  if (!over) return;
  std::vector<BlockRef> dropped;  // freed after the lock is released
  WriteLock lock(this);
  EnforceBudgetsLocked(&dropped);
}

absl::StatusOr<StagingBlock> Cache::AllocatePayload(uint64_t bytes) {
  while (true) {
    absl::StatusOr<Allocation> a = pool_->Allocate(bytes);
    if (a.ok()) {
      staged_bytes_.fetch_add(a->bytes, std::memory_order_relaxed);
      return StagingBlock(pool_.get(), *a, bytes);
    }
    if (!absl::IsResourceExhausted(a.status())) return a.status();
    if (!MakeRoomForSpace()) {
      const SlabPoolStats s = pool_->GetStats();
      WriteLock lock(this);
      ++rejected_appends_;
      return absl::ResourceExhaustedError(absl::StrCat(
          "host tier is full: capacity_bytes ", s.capacity_bytes, ", ", s.reserved_bytes,
          " reserved, and no block can be ", !lower_.empty() ? "demoted or " : "",
          "evicted (all leased, being fetched or appended to)"));
    }
  }
}

}  // namespace kvcache
