// Cache: the host-memory KV cache shared by every worker of the daemon.
//
// It owns the model registry, one PrefixIndex per (namespace, model), the
// SlabPool that holds block payloads, the eviction policy and the leases.
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
//   Compact        one pass of importance-aware compression: cold blocks (or
//                  the coldest, under memory pressure) of models in quantize
//                  or prune mode are re-encoded (server/importance)
//   Calibrate      refits each model's weights on its sampled reports
//
// Capacity is the pool's hard limit. When an append needs memory the cache
// evicts blocks the policy picks among evictable ones: leaves of their tree
// that nothing but the index references (not leased, not being fetched, not
// the prefix of an append in flight). When nothing is evictable the append
// fails with RESOURCE_EXHAUSTED and what was stored stays as it was.
//
// Thread-safety: every method is thread-safe. One mutex guards the metadata
// (registry, indexes, policy, leases); it is never held while payload bytes
// are copied or hashed, nor during I/O.
#ifndef KVCACHE_SERVER_CORE_CACHE_H_
#define KVCACHE_SERVER_CORE_CACHE_H_

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/btree_map.h"
#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/random/random.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "server/core/block.h"
#include "server/core/cache_stats.h"
#include "server/core/clock.h"
#include "server/core/eviction_policy.h"
#include "server/core/importance_policy.h"
#include "server/core/layout.h"
#include "server/core/mutex.h"
#include "server/core/prefix_index.h"
#include "server/core/slab_pool.h"
#include "server/importance/calibration.h"

namespace kvcache {

struct CacheOptions {
  uint64_t max_tokens_per_request = uint64_t{1} << 20;
  absl::Duration default_lease_ttl = absl::Seconds(30);
  absl::Duration max_lease_ttl = absl::Minutes(10);
  uint32_t max_models = 1024;
  ImportanceOptions importance;
};

enum class WorkloadKind : uint8_t { kUnspecified = 0, kChat = 1, kCode = 2, kDocument = 3 };

// Token positions [begin, end) of a sequence.
struct TokenRange {
  uint64_t begin = 0;
  uint64_t end = 0;
};

struct AppendHints {
  WorkloadKind workload = WorkloadKind::kUnspecified;
  int32_t priority = 0;
  absl::Duration ttl = absl::ZeroDuration();  // zero: no expiry
  // Tokens never quantized or pruned (e.g. a system prompt's instructions).
  std::vector<TokenRange> protected_ranges;
};

struct RegisterResult {
  bool created = false;
  ModelLayout layout;
};

struct BlockInfo {
  uint32_t index = 0;
  uint64_t key = 0;
  uint64_t checksum = 0;
  uint64_t bytes = 0;
};

struct LeaseRequest {
  bool acquire = false;
  absl::Duration ttl = absl::ZeroDuration();  // zero: the default
};

struct LookupResult {
  uint64_t matched_tokens = 0;
  std::vector<BlockInfo> blocks;
  uint64_t lease_id = 0;
  absl::Time lease_expires = absl::InfinitePast();
};

// What a fetch streams: the payloads stay alive as long as the plan does.
struct FetchPlan {
  ModelLayout layout;
  uint64_t matched_tokens = 0;
  std::vector<BlockRef> blocks;
};

struct AppendResult {
  uint32_t stored_blocks = 0;
  uint32_t deduplicated_blocks = 0;
  uint64_t stored_bytes = 0;
  uint64_t cached_tokens = 0;
};

struct EvictResult {
  uint64_t evicted_blocks = 0;
  uint64_t evicted_bytes = 0;
};

struct UnregisterResult {
  uint64_t evicted_blocks = 0;
  uint64_t evicted_bytes = 0;
  uint64_t released_leases = 0;
};

struct PolicyUpdate {
  std::optional<CompressionMode> mode;
  std::optional<importance::Weights> weights;
  std::optional<double> target_mass;
};

struct PolicyChange {
  ImportancePolicy policy;  // in effect after the update
  CompressionMode previous_mode = CompressionMode::kOff;
  uint64_t dropped_blocks = 0;  // compressed blocks removed by switching to off
};

struct ReportResult {
  uint64_t matched_tokens = 0;  // cached tokens the report covered
  uint64_t updated_tokens = 0;  // tokens whose activity changed
};

struct CompactionResult {
  bool under_pressure = false;
  uint64_t candidates = 0;
  uint64_t compressed_blocks = 0;
  uint64_t bytes_saved = 0;
  uint64_t int8_tokens = 0;
  uint64_t pruned_tokens = 0;
};

struct CalibrationOutcome {
  ModelKey model;
  size_t samples = 0;
  bool applied = false;
  importance::Weights before;
  importance::Weights fitted;
  importance::Weights after;
  double correlation_before = 0;
  double correlation_after = 0;
};

class AppendSession;

class Cache {
 public:
  // REQUIRES: pool, policy non-null; clock outlives the cache.
  Cache(const CacheOptions& options, std::unique_ptr<SlabPool> pool,
        std::unique_ptr<EvictionPolicy> policy, Clock* clock);
  ~Cache();
  Cache(const Cache&) = delete;
  Cache& operator=(const Cache&) = delete;

  // INVALID_ARGUMENT for a bad id or layout (block_tokens 0 means the
  // default); ALREADY_EXISTS when the id is registered with another layout;
  // RESOURCE_EXHAUSTED past max_models or when a block could never fit the tier.
  absl::StatusOr<RegisterResult> RegisterModel(const ModelKey& model, ModelLayout layout);
  // NOT_FOUND for an unknown model.
  absl::StatusOr<ModelLayout> GetLayout(const ModelKey& model) const;
  std::vector<std::pair<ModelKey, ModelLayout>> ListModels() const;

  absl::StatusOr<LookupResult> Lookup(const ModelKey& model, std::span<const Token> tokens,
                                      const LeaseRequest& lease = {});
  // False when the lease is unknown (expired or released already).
  bool ReleaseLease(uint64_t lease_id);

  // Starts an append of the KV of tokens[start_token:]'s whole blocks.
  // NOT_FOUND: unknown model. INVALID_ARGUMENT: too many tokens, start_token
  // not block-aligned or past the end, checksum count not the block count.
  // FAILED_PRECONDITION: start_token beyond the cached prefix.
  absl::StatusOr<std::unique_ptr<AppendSession>> BeginAppend(const ModelKey& model,
                                                             std::vector<Token> tokens,
                                                             uint64_t start_token,
                                                             const AppendHints& hints,
                                                             std::vector<uint64_t> block_checksums);

  // The longest cached prefix of `tokens` (which may be empty).
  absl::StatusOr<FetchPlan> PrepareFetch(const ModelKey& model, std::span<const Token> tokens);
  // Exactly the blocks of a live lease of `model`. NOT_FOUND when the lease
  // is unknown or expired, INVALID_ARGUMENT when it belongs to another model.
  absl::StatusOr<FetchPlan> PrepareFetchLease(const ModelKey& model, uint64_t lease_id);

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

  // Drops expired leases; the daemon calls it periodically.
  void ExpireLeases();

  // NOT_FOUND for an unknown model.
  absl::StatusOr<ImportancePolicy> GetPolicy(const ModelKey& model) const;
  // Applies the fields set in `update`. INVALID_ARGUMENT (nothing changed)
  // when the result would not validate. Switching to off removes every
  // compressed block of the model (with the blocks below it), so from then
  // on fetches return only lossless KV.
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

  // One compaction pass; the daemon calls it periodically. Encodes outside
  // the lock; a block evicted or fetched meanwhile is simply left alone.
  CompactionResult Compact();

  // Refits every model's weights that has enough samples (calibration.h),
  // moving them at most calibration_max_step, and starts a new sample.
  std::vector<CalibrationOutcome> Calibrate();

  CacheStats GetStats() const;

 private:
  friend class AppendSession;

  struct ModelState {
    ModelState(const ModelKey& k, const ModelLayout& l, const ImportancePolicy& p,
               size_t calibration_samples)
        : key(k), layout(l), index(l.block_tokens), policy(p), calibrator(calibration_samples) {}
    ModelKey key;
    ModelLayout layout;
    PrefixIndex index;
    uint64_t bytes = 0;
    uint64_t hit_tokens = 0;
    uint64_t miss_tokens = 0;
    uint64_t appended_blocks = 0;
    uint64_t deduplicated_blocks = 0;
    uint64_t evicted_blocks = 0;
    ImportancePolicy policy;
    importance::Calibrator calibrator;
    uint64_t compressed_blocks = 0;  // blocks now in the compressed format
    uint64_t int8_tokens = 0;        // tokens now stored as INT8
    uint64_t pruned_tokens = 0;      // tokens now dropped
    uint64_t bytes_saved = 0;        // raw bytes minus compressed bytes, now
    uint64_t attention_reports = 0;
    uint64_t calibrations = 0;
  };
  struct Lease {
    ModelKey model;
    uint64_t matched_tokens = 0;
    std::vector<Token> tokens;  // the matched tokens, for attention reports
    std::vector<BlockRef> blocks;
    absl::Time expires;
  };

  absl::StatusOr<ModelState*> FindModelLocked(const ModelKey& model) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::Status CheckTokenCount(size_t n) const;
  // The cached path of `tokens`, with expired blocks removed, touched leaf-first.
  void MatchLocked(ModelState& state, std::span<const Token> tokens, std::vector<IndexNode*>* path)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Removes the subtree at `node`; returns what it removed. Payload references
  // are moved to `dropped` so they are released after the lock.
  EvictResult RemoveSubtreeLocked(ModelState& state, IndexNode* node,
                                  std::vector<BlockRef>* dropped)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Removes every block of `m` (references moved to `dropped`).
  EvictResult ClearModelLocked(ModelState& m, std::vector<BlockRef>* dropped)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Bookkeeping for a node leaving its index (policy, compaction, stats).
  void ForgetNodeLocked(ModelState& state, IndexNode* node) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void ExpireLeasesLocked(absl::Time now) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Removes a lease from both maps, moving it to `out`.
  void EraseLeaseLocked(absl::flat_hash_map<uint64_t, Lease>::iterator it, Lease* out)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  // Allocates a payload of `bytes`, evicting until it fits.
  absl::StatusOr<BlockRef> AllocatePayload(uint64_t bytes);
  // Evicts one block; false when nothing is evictable.
  bool EvictOneForSpace();

  const CacheOptions options_;
  const std::unique_ptr<SlabPool> pool_;
  Clock* const clock_;

  mutable Mutex mu_;
  std::unique_ptr<EvictionPolicy> policy_ ABSL_GUARDED_BY(mu_);
  absl::btree_map<ModelKey, std::unique_ptr<ModelState>> models_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<const PrefixIndex*, ModelState*> by_index_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<uint64_t, Lease> leases_ ABSL_GUARDED_BY(mu_);
  // Lease ids by expiry, so expiring costs only what expires.
  absl::btree_multimap<absl::Time, uint64_t> lease_expiry_ ABSL_GUARDED_BY(mu_);
  absl::BitGen lease_ids_ ABSL_GUARDED_BY(mu_);
  uint64_t capacity_evictions_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t rejected_appends_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t payload_bytes_ ABSL_GUARDED_BY(mu_) = 0;  // payload bytes in the indexes
  // Nodes a compaction pass is encoding outside the lock; a node removed
  // meanwhile leaves the set, so the pass knows not to touch it.
  absl::flat_hash_set<const IndexNode*> compacting_ ABSL_GUARDED_BY(mu_);
  ScoreHistogram score_histogram_ ABSL_GUARDED_BY(mu_);
  uint64_t compaction_passes_ ABSL_GUARDED_BY(mu_) = 0;
};

// Receives one append's KV bytes and stores its new blocks on Commit().
// Bytes are copied and hashed outside the cache lock. Destroying a session
// without a successful Commit() stores nothing and frees what it allocated.
// Not thread-safe: one stream feeds one session.
class AppendSession {
 public:
  ~AppendSession();

  // Copies the next bytes of the KV stream. INVALID_ARGUMENT past the expected
  // total; DATA_LOSS when a completed block does not match its checksum;
  // RESOURCE_EXHAUSTED when no room can be made. After an error the session
  // is dead and Commit() returns that error.
  absl::Status Write(std::span<const std::byte> bytes);

  // INVALID_ARGUMENT when fewer bytes than expected arrived; ABORTED when the
  // prefix the append extends was explicitly evicted meanwhile.
  absl::StatusOr<AppendResult> Commit();

  uint64_t expected_bytes() const { return expected_bytes_; }
  uint64_t received_bytes() const { return received_bytes_; }

 private:
  friend class Cache;
  AppendSession(Cache* cache, ModelKey model, ModelLayout layout, std::vector<Token> tokens,
                uint64_t start_block, uint64_t num_blocks, AppendHints hints,
                std::vector<uint64_t> checksums, std::vector<BlockRef> pinned,
                std::vector<bool> cached, std::vector<uint32_t> novelty_layers);
  absl::Status Fail(absl::Status status);
  // The pinned flags of block `index` of the sequence; empty when none.
  std::vector<uint8_t> PinnedFlags(uint64_t index) const;

  Cache* const cache_;
  const ModelKey model_;
  const ModelLayout layout_;
  const std::vector<Token> tokens_;
  const uint64_t start_block_;
  const uint64_t num_blocks_;
  const AppendHints hints_;
  const std::vector<uint64_t> checksums_;
  const uint64_t block_bytes_;
  const uint64_t expected_bytes_;
  // References to the blocks that were cached when the session began (the
  // prefix and blocks to deduplicate): they cannot be evicted for space.
  std::vector<BlockRef> pinned_;
  std::vector<bool> cached_;                    // per new block: cached at Begin, skip its bytes
  std::vector<BlockRef> new_blocks_;            // per new block: the payload written, or null
  const std::vector<uint32_t> novelty_layers_;  // empty: novelty not computed here
  std::vector<std::vector<float>> novelty_;     // per new block, once complete
  struct HashState;
  std::unique_ptr<HashState> hash_;  // running checksum of the current block
  uint64_t received_bytes_ = 0;
  absl::Status status_;
};

}  // namespace kvcache

#endif  // KVCACHE_SERVER_CORE_CACHE_H_
