// Cache: the host-memory KV cache shared by every worker of the daemon.
//
// It owns the model registry, one PrefixIndex and one host eviction policy
// per (namespace, model), the SlabPool that holds block payloads, the lower
// levels' policies and the leases.
// The values its methods take and return are in cache_types.h.
// Operations:
//   RegisterModel  a model id and its KV layout (idempotent for equal layouts)
//   Lookup         the longest cached prefix of a token sequence, optionally
//                  leased (pinned against capacity eviction until released
//                  or expired)
//   BeginAppend    an AppendSession that receives a sequence's KV and stores
//                  its whole new blocks atomically on Commit()
//   PrepareFetch   references to the payloads of a prefix (or a lease) that
//                  stay valid however long the caller streams them
//   EvictPrefix / EvictModel   explicit removal
//   UnregisterModel  a model's blocks, leases and registration
//   ReportAttention  per-token attention a worker observed, folded into each
//                  token's decayed activity (and sampled for calibration)
//   UpdatePolicy   a model's compression mode, weights and target mass
//
// The cache's components work on it from outside, through CacheAccess
// (cache_access.h), the one door to its lock and indexes: CacheInspector
// (the operator's view), CheckpointSource (what a checkpoint captures, and
// what a restart puts back),
// Compactor (compression, pool compaction and calibration passes) and
// TierManager (the moves between levels: the migrator, read-back and
// promotion, prefetch, GPU placement, their I/O threads and the move log;
// owned by the cache, reached by tiers()).
//
// Capacity is the pool's hard limit. When an append needs memory the cache
// evicts the coldest evictable block of all the models (CapacityArbiter: the
// coldest of each model's policy's own victim): leaves of their tree that
// nothing but the index references (not leased, not being fetched, not the
// prefix of an append in flight). When nothing is evictable the append
// fails with RESOURCE_EXHAUSTED and what was stored stays as it was.
//
// Tiers (docs/tiers.md). With levels below host memory (Tiers, in order:
// the SSD, later a remote store), host memory is the top level and blocks
// move down instead of leaving: the migrator (TierManager) and an append
// that finds the pool full demote the host block the host policy picks
// (written to level 0 outside the lock, the host copy dropped once written;
// a block already below is dropped without a write), admitted by a
// frequency gate and a write-rate budget; a level past its watermark
// demotes to the next the same way. Eviction happens only in the deepest
// level a block reaches (each level's own policy ranks the blocks whose top
// copy it holds; leaves only) or for a block not admitted. A lookup matches
// blocks at any level (BlockInfo::tier says where); a fetch reads lower
// blocks back from their top copy, verified (a copy that fails its checksum
// is dropped, never served: the fetch ends before it), and promotes them
// when the host has room.
//
// The GPU tier (a DeviceTier, optional) sits above host memory and is
// inclusive: a device copy is placed on demand (TierManager::PlaceOnDevice)
// next to a host or lower copy with the same seal, so dropping it (its own
// LRU order, past its high watermark or for room) never writes or loses
// anything. A
// device copy is dropped whenever its block's bytes change (compaction, an
// append that makes a lossy block exact) or the block leaves the cache; a
// lease taken by PlaceOnDevice keeps its copies alive until it ends.
//
// Every copy of a block's bytes from one place or form to another
// (compaction, compression, demotion, promotion, placement) is a BlockMove
// (block_move.h): claimed under the lock, copied outside it, committed only
// if the block did not change meanwhile.
//
// Thread-safety: every method is thread-safe. One reader-writer lock guards
// the metadata (registry, indexes, policies, leases); it is never held while
// payload bytes are copied or hashed, nor during I/O. Hits share it: a
// Lookup without a lease and the matching half of a fetch only read the
// index and pin copies (atomic counts), and apply their blocks' touches to
// their model's policy in that model's turn, or leave them in a TouchBuffer
// that the next exclusive section applies before anything else
// (touch_buffer.h), so hits of any models proceed side by side and hits of
// different models never wait for each other's touches.
// Appends share it too: beginning one, and committing one that adds only
// new blocks, take their model's own lock (ModelState::index_lock) beside
// it, shared to read the model's index and exclusively to add to it; a
// commit's new blocks enter the policy with their first touch, which goes
// through the TouchBuffer as a hit's does (IndexNode::in_policy). So
// appends of different models store side by side. Every other operation
// (leases, evictions, moves, restores, an append with pins or lossy
// blocks to make exact), and a hit or commit that meets an expired block
// or a full touch buffer, takes the lock exclusively (WriteLock).
#ifndef KVCACHE_SERVER_CORE_CACHE_H_
#define KVCACHE_SERVER_CORE_CACHE_H_

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/btree_map.h"
#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/functional/function_ref.h"
#include "absl/random/random.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "server/common/clock.h"
#include "server/common/mutex.h"
#include "server/common/shared_mutex.h"
#include "server/core/block.h"
#include "server/core/block_hasher.h"
#include "server/core/block_image.h"
#include "server/core/cache_inspection.h"
#include "server/core/cache_stats.h"
#include "server/core/cache_types.h"
#include "server/core/capacity_arbiter.h"
#include "server/core/claim_table.h"
#include "server/core/device_copies.h"
#include "server/core/device_tier.h"
#include "server/core/eviction_policy.h"
#include "server/core/importance_policy.h"
#include "server/core/layout.h"
#include "server/core/lease_table.h"
#include "server/core/model_registry.h"
#include "server/core/prefix_index.h"
#include "server/core/slab_pool.h"
#include "server/core/tier_manager.h"
#include "server/core/tier_workers.h"
#include "server/core/tiered_block.h"
#include "server/core/touch_buffer.h"
#include "server/importance/calibration.h"

namespace kvcache {

class AppendSession;

class Cache {
 public:
  // A level below host memory: its store, and the policy that ranks the
  // blocks whose top copy it holds (null: LRU).
  struct LowerLevel {
    std::shared_ptr<Tier> tier;
    std::unique_ptr<EvictionPolicy> policy;
  };
  // REQUIRES: pool, policy non-null; clock outlives the cache; `lower` (at
  // most kMaxLowerLevels, each with a tier) are the levels below host
  // memory, fastest first (empty: one level). `device` (may be null) is the
  // GPU tier above it.
  Cache(const CacheOptions& options, std::unique_ptr<SlabPool> pool,
        std::unique_ptr<EvictionPolicy> policy, Clock* clock, std::vector<LowerLevel> lower,
        std::shared_ptr<DeviceTier> device = nullptr);
  // One level below host memory at most: `lower` (may be null), ranked by
  // `lower_policy` (null: LRU).
  Cache(const CacheOptions& options, std::unique_ptr<SlabPool> pool,
        std::unique_ptr<EvictionPolicy> policy, Clock* clock, std::shared_ptr<Tier> lower = nullptr,
        std::unique_ptr<EvictionPolicy> lower_policy = nullptr,
        std::shared_ptr<DeviceTier> device = nullptr);
  ~Cache();
  Cache(const Cache&) = delete;
  Cache& operator=(const Cache&) = delete;

  // INVALID_ARGUMENT for a bad id or layout (block_tokens 0 means the
  // default); ALREADY_EXISTS when the id is registered with another layout;
  // RESOURCE_EXHAUSTED past max_models or when a block could never fit the tier.
  absl::StatusOr<RegisterResult> RegisterModel(const ModelKey& model, ModelLayout layout);

  // The longest cached prefix of `tokens`. Unless `accept_lossy`, it ends
  // before the first block stored lossy (withheld_tokens says how many cached
  // tokens that left out), and so does a lease it takes.
  // RESOURCE_EXHAUSTED when a lease would pass max_leases or max_lease_tokens.
  absl::StatusOr<LookupResult> Lookup(const ModelKey& model, std::span<const Token> tokens,
                                      const LeaseRequest& lease = {}, bool accept_lossy = false);
  // False when the lease is unknown (expired or released already), and
  // false (the lease kept) when `may_release` refuses the lease's model: a
  // caller may release only its own namespaces' leases.
  bool ReleaseLease(
      uint64_t lease_id,
      absl::FunctionRef<bool(const ModelKey&)> may_release = [](const ModelKey&) { return true; });

  // Starts an append of the KV of tokens[start_token:]'s whole blocks.
  // NOT_FOUND: unknown model. INVALID_ARGUMENT: too many tokens, start_token
  // not block-aligned or past the end, checksum count not the block count,
  // no checksums for an append of whole blocks when
  // options.require_block_checksums (then nothing is claimed or changed).
  // FAILED_PRECONDITION: start_token beyond the cached prefix.
  absl::StatusOr<std::unique_ptr<AppendSession>> BeginAppend(const ModelKey& model,
                                                             std::vector<Token> tokens,
                                                             uint64_t start_token,
                                                             const AppendHints& hints,
                                                             std::vector<uint64_t> block_checksums);

  // The blocks to fetch: the longest cached prefix of query.tokens (which
  // may be empty), or when query.lease_id is set the blocks of that live
  // lease of `model` (query.tokens are then not read). Unless
  // query.accept_lossy, they end before the first block stored lossy. At most
  // query.max_blocks blocks when not 0 (blocks past it are not read back).
  // Blocks read back from a level below host memory into the heap stop at
  // options.max_fetch_heap_bytes: the plan may then be shorter than the
  // cached prefix (a caller fetches the rest with a later call).
  // NOT_FOUND for an unknown model, or a lease unknown or expired;
  // INVALID_ARGUMENT for a lease of another model or too many tokens.
  absl::StatusOr<FetchPlan> PrepareFetch(const ModelKey& model, const FetchQuery& query);

  // PrepareFetch for a caller that must not wait on the disk (a gRPC reactor): the blocks are
  // matched (and pinned) before this returns, and when some must be read
  // back from the lower tier the reads run on the cache's fetch-read
  // threads (tiers.fetch_read_threads) and `done` runs there once they are
  // in. Otherwise, and on any error, `done` runs on this thread before this
  // returns. When the read queue is full the reads run on this thread
  // (counted as `inline` in CacheStats::fetch_reads); when the cache shuts
  // down with the reads still queued, `done` gets UNAVAILABLE. The plan is
  // the one the synchronous call would have made; a block changed or
  // evicted while its read was queued is served as it was when matched
  // (the pins keep its copy).
  void PrepareFetchAsync(const ModelKey& model, const FetchQuery& query, FetchDone done);

  // INVALID_ARGUMENT unless tokens is a non-empty whole number of blocks.
  // Evicting what is not cached evicts nothing and is OK.
  absl::StatusOr<EvictResult> EvictPrefix(const ModelKey& model, std::span<const Token> tokens);
  absl::StatusOr<EvictResult> EvictModel(const ModelKey& model);
  // Removes `model`: its blocks (as EvictModel), its leases and its
  // registration, so the id may be registered again with any layout.
  // NOT_FOUND for an unknown model. Fetches already planned keep their own
  // references and finish; an append in flight fails at Commit (NOT_FOUND,
  // or ABORTED once the id is registered again with another layout).
  absl::StatusOr<UnregisterResult> UnregisterModel(const ModelKey& model);

  // NOT_FOUND for an unknown model.
  absl::StatusOr<ImportancePolicy> GetPolicy(const ModelKey& model) const;
  // Applies the fields set in `update`. INVALID_ARGUMENT (nothing changed)
  // when the result would not validate. Switching to off removes every
  // compressed block of the model (with the blocks below it), cuts leases
  // before their first compressed block, revokes lossy blocks of fetches in
  // flight (FetchPlan::MaySendLossy) and voids compaction passes under way,
  // so from then on the model serves only lossless KV.
  absl::StatusOr<PolicyChange> UpdatePolicy(const ModelKey& model, const PolicyUpdate& update);

  // Folds per-token attention mass into the activity of the cached tokens of
  // `tokens` (or of the lease's blocks when lease_id != 0). `attention` holds
  // num_layers (>= 1) rows of one value per token (of tokens, or of the
  // lease's matched tokens), averaged over rows. INVALID_ARGUMENT for a wrong
  // count or a negative / non-finite value; NOT_FOUND for an unknown model or
  // lease. Nothing changes on error.
  absl::StatusOr<ReportResult> ReportAttention(const ModelKey& model, std::span<const Token> tokens,
                                               uint64_t lease_id, std::span<const float> attention,
                                               uint32_t num_layers);

  // The levels and the moves between them (tier_manager.h): the migrator
  // (Migrate, NeedsMigration), prefetch (Prefetch, StartPrefetch), GPU
  // placement (PlaceOnDevice), the migration log (DrainMoves) and the
  // levels themselves (lower_tier, device_tier).
  TierManager& tiers() const { return *tiers_; }

  CacheStats GetStats() const;

 private:
  friend class AppendSession;
  // The door of the cache's components (CacheInspector, CheckpointSource,
  // Compactor, TierManager): cache_access.h says what they may do through it.
  friend class CacheAccess;

  static TieredBlock TakeBlock(const IndexNode& n, PinReason why) {
    return TieredBlock::Of(n, why);
  }

  // Holds mu_ exclusively for its scope, having first applied the touches
  // readers left in touches_ (ApplyTouchesLocked). Every exclusive section
  // of the cache begins with one, so no block leaves the index, and no
  // eviction order is read, with a touch of it still pending.
  class ABSL_SCOPED_LOCKABLE WriteLock {
   public:
    explicit WriteLock(const Cache* cache) ABSL_EXCLUSIVE_LOCK_FUNCTION(cache->mu_);
    ~WriteLock() ABSL_UNLOCK_FUNCTION();
    WriteLock(const WriteLock&) = delete;
    WriteLock& operator=(const WriteLock&) = delete;

   private:
    const Cache* const cache_;
  };
  // Applies the touches hits recorded under the shared lock, in order.
  void ApplyTouchesLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // TouchLocked for touches_ (TouchBuffer::Use) to call with mu_ held
  // shared and the node's model's turn held (ModelState::touch_turn); a
  // lower-only node's touch also takes lower_touches_, since the lower
  // levels' policies are every model's. The analysis cannot express why
  // that may change the policies and the nodes' recency (guarded by mu_)
  // with mu_ shared: one reader at a time holds a model's turn, every other
  // reader leaves that model's policy and nodes' recency alone, and a
  // writer, who does not, holds mu_ exclusively and so never runs beside it.
  void ApplyTouchShared(IndexNode* node, absl::Time at) const ABSL_SHARED_LOCKS_REQUIRED(mu_);
  // An append's commit with mu_ shared (and its model's index_lock held
  // exclusively): touches `path`, from the first block to the new leaf, as
  // a hit does (TouchBuffer::Use: applied now or recorded); the first touch
  // of each block it added inserts that block into the policy (TouchLocked).
  void TouchCommittedPath(const ModelState& state, std::span<IndexNode* const> path, absl::Time at)
      ABSL_SHARED_LOCKS_REQUIRED(mu_);

  absl::StatusOr<ModelState*> FindModelLocked(const ModelKey& model) const
      ABSL_SHARED_LOCKS_REQUIRED(mu_);
  absl::Status CheckTokenCount(size_t n) const;
  // The lookup hashes of `tokens` for `model`'s block size: the lock is held
  // only to read the block size, not while hashing. NOT_FOUND for an unknown
  // model.
  absl::StatusOr<BlockHashes> HashBlocks(const ModelKey& model, std::span<const Token> tokens) const
      ABSL_LOCKS_EXCLUDED(mu_);
  // The cached path of `tokens`, with expired blocks removed (their host
  // copies moved to `dropped`, for the caller to release after the lock),
  // touched leaf-first. `hashes` are for `tokens` (hashed again if the
  // model's block size changed since).
  void MatchLocked(ModelState& state, std::span<const Token> tokens, const BlockHashes& hashes,
                   std::vector<IndexNode*>* path, std::vector<BlockRef>* dropped)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The first block of `path` expired at `now` (prefetching each block's
  // host copy on the way: callers read the seals next); end() when none.
  static std::vector<IndexNode*>::iterator FirstExpired(std::vector<IndexNode*>& path,
                                                        absl::Time now);
  // MatchLocked for a reader holding the lock shared: the cached path of
  // `tokens`, its touches handed to touches_ (applied at once, or
  // recorded for later: TouchBuffer::Use). False, with `path` empty, when a block on it
  // has expired (only a writer removes it) or the path is longer than a
  // stripe: the caller then matches again under WriteLock.
  bool MatchSharedLocked(const ModelState& state, std::span<const Token> tokens,
                         const BlockHashes& hashes, std::vector<IndexNode*>* path) const
      ABSL_SHARED_LOCKS_REQUIRED(mu_);
  // A validated append, hashed, for OpenAppendLocked.
  struct AppendRequest {
    ModelKey model;
    std::vector<Token> tokens;
    uint64_t start_block = 0;
    AppendHints hints;  // protected ranges merged
    std::vector<uint64_t> block_checksums;
    std::vector<uint64_t> chain;  // chain key of every whole block
    BlockHashes hashes;           // lookup hash of every whole block
  };
  // BeginAppend's session for `request` of `m`, whose cached `path` the
  // caller matched under this hold of the lock (shared or exclusive): pins
  // the path and claims the new blocks no other append in flight claimed.
  absl::StatusOr<std::unique_ptr<AppendSession>> OpenAppendLocked(
      const ModelState& m, AppendRequest request, const std::vector<IndexNode*>& path)
      ABSL_SHARED_LOCKS_REQUIRED(mu_);
  // Cuts a lookup's matched `path` of `m` to the blocks a reader may get
  // (ReadableBlocks), counting the rest in result->withheld_tokens.
  static void WithholdLossy(const ModelState& m, bool accept_lossy, std::vector<IndexNode*>* path,
                            LookupResult* result);
  // A lookup's answer for its matched `path` of `state` (cut by
  // WithholdLossy), counting its hits and misses among `num_tokens` tokens.
  void FillLookupResult(ModelState& state, size_t num_tokens, const std::vector<IndexNode*>& path,
                        LookupResult* result) const;
  // Removes the subtree at `node`; returns what it removed. Payload references
  // are moved to `dropped` so they are released after the lock.
  EvictResult RemoveSubtreeLocked(ModelState& state, IndexNode* node,
                                  std::vector<BlockRef>* dropped)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Forgets one node leaving its index and counts it in `result`; its host
  // copy goes to `dropped`.
  void DropNodeLocked(ModelState& state, IndexNode* n, std::vector<BlockRef>* dropped,
                      EvictResult* result) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Removes every block of `m` (references moved to `dropped`).
  EvictResult ClearModelLocked(ModelState& m, std::vector<BlockRef>* dropped)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Bookkeeping for a node leaving its index (policy, compaction, stats).
  void ForgetNodeLocked(ModelState& state, IndexNode* node) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void ExpireLeasesLocked(absl::Time now) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Index metadata and lease token copies: what max_metadata_bytes bounds.
  uint64_t MetadataBytesLocked() const ABSL_SHARED_LOCKS_REQUIRED(mu_) {
    return metadata_bytes_ + leases_.metadata_bytes();
  }
  // Undoes a compressed block's share of its model's compression stats.
  void ForgetCompressionLocked(ModelState& state, IndexNode* node)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Metadata the cache holds for `node` (node and tokens, importance state),
  // with kNodeAllocationOverhead for the allocator's bookkeeping (16) and the
  // node's slot in its index's hash map (16 bytes and a control byte, at a
  // load of 7/16 to 7/8).
  static uint64_t NodeMetadataBytes(const IndexNode& node);
  static constexpr uint64_t kNodeAllocationOverhead = 56;
  // A node's token state, once it has one, is an allocation of its own.
  static constexpr uint64_t kTokenStateAllocationOverhead = 16;
  // How many blocks of `path` a reader may get: all with `accept_lossy`,
  // else those before the first one stored lossy.
  static size_t ReadableBlocks(const std::vector<IndexNode*>& path, bool accept_lossy);
  // How many of `blocks` come before the first one stored lossy.
  static size_t ExactBlocks(std::span<const TieredBlock> blocks);
  // The head of a plan of `blocks` of model `m`: all with `accept_lossy`,
  // else up to the first lossy one (`blocks` is cut there); stamped with the
  // model's lossless epoch. FinishPlan fills in the blocks.
  static FetchPlan MakePlan(const ModelState& m, std::vector<TieredBlock>* blocks,
                            bool accept_lossy, size_t max_blocks = 0);
  // A fetch's blocks as matched under the lock, before any lower-tier read.
  struct MatchedFetch {
    FetchPlan plan;  // without its blocks yet
    const PrefixIndex* index = nullptr;
    std::vector<TieredBlock> blocks;
  };
  // The matching half of PrepareFetch: of the lease when query.lease_id is
  // set (MatchLeaseFetch), else of the tokens (MatchFetch).
  absl::StatusOr<MatchedFetch> MatchQuery(const ModelKey& model, const FetchQuery& query)
      ABSL_LOCKS_EXCLUDED(mu_);
  absl::StatusOr<MatchedFetch> MatchFetch(const ModelKey& model, std::span<const Token> tokens,
                                          bool accept_lossy, size_t max_blocks)
      ABSL_LOCKS_EXCLUDED(mu_);
  // A fetch's pins on the blocks of its matched `path` of `state`.
  static MatchedFetch PinFetch(const ModelState& state, const std::vector<IndexNode*>& path,
                               bool accept_lossy, size_t max_blocks);
  absl::StatusOr<MatchedFetch> MatchLeaseFetch(const ModelKey& model, uint64_t lease_id,
                                               bool accept_lossy, size_t max_blocks)
      ABSL_LOCKS_EXCLUDED(mu_);
  // Whether FinishPlan would read any of `blocks` back from the lower tier.
  static bool NeedsLowerReads(std::span<const TieredBlock> blocks);
  // PrepareFetch, reading lower-tier blocks back as `read_for` says.
  absl::StatusOr<FetchPlan> PlanFetch(const ModelKey& model, std::span<const Token> tokens,
                                      bool accept_lossy, size_t max_blocks,
                                      TierManager::ReadFor read_for) ABSL_LOCKS_EXCLUDED(mu_);
  // Puts `blocks` (of `index`) into `plan`, reading lower-only blocks back
  // first; the plan ends before a block that could not be read.
  FetchPlan FinishPlan(FetchPlan plan, const PrefixIndex* index, std::vector<TieredBlock> blocks,
                       TierManager::ReadFor read_for = TierManager::ReadFor::kFetch)
      ABSL_LOCKS_EXCLUDED(mu_);

  // The policy that ranks `node`: the host's while it has a host copy, else
  // that of the level of its top copy.
  EvictionPolicy* PolicyFor(const IndexNode& node) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return node.payload != nullptr ? node.index->host_policy()
                                   : lower_policies_[static_cast<size_t>(node.lower.top())].get();
  }
  // The coldest block in host memory that `evictable` accepts, of every
  // model (`ns` null) or of namespace `*ns`'s: the coldest of the models'
  // own victims (CapacityArbiter). nullptr when there is none.
  IndexNode* PickHostVictimLocked(absl::FunctionRef<bool(const IndexNode&)> evictable,
                                  const std::string* ns = nullptr)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // A use of `node` at `now`: its place in its policy, last access and use
  // count. Inserts it into the host policy when it is not tracked yet (a
  // block a commit added with mu_ shared, IndexNode::in_policy).
  void TouchLocked(IndexNode* node, absl::Time now) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Drops `node`'s host copy (into `dropped`), leaving its lower copies.
  // REQUIRES: node->payload set, and a lower copy.
  void DropHostCopyLocked(IndexNode* node, std::vector<BlockRef>* dropped)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Gives `node` a host copy again (a promotion or a restore).
  void SetHostCopyLocked(IndexNode* node, BlockRef payload) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Gives `node` `copy` at lower level `level`. REQUIRES: it has none there.
  void AddLowerCopyLocked(IndexNode* node, size_t level, StoredRef copy)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Drops `node`'s copy at `level`, if any. REQUIRES: the block keeps a copy
  // (host or another level).
  void DropLowerCopyLocked(IndexNode* node, size_t level) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Drops every lower copy of `node` (stale after its host copy changed).
  // REQUIRES: node->payload set.
  void DropLowerCopiesLocked(IndexNode* node) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Frees room in level `level`: its policy's coldest unpinned block whose
  // top copy is there loses that copy when a deeper level has the block too,
  // else (a leaf) leaves the cache. False when there is none.
  bool FreeLowerLevelLocked(size_t level, std::vector<BlockRef>* dropped)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Evicts one lower-only leaf that `also` accepts and nothing else
  // references, the deepest level's first (its blocks are the coldest);
  // `reason` goes to the move log. False when there is none.
  bool EvictLowerLeafLocked(absl::FunctionRef<bool(const IndexNode&)> also, const char* reason,
                            std::vector<BlockRef>* dropped) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Committed host bytes: the pool's allocated bytes less appends in flight.
  uint64_t CommittedHostBytes() const ABSL_LOCKS_EXCLUDED(mu_);
  // Evicts least recently used blocks until the committed blocks leave
  // append_staging_bytes of the pool free and metadata is within
  // max_metadata_bytes, or nothing more is evictable. Returns blocks evicted.
  uint64_t EnforceBudgetsLocked(std::vector<BlockRef>* dropped) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Keeps each namespace's metadata (its index nodes' and its leases') within
  // namespace_share of max_metadata_bytes by evicting that namespace's own
  // coldest blocks, never another's (cache_namespace_share.cc). Returns
  // blocks evicted.
  uint64_t EnforceNamespaceMetadataLocked(std::vector<BlockRef>* dropped)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Index metadata and lease token copies of namespace `ns`.
  uint64_t NamespaceMetadataBytesLocked(const std::string& ns) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Evicts one block of namespace `ns` nothing else references (a lower-only
  // leaf first, then a host leaf); false when there is none.
  bool EvictNamespaceBlockLocked(const std::string& ns, const char* reason,
                                 std::vector<BlockRef>* dropped) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Evicts one evictable block into `dropped` (a lower-tier block first);
  // false when there is none.
  bool EvictOneLocked(std::vector<BlockRef>* dropped) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Evicts the host policy's first evictable leaf (frees host memory); false
  // when there is none.
  bool EvictHostLeafLocked(std::vector<BlockRef>* dropped) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  // Allocates the memory of a block of `bytes` for an append (counted as
  // staged), evicting until it fits. RESOURCE_EXHAUSTED when nothing is
  // evictable.
  absl::StatusOr<StagingBlock> AllocatePayload(uint64_t bytes);
  // Keeps `ns` under max_namespace_bytes with `incoming` more bytes (an
  // append's staged bytes and its next block): evicts the namespace's own
  // coldest evictable leaves, or RESOURCE_EXHAUSTED when that is not enough.
  absl::Status MakeRoomInNamespace(const std::string& ns, uint64_t incoming);
  uint64_t NamespaceBytesLocked(const std::string& ns) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Keeps `node->metadata_bytes` and the cache's total in step with its
  // size. REQUIRES: mu_ exclusively, or shared with the node's model's
  // index_lock held exclusively.
  void RecountMetadataLocked(IndexNode* node) ABSL_SHARED_LOCKS_REQUIRED(mu_);
  // A block restored from `image` under `parent` (null: a first block) of
  // `state` (its lookup hash computed again, this cache's), with its copies,
  // hints, token state and reference history, counted and ranked. Null (and
  // nothing changed) on a lookup-hash collision. REQUIRES: image has a copy.
  IndexNode* AddRestoredLocked(ModelState& state, IndexNode* parent, BlockImage image)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Makes room in the pool: demotes a block when there is a lower tier,
  // else evicts a batch: one block, then more while the batch has room for
  // another block the size of the last one (at most kEvictionBatchBlocks
  // blocks, eviction_batch_bytes_ freed). False when nothing could be moved
  // or evicted.
  bool MakeRoomForSpace();
  // After a commit that stored blocks with the lock shared: evicts for the
  // budgets (EnforceBudgetsLocked) under the lock held exclusively when the
  // committed blocks or the metadata are past them; nothing otherwise.
  void EnforceBudgets() ABSL_LOCKS_EXCLUDED(mu_);
  // Evicting for space evicts in batches of at most kEvictionBatchBlocks
  // blocks and 1/kEvictionBatchFraction of the capacity, so that a full
  // cache takes its lock exclusively once per batch of appends; blocks too
  // large for a batch are evicted one by one, as needed.
  static constexpr size_t kEvictionBatchBlocks = 256;
  static constexpr uint64_t kEvictionBatchFraction = 256;

  // A lease of `blocks` (the first matched_tokens of `tokens`), expiring
  // after `ttl` (zero: the default). RESOURCE_EXHAUSTED past max_leases or
  // max_lease_tokens. REQUIRES: blocks non-empty.
  absl::StatusOr<std::pair<uint64_t, absl::Time>> CreateLeaseLocked(
      const ModelKey& model, const PrefixIndex* index, std::vector<Token> tokens,
      uint64_t matched_tokens, std::vector<TieredBlock> blocks, absl::Duration ttl)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // INVALID_ARGUMENT for a negative ttl or one past max_lease_ttl.
  absl::Status CheckLeaseTtl(absl::Duration ttl) const;
  // The GPU tier's copies (device_tiering.cc; placing them is the
  // TierManager's, device_placement.cc).
  using DeviceDrop = ::kvcache::DeviceDrop;
  // Drops `node`'s device copy, if any (counted and logged by `why`).
  void DropDeviceCopyLocked(IndexNode* node, DeviceDrop why) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Drops the least recently used device copy no lease or reader holds;
  // false when there is none.
  bool DropDeviceVictimLocked(DeviceDrop why) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const CacheOptions options_;
  const std::unique_ptr<SlabPool> pool_;
  const uint64_t pool_capacity_bytes_;
  const uint64_t eviction_batch_bytes_;  // pool_capacity_bytes_ / kEvictionBatchFraction
  Clock* const clock_;
  const std::vector<std::shared_ptr<Tier>> lower_;  // by level; empty: one level
  const std::vector<std::string> lower_names_;      // their kinds, for the move log
  const std::shared_ptr<DeviceTier> device_;        // null: no GPU tier

  mutable SharedMutex mu_;
  // Touches of hits made under the shared lock; not guarded by mu_ (see
  // touch_buffer.h for its rules).
  mutable TouchBuffer touches_;
  // The configured host policy: each model's is a sibling of it
  // (ModelState::host_policy); it tracks no block itself.
  const std::unique_ptr<EvictionPolicy> policy_;
  std::vector<EvictionPolicy*> host_policies_ ABSL_GUARDED_BY(mu_);  // every model's
  // The models' victims kept for the evictions of the exclusive section
  // that set it (EnforceBudgetsLocked, MakeRoomForSpace), else null; a
  // model whose tree changes is forgotten (RemoveSubtreeLocked).
  CapacityArbiter::Round* eviction_round_ ABSL_GUARDED_BY(mu_) = nullptr;
  // Touches of the lower levels' policies made by readers in their model's
  // turn (readers of different models apply side by side). After a turn.
  mutable Mutex lower_touches_;
  // By level: the blocks with no host copy whose top copy is there.
  std::vector<std::unique_ptr<EvictionPolicy>> lower_policies_ ABSL_GUARDED_BY(mu_);
  ModelRegistry models_ ABSL_GUARDED_BY(mu_);
  LeaseTable leases_ ABSL_GUARDED_BY(mu_);
  uint64_t capacity_evictions_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t quota_evictions_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t rejected_appends_ ABSL_GUARDED_BY(mu_) = 0;
  // Payload bytes in the indexes, and their nodes' metadata (leases':
  // leases_). Atomic: commits of different models add to them with mu_ shared.
  std::atomic<uint64_t> payload_bytes_{0};
  std::atomic<uint64_t> metadata_bytes_{0};
  // Pool memory held by appends in flight (uncommitted blocks). Atomic: an
  // append counts each block it stages without taking mu_.
  std::atomic<uint64_t> staged_bytes_{0};
  // Blocks an append in flight is writing: a second append of the same
  // tokens does not store another copy. Its own lock (claim_table.h).
  ClaimTable claims_;
  // Appends that met a cached block with other bytes. Atomic: a commit that
  // stores nothing holds mu_ shared.
  std::atomic<uint64_t> conflicting_appends_{0};
  uint64_t metadata_evictions_ ABSL_GUARDED_BY(mu_) = 0;  // for max_metadata_bytes
  // Of those, evicted to keep a namespace within its share of the budget.
  uint64_t namespace_metadata_evictions_ ABSL_GUARDED_BY(mu_) = 0;
  // Host payloads a compression or pool compaction move claimed
  // (block_move.h), so the other pass does not claim them too.
  absl::flat_hash_set<const BlockPayload*> moving_ ABSL_GUARDED_BY(mu_);
  CompactorCounters compactor_ ABSL_GUARDED_BY(mu_);
  TierCounters tier_ ABSL_GUARDED_BY(mu_);
  DeviceCopies device_copies_ ABSL_GUARDED_BY(mu_);  // the GPU tier's copies
  // The moves between levels, their I/O threads and the move log; made by the
  // constructor (it reaches the cache through CacheAccess).
  std::unique_ptr<TierManager> tiers_;
};

}  // namespace kvcache

// AppendSession, which BeginAppend hands out, needs Cache complete; it is
// declared after it so that including cache.h is enough to use either.
#include "server/core/append_session.h"  // IWYU pragma: export

#endif  // KVCACHE_SERVER_CORE_CACHE_H_
