// CacheAccess: what the cache's components see of it. The operator's view
// (CacheInspector), checkpoint capture (CheckpointSource), the passes
// that rewrite blocks (Compactor) and the migrator (TierManager) work on
// the cache's indexes from outside Cache; this class is the one door they take,
// and Cache keeps its lock, registry, leases and tiers private to everyone
// else. It offers:
//
//   Walk      a model's blocks, parents first, in steps of kWalkStepNodes
//             blocks under the lock, giving way between steps
//   Locked    a hold of the cache's lock (exclusive, pending touches
//             applied first) and, through it, what a component may read
//             and change while it holds the lock: the registry and leases
//             to read, a bad copy to drop (DropCorrupt), a host copy to
//             rewrite by the move protocol (ClaimRewrite, EndRewrite,
//             ReplaceHostCopy), and a block's copies to move between levels
//             (ColdestHostBlock, AddLowerCopy, DropHostCopy, ...)
//   HashBlocks, lower_tier, pool, options, GiveWayAfterStep, ...
//             what a component needs of the cache without the lock
//
// A component copies what it needs under the lock and does its slow work
// (hashing, reading the lower tier, scoring) after it, as the cache does.
// Anything that holds a copy past the lock pins it first (a BlockMove claim,
// a PinnedBlock): the lock keeps nothing alive once it is let go.
//
// Thread-safety: a CacheAccess is a pointer and is safe to use from any
// thread; `Held` and `Locked` belong to the thread that holds the lock.
#ifndef KVCACHE_SERVER_CORE_CACHE_ACCESS_H_
#define KVCACHE_SERVER_CORE_CACHE_ACCESS_H_

#include <chrono>
#include <cstdint>
#include <optional>
#include <span>
#include <vector>

#include "absl/functional/function_ref.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "server/core/block.h"
#include "server/core/block_hasher.h"
#include "server/core/block_image.h"
#include "server/core/block_move.h"
#include "server/core/cache_stats.h"
#include "server/core/cache_types.h"
#include "server/core/device_copies.h"
#include "server/core/device_tier.h"
#include "server/core/layout.h"
#include "server/core/lease_table.h"
#include "server/core/model_registry.h"
#include "server/core/prefix_index.h"
#include "server/core/slab_pool.h"
#include "server/core/tier.h"

namespace kvcache {

class Cache;

class CacheAccess {
 public:
  // REQUIRES: `cache` outlives this and everything taken through it.
  explicit CacheAccess(Cache* cache) : cache_(cache) {}

  // The reads and the repair a component may make while it holds the
  // cache's lock (exclusively). Valid only for that hold: a Walk's visitor
  // gets one for its step; a Locked is one for its scope.
  class Held {
   public:
    Held(const Held&) = delete;
    Held& operator=(const Held&) = delete;

    // The registered model `model`; NOT_FOUND (naming it) when it is not.
    absl::StatusOr<const ModelState*> FindModel(const ModelKey& model) const;
    // The model whose index is `index`; null once it was removed.
    const ModelState* ModelOf(const PrefixIndex* index) const;
    // Calls `visit` for every registered model, in the registry's order.
    void ForEachModel(absl::FunctionRef<void(const ModelState& model)> visit) const;
    // The cache's clock, read now.
    absl::Time Now() const;
    // Whether the GPU tier holds a copy of `node`.
    bool OnDevice(const IndexNode& node) const;
    // Every live lease, with its id.
    void ForEachLease(absl::FunctionRef<void(uint64_t id, const Lease& lease)> visit) const;

    // The copy at `level` of the block `claimed` claimed (kLower: its copy
    // at claimed.lower_level()) failed a check (its checksum, its format):
    // removes it, provided the block is still the one claimed. A bad lower
    // copy of a block that has another copy too (host or another level)
    // goes alone (and only if it is still the copy claimed); any other bad
    // copy takes the block and every block below it out of the index. The
    // block counts in its model's corrupt_blocks whenever it is found.
    // Returns the blocks removed from the index (0: the lower copy alone),
    // or nullopt when nothing was dropped (gone, changed meanwhile).
    // References to dropped host copies go to `dropped`, to be released
    // after the lock. `reason` names the check in the move log; the caller
    // counts the failure (TierCounters) as its check's.
    std::optional<uint64_t> DropCorrupt(const BlockMove& claimed, BlockTier level,
                                        const char* reason, std::vector<BlockRef>* dropped) const;

    // --- What a restore (CheckpointSource) may change -----------------------
    // The registered model `model`, to change; null when it is not.
    ModelState* FindMutableModel(const ModelKey& model) const;
    // Inserts a block restored from `image` under `parent` (null: a first
    // block) of `model` (Cache::AddRestoredLocked); null, with nothing
    // changed, on a lookup-hash collision. REQUIRES: image has a copy, and
    // its lower copy (if any) is of level 0.
    IndexNode* AddRestored(ModelState& model, IndexNode* parent, BlockImage image) const;

    // --- What a rewriting component (Compactor) may change ----------------
    // Every registered model, to change its own state (its policy and
    // calibration sample, its counters of what a rewrite did).
    void ForEachMutableModel(absl::FunctionRef<void(ModelState& model)> visit) const;
    // The model of a block EndRewrite returned, to count what changed.
    ModelState& ModelOfBlock(const IndexNode& node) const;
    // A rewrite of a block's host copy (re-encoding, pool compaction)
    // follows the move protocol (block_move.h). ClaimRewrite claims `node`'s
    // copies and marks the block as being rewritten, so other rewriters
    // skip it (Rewriting) until EndRewrite. REQUIRES: node has a host copy
    // and !Rewriting(node).
    BlockMove ClaimRewrite(const IndexNode& node) const;
    bool Rewriting(const IndexNode& node) const;
    // Ends the rewrite `claimed` (every claim ends once, whatever became of
    // it); returns the block when it is still the one claimed, to commit
    // to, else null.
    IndexNode* EndRewrite(const BlockMove& claimed) const;
    // Gives `node` (EndRewrite's) `copy` as its host copy. A copy under the
    // old one's seal (the same bytes elsewhere) leaves the block's other
    // copies as they are; a copy under another seal (re-encoded) drops the
    // lower and device copies, which no longer match it, and the model's
    // and the cache's payload bytes change by the difference in size.
    void ReplaceHostCopy(IndexNode* node, BlockRef copy) const;
    // Recounts `node`'s metadata bytes after its token state changed.
    void RecountMetadata(IndexNode* node) const;
    // Evicts down to the staging and metadata budgets; returns the blocks
    // evicted (their host copies go to `dropped`).
    uint64_t EnforceBudgets(std::vector<BlockRef>* dropped) const;
    // The counters GetStats reports of the Compactor's passes.
    CompactorCounters& compactor_counters() const;

    // --- What the TierManager may change -----------------------------------
    // Ends the leases whose time is up (also the daemon's maintenance loop,
    // every second: a lease no call meets again still lets go of its pins).
    void ExpireLeases() const;
    // The host policy's coldest block that nothing pins; null when none.
    IndexNode* ColdestHostBlock() const;
    // The coldest block whose top copy is at lower level `level` (no host
    // copy) and that nothing pins there; null when none.
    IndexNode* ColdestLowerBlock(size_t level) const;
    // Drops `node`'s host copy (its reference to `dropped`); the block
    // stays, in the lower levels. REQUIRES: node has a lower copy.
    void DropHostCopy(IndexNode* node, std::vector<BlockRef>* dropped) const;
    // Gives `node` `copy` as its copy at lower level `level`. REQUIRES: it
    // has none there.
    void AddLowerCopy(IndexNode* node, size_t level, StoredRef copy) const;
    // Drops `node`'s copy at lower level `level`. REQUIRES: the block has
    // another copy (host or another level).
    void DropLowerCopy(IndexNode* node, size_t level) const;
    // Gives `node` `copy` (read back from a lower copy) as its host copy
    // again. REQUIRES: it has none.
    void SetHostCopy(IndexNode* node, BlockRef copy) const;
    // Takes `node` and every block below it out of the index; returns how
    // many blocks left.
    uint64_t RemoveBlock(IndexNode* node, std::vector<BlockRef>* dropped) const;
    // Evicts the host policy's coldest unpinned leaf; false when none.
    bool EvictHostLeaf(std::vector<BlockRef>* dropped) const;
    // Frees room in lower level `level`: its coldest unpinned block whose
    // top copy is there loses that copy when a deeper level has the block,
    // else (a leaf) leaves the cache; false when there is none.
    bool FreeLowerLevel(size_t level, std::vector<BlockRef>* dropped) const;
    // Counts an eviction made for room in CacheStats::capacity_evictions.
    void CountCapacityEviction() const;

    // --- What a GPU placement (TierManager::PlaceOnDevice) may do -----------
    // The exact (lossless) cached prefix of `tokens` under `model`, matched
    // as a lookup matches it (expired blocks removed into `expired`, the
    // path touched, the model's hit and miss tokens counted); NOT_FOUND for
    // an unknown model. `hashes` are HashBlocks' for `tokens`.
    struct ExactMatch {
      const PrefixIndex* index = nullptr;
      uint32_t block_tokens = 0;
      std::vector<IndexNode*> path;  // the exact blocks
      size_t withheld_blocks = 0;    // matched after them, stored lossy
    };
    absl::StatusOr<ExactMatch> MatchExact(const ModelKey& model, std::span<const Token> tokens,
                                          const BlockHashes& hashes,
                                          std::vector<BlockRef>* expired) const;
    // `node`'s device copy (used now: it moves to the front of the GPU
    // tier's order), or null.
    const StoredRef* UseDeviceCopy(IndexNode* node) const;
    // Gives `node` `copy` as its device copy (counted, logged); false, with
    // nothing changed, when it has one already.
    bool AddDeviceCopy(IndexNode* node, StoredRef copy) const;
    // Drops the least recently used device copy nothing holds, counted as
    // `why`; false when there is none.
    bool DropDeviceVictim(DeviceDrop why) const;
    // The block a placement's claim was made of, if it still holds the
    // bytes claimed (in whichever level); null otherwise.
    IndexNode* RefindSealed(const BlockMove& claimed) const;
    // A lease of `blocks` (the first matched_tokens of `tokens`) of `index`
    // (model `model`'s), expiring after `ttl` (zero: the default).
    // RESOURCE_EXHAUSTED past max_leases or max_lease_tokens. REQUIRES:
    // blocks non-empty.
    absl::StatusOr<std::pair<uint64_t, absl::Time>> CreateLease(
        const ModelKey& model, const PrefixIndex* index, std::vector<Token> tokens,
        uint64_t matched_tokens, std::vector<TieredBlock> blocks, absl::Duration ttl) const;
    // The block `claimed` claimed, when it is still that block; else null.
    IndexNode* Refind(const BlockMove& claimed) const;
    // The counters GetStats reports of the cache's tiers.
    TierCounters& tier_counters() const;

   protected:
    explicit Held(Cache* cache) : cache_(cache) {}

   private:
    friend class CacheAccess;
    Cache* const cache_;
  };

  // Holds the cache's lock exclusively for its scope, having applied the
  // touches readers left (as every exclusive section of the cache does).
  // Not annotated for the thread-safety analysis: a component names none of
  // the cache's guarded members, and each of Held's methods asserts the
  // lock is held by the calling thread (SharedMutex::AssertHeld checks it).
  class Locked : public Held {
   public:
    explicit Locked(const CacheAccess& access);
    ~Locked();
  };

  // Which part of a model's index a walk covers.
  struct WalkScope {
    std::optional<uint64_t> top_lookup_hash;  // this block and those below it; unset: all
    uint32_t max_depth = PrefixIndex::Cursor::kAllDepths;  // levels below the first
  };
  // Calls `visit` for the blocks of `model` in `scope`, parents first,
  // holding the lock for at most kWalkStepNodes of them at a time (visit
  // runs under it and must not add or remove blocks), and giving way
  // between steps (GiveWayAfterStep). A block added or removed meanwhile
  // may or may not be visited. Returns true when the walk reached its end;
  // false when `model` (or the scope's top block) was not there, or the
  // model was removed or registered anew during the walk.
  bool Walk(const ModelKey& model, const WalkScope& scope,
            absl::FunctionRef<void(const Held&, const ModelState&, const IndexNode&)> visit) const;
  static constexpr size_t kWalkStepNodes = 256;

  // After a bulk step that took the lock at `step_start` and has let it go:
  // waits as long as the step held it. A mutex hands nothing over, so a
  // bulk caller that took it again at once would barge ahead of the
  // requests woken to take it, step after step; waiting gives them the lock
  // and bounds bulk work to half of it.
  static void GiveWayAfterStep(std::chrono::steady_clock::time_point step_start);

  // The lookup and chain hashes of `tokens`' whole blocks under `model`'s
  // hasher; NOT_FOUND for an unknown model.
  absl::StatusOr<BlockHashes> HashBlocks(const ModelKey& model,
                                         std::span<const Token> tokens) const;
  // The levels below host memory, fastest first: how many, each one's
  // store (to read its copies back and write new ones) and its kind (for
  // the move log; valid as long as the cache).
  size_t lower_levels() const;
  Tier& lower_tier(size_t level) const;
  const char* lower_name(size_t level) const;
  // The host pool's allocated bytes less what appends in flight stage.
  uint64_t CommittedHostBytes() const;
  // The GPU tier (null: none).
  DeviceTier* device_tier() const;
  // INVALID_ARGUMENT for more tokens than max_tokens_per_request, and for a
  // negative lease ttl or one past max_lease_ttl.
  absl::Status CheckTokenCount(size_t n) const;
  absl::Status CheckLeaseTtl(absl::Duration ttl) const;
  // The cache's clock, read now.
  absl::Time Now() const;
  // A fetch of `tokens`' cached prefix whose lower-tier blocks are read
  // back into pool memory only (a prefetch's promotion).
  absl::StatusOr<FetchPlan> PlanPromotion(const ModelKey& model, std::span<const Token> tokens,
                                          bool accept_lossy) const;
  // The host pool's size classes, smallest first.
  std::vector<SlabClassStats> PoolClasses() const;
  // The host pool, to allocate a rewritten copy in (thread-safe itself).
  SlabPool& pool() const;
  const CacheOptions& options() const;
  Cache& cache() const { return *cache_; }

 private:
  Cache* const cache_;
};

}  // namespace kvcache

#endif  // KVCACHE_SERVER_CORE_CACHE_ACCESS_H_
