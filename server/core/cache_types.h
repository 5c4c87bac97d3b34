// The values Cache's methods take and return (cache.h): its options, an
// append's hints, what a lookup, fetch, append, eviction, placement,
// compaction or calibration answers. Plain values; a FetchPlan pins the
// blocks it holds.
#ifndef KVCACHE_SERVER_CORE_CACHE_TYPES_H_
#define KVCACHE_SERVER_CORE_CACHE_TYPES_H_

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "absl/functional/any_invocable.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "server/core/block.h"
#include "server/core/block_hasher.h"
#include "server/core/device_tier.h"
#include "server/core/importance_policy.h"
#include "server/core/layout.h"
#include "server/importance/calibration.h"

namespace kvcache {

// How blocks move between the host tier and a lower tier (no effect without one).
struct TierOptions {
  // The migrator demotes host blocks once the pool's committed bytes pass
  // high_watermark x capacity, down to low_watermark x capacity (and below
  // capacity - append_staging_bytes). 0 < low <= high <= 1.
  double host_high_watermark = 0.98;
  double host_low_watermark = 0.96;
  // A block is written to level 0 below host memory only once lookups,
  // fetches and appends used it this many times (1: every block; 2: seen
  // twice); a block not admitted is evicted. (A deeper level admits every
  // block demoted to it.)
  uint32_t lower_admit_min_references = 1;
  // Bytes per second the migrator may write to level 0 (a token bucket
  // holding one second); 0: no limit.
  uint64_t lower_write_bytes_per_second = 0;
  // A level below host memory with another level below it demotes its
  // coldest blocks (those with no copy above) to the next once its
  // allocated bytes pass lower_high_watermark x its capacity, down to
  // lower_low_watermark x its capacity. 0 < low <= high <= 1.
  double lower_high_watermark = 0.95;
  double lower_low_watermark = 0.90;
  // Most blocks one Migrate() call moves out of each level.
  uint32_t max_demotions_per_pass = 256;
  // A fetch that reads a lower block back keeps it in host memory when the
  // pool has room for it without evicting.
  bool promote_on_fetch = true;
  // Background promotions (Prefetch): threads, and jobs queued at most
  // (more are dropped).
  uint32_t prefetch_threads = 1;
  uint32_t prefetch_queue = 256;
  // The lower-tier reads of fetches (PrepareFetchAsync): threads, and fetches
  // queued at most (past it a fetch reads on its caller's thread).
  uint32_t fetch_read_threads = 2;
  uint32_t fetch_read_queue = 1024;
  // The GPU tier (no effect without one): Migrate drops the least recently
  // used device copies once its allocated bytes pass device_high_watermark x
  // capacity, down to device_low_watermark x capacity. 0 < low <= high <= 1.
  double device_high_watermark = 0.95;
  double device_low_watermark = 0.85;
};

// What Prefetch does: start promoting and return, or wait for it.
enum class PrefetchMode : uint8_t { kNone = 0, kBestEffort = 1, kWait = 2 };

struct CacheOptions {
  uint64_t max_tokens_per_request = uint64_t{1} << 20;
  absl::Duration default_lease_ttl = absl::Seconds(30);
  absl::Duration max_lease_ttl = absl::Minutes(10);
  uint32_t max_models = 1024;
  // Live leases at once, and the tokens they hold in all (a lease keeps a
  // copy of its matched tokens for attention reports): RESOURCE_EXHAUSTED past
  // either.
  uint32_t max_leases = 65536;
  uint64_t max_lease_tokens = uint64_t{64} << 20;
  // Pool memory kept free for appends in flight: a commit evicts until the
  // committed blocks leave this much of the pool free, so an append that is
  // rejected (bad checksum, broken stream) has evicted nothing as long as the
  // appends in flight fit here. Beyond it, an append evicts as its bytes
  // arrive. 0: every append evicts as its bytes arrive.
  uint64_t append_staging_bytes = 0;
  // Index metadata (nodes, tokens, importance state) and lease token copies
  // beyond this are freed by evicting least recently used blocks. 0: no limit.
  uint64_t max_metadata_bytes = 0;
  // hints.protected_ranges of one append, after merging overlaps.
  uint32_t max_protected_ranges = 1024;
  // Bytes one namespace (a tenant) may have cached, whichever tier holds them.
  // An append past it evicts that namespace's own coldest blocks first and is
  // RESOURCE_EXHAUSTED when none can go; it never evicts another namespace's
  // blocks to stay under it. Appends in flight count only their own staged
  // bytes, so concurrent appends of one namespace may pass it by what they
  // carry. 0: no limit.
  uint64_t max_namespace_bytes = 0;
  // The fraction of each budget all namespaces share (max_models, max_leases,
  // max_lease_tokens, max_metadata_bytes) one namespace may hold
  // (security.tenant_limits.max_share; namespace_share.h). Past it a lease or
  // a registration is RESOURCE_EXHAUSTED, and index metadata past it evicts
  // the namespace's own blocks, never another's. 1: no share (the budgets
  // alone). REQUIRES: 0 < namespace_share <= 1.
  double namespace_share = 1.0;
  // Heap bytes one fetch (or placement) may hold for blocks read back from
  // the lower tier that the pool had no room to promote: the plan ends
  // before the block that would pass it (at least one block is always
  // read). Bounds what a single request of a long, demoted prefix costs.
  uint64_t max_fetch_heap_bytes = uint64_t{256} << 20;
  // An append of whole blocks must carry their checksums (block_checksums),
  // so every block is verified against what the worker computed; one without
  // is INVALID_ARGUMENT at BeginAppend. The daemon sets it from
  // security.require_block_checksums (default true); false here keeps the
  // core's own tests and tools free to append without them.
  bool require_block_checksums = false;
  ImportanceOptions importance;
  TierOptions tiers;
  // The keys of a model's lookup hashes and chain keys (block_hasher.h),
  // called once when the model is registered. The daemon derives them from
  // its secret and the (namespace, model); unset: the unkeyed hasher, whose
  // keys anyone can compute (tests only).
  std::function<BlockHashKeys(const ModelKey&)> block_hash_keys;
  // Test seam: called by Compact() after it encoded a pass's blocks, outside
  // the lock, before it installs them (tests race policy changes there).
  std::function<void()> on_compaction_encoded;
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

// One block of a lookup, as a fetch with the same acceptance would send it.
enum class BlockTier : uint8_t { kHost = 0, kLower = 1 };

struct BlockInfo {
  uint32_t index = 0;
  BlockTier tier = BlockTier::kHost;  // where the block is now (host also when in both)
  // With kLower: the kind of the level of its top copy ("ssd"), valid as
  // long as the cache.
  const char* lower_kind = "";
  uint64_t key = 0;
  uint64_t checksum = 0;         // of the bytes a fetch sends (raw, or decoded when lossy)
  uint64_t bytes = 0;            // raw block bytes
  bool lossy = false;            // stored compressed: INT8 or pruned tokens
  uint64_t stored_bytes = 0;     // bytes of the stored (compressed) form
  uint64_t stored_checksum = 0;  // checksum of the stored form
};

struct LeaseRequest {
  bool acquire = false;
  absl::Duration ttl = absl::ZeroDuration();  // zero: the default
};

struct LookupResult {
  uint64_t matched_tokens = 0;
  // Cached tokens past matched_tokens that are stored lossy and were not
  // matched because the caller did not accept lossy KV.
  uint64_t withheld_tokens = 0;
  std::vector<BlockInfo> blocks;
  uint64_t lease_id = 0;
  absl::Time lease_expires = absl::InfinitePast();
};

// What a fetch streams: the payloads stay alive as long as the plan does.
// A plan holds lossy (compressed) blocks only when the caller accepted them;
// switching the model's compression off while the plan streams revokes that
// (MaySendLossy turns false), so a fetch in flight never sends lossy KV of a
// model that is off.
struct FetchPlan {
  ModelLayout layout;
  uint64_t matched_tokens = 0;
  uint64_t withheld_tokens = 0;     // lossy cached tokens not in the plan (not accepted)
  std::vector<PinnedBlock> blocks;  // pinned until sent (PinReason::kFetch)
  std::shared_ptr<const std::atomic<uint64_t>> lossless_epoch;  // the model's
  uint64_t epoch = 0;                                           // when planned

  bool MaySendLossy() const { return lossless_epoch != nullptr && lossless_epoch->load() == epoch; }
};

// What PrepareFetchAsync plans: the cached prefix of `tokens`, or the blocks
// of the live lease `lease_id` (then `tokens` is empty); lossy blocks only
// with `accept_lossy`; at most `max_blocks` blocks when not 0.
struct FetchQuery {
  std::span<const Token> tokens;
  uint64_t lease_id = 0;
  bool accept_lossy = false;
  size_t max_blocks = 0;
};

// Receives the plan of PrepareFetchAsync (or why there is none).
using FetchDone = absl::AnyInvocable<void(absl::StatusOr<FetchPlan>) &&>;

// One block PlaceOnDevice put (or found) in the GPU tier.
struct DeviceBlock {
  uint32_t index = 0;     // position of the block in the sequence
  uint64_t key = 0;       // the block's chain key
  uint64_t checksum = 0;  // XXH3-64 of its bytes (raw: device copies are exact KV only)
  DeviceSlot slot;        // where its bytes are (slot.bytes: the block's size)
};

// What PlaceOnDevice did: blocks[i] is block i of the sequence. The match is
// the same as a Lookup's without accept_lossy; `unplaced_tokens` are matched
// tokens past the placed ones that the GPU tier could not take (it was full
// of leased copies, or a copy failed): a caller fetches those the usual way.
struct DevicePlacement {
  uint64_t matched_tokens = 0;   // placed (a whole number of blocks)
  uint64_t unplaced_tokens = 0;  // matched, exact, but not placed
  uint64_t withheld_tokens = 0;  // cached lossy tokens after the exact ones
  std::vector<DeviceBlock> blocks;
  uint64_t lease_id = 0;  // 0 when nothing was placed
  absl::Time lease_expires = absl::InfinitePast();
  uint32_t copied_blocks = 0;  // of `blocks`, placed by this call (the rest were there)
};

struct AppendResult {
  uint32_t stored_blocks = 0;
  uint32_t deduplicated_blocks = 0;
  uint64_t stored_bytes = 0;
  uint64_t cached_tokens = 0;
  // Blocks that were cached with other bytes than this append carried (the
  // cached copy is kept; see docs/api.md) and the first of them (or -1).
  uint32_t conflicting_blocks = 0;
  int64_t first_conflicting_block = -1;
  // Blocks that were stored lossy and are exact again from this append's bytes.
  uint32_t restored_blocks = 0;
  // Blocks another append of the same tokens was storing; not stored twice.
  uint32_t pending_blocks = 0;
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
  std::optional<double> target_bytes;
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
  uint64_t bytes_saved = 0;       // pool memory freed
  uint64_t no_saving_blocks = 0;  // left raw: the compressed copy would free no memory
  uint64_t corrupt_blocks = 0;    // dropped: did not match their checksum
  uint64_t evicted_blocks = 0;    // evicted to keep the budgets
  uint64_t int8_tokens = 0;
  uint64_t pruned_tokens = 0;
  // Budget mode: entries (layer, KV head, token) per precision, and blocks over budget.
  uint64_t int8_entries = 0;
  uint64_t int4_entries = 0;
  uint64_t pruned_entries = 0;
  uint64_t budget_overruns = 0;
};

// Host pool compaction (server/core/pool_compaction.cc, docs/tiers.md).
struct PoolCompactionOptions {
  CompactionPlanOptions plan;
  // Test seam: called after a pass copied its blocks, outside the lock,
  // before it swaps them in (tests change blocks there).
  std::function<void()> on_copied;
};

struct PoolCompactionResult {
  uint64_t draining_spans = 0;     // spans the pool's plan drains
  uint64_t planned_blocks = 0;     // blocks found in them
  uint64_t moved_blocks = 0;       // copied, verified and swapped in
  uint64_t moved_bytes = 0;        // their payload bytes
  uint64_t changed_blocks = 0;     // not swapped: changed or removed during the copy
  uint64_t mismatched_blocks = 0;  // not swapped: the copy did not match the checksum
  bool out_of_targets = false;     // stopped: no free chunk outside the draining spans
};

struct MigrationResult {
  uint64_t demoted_blocks = 0;  // written to the lower tier, host copy dropped
  uint64_t demoted_bytes = 0;
  uint64_t clean_drops = 0;     // host copy dropped, the lower copy existed
  uint64_t evicted_blocks = 0;  // not admitted (or the lower tier refused): evicted
  uint64_t refused_blocks = 0;  // of those, refused by the admission gate or budget
  uint64_t device_drops = 0;    // GPU tier copies dropped (clean: the block stays below)
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

}  // namespace kvcache

#endif  // KVCACHE_SERVER_CORE_CACHE_TYPES_H_
