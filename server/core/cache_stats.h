// CacheStats: a point-in-time snapshot of what the cache holds and did.
// The Admin RPC reads its fields; the metrics module has it report its
// counters through a CounterVisitor (counter_visitor.h). Neither reaches into
// the cache's internals, and the core links no metrics library.
//
// Each group of counters reports itself: its VisitCounters (cache_stats.cc,
// in the order of the fields) names the metric family, help, type and labels
// of each field it exposes. Adding a counter is the field, the code that
// counts it, and one Visit line there; a per-model or cache-wide counter also
// needs its copy in Cache::GetStats (docs/metrics.md, "Adding a counter").
// Visiting reads only the snapshot: Cache::GetStats copies it under the
// lock, the visitor runs after, on the caller's thread.
#ifndef KVCACHE_SERVER_CORE_CACHE_STATS_H_
#define KVCACHE_SERVER_CORE_CACHE_STATS_H_

#include <array>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "absl/time/time.h"
#include "server/common/counter_visitor.h"
#include "server/core/importance_policy.h"
#include "server/core/layout.h"
#include "server/core/lower_copies.h"
#include "server/core/slab_pool.h"
#include "server/core/tier.h"
#include "server/core/tier_workers.h"

namespace kvcache {

struct ModelStats {
  ModelKey model;
  ModelLayout layout;
  uint64_t blocks = 0;
  uint64_t tokens = 0;
  uint64_t bytes = 0;
  uint64_t hit_tokens = 0;   // counted by Lookup
  uint64_t miss_tokens = 0;  // whole-block tokens Lookup did not find
  uint64_t appended_blocks = 0;
  uint64_t deduplicated_blocks = 0;
  uint64_t evicted_blocks = 0;  // by capacity, explicit eviction or expiry
  // Importance-aware retention (docs/importance.md).
  ImportancePolicy policy;  // mode, weights, target mass in effect
  uint64_t compressed_blocks = 0;
  uint64_t full_tokens = 0;  // tokens at the model's dtype
  uint64_t int8_tokens = 0;
  uint64_t pruned_tokens = 0;
  // Budget mode (format version 2): (layer, KV head, token) entries per
  // precision now stored, and blocks that did not fit target_bytes.
  uint64_t int8_entries = 0;
  uint64_t int4_entries = 0;
  uint64_t pruned_entries = 0;
  uint64_t budget_overruns = 0;
  uint64_t bytes_saved = 0;  // pool memory compressed blocks freed
  uint64_t attention_reports = 0;
  uint64_t calibrations = 0;
  // Integrity (docs/api.md, "Conflicting appends").
  uint64_t conflicting_blocks = 0;  // appended with other bytes than the cached copy
  uint64_t restored_blocks = 0;     // lossy blocks made exact again by an append
  uint64_t corrupt_blocks = 0;      // found not matching their checksum and dropped

  // The per-model families, labelled namespace and model.
  void VisitCounters(CounterVisitor& visitor) const;
};

// Distribution of the importance scores compaction computed: bucket i
// counts scores in [i / 10, (i + 1) / 10), the last bucket everything >= 1.
struct ScoreHistogram {
  static constexpr int kBuckets = 11;
  uint64_t counts[kBuckets] = {};
  double sum = 0;
  uint64_t total = 0;
  void Add(float score) {
    if (!(score >= 0)) score = 0;  // also NaN
    const int b = score >= 1 ? kBuckets - 1 : static_cast<int>(score * 10);
    counts[b] += 1;
    sum += score;
    ++total;
  }
};

// One move of a block between tiers, for the migration log (docs/tiers.md).
// `to` is "none" for an eviction or a dropped corrupt copy.
struct MoveRecord {
  absl::Time when;
  uint64_t key = 0;  // the block's chain key
  const char* from = "";
  const char* to = "";
  const char* reason =
      "";  // pressure, append, clean, not_admitted, write_failed, capacity, fetch, checksum
  uint64_t bytes = 0;
  absl::Duration took = absl::ZeroDuration();  // the write or read, when there was one
};

// What the cache did across its tiers (docs/tiers.md).
// One level below host memory (lower_copies.h): its blocks, the moves into
// and out of it, its reads and failures. `above` in the comments is the level
// a demotion into this one comes from: host memory for level 0, level i-1 for
// level i.
struct LowerLevelCounters {
  uint64_t blocks = 0;         // blocks with a copy in this level
  uint64_t payload_bytes = 0;  // their sizes
  uint64_t only_blocks = 0;    // of those, whose top copy this is (none above, none in host)
  uint64_t demotions = 0;      // writes into this level from the one above
  uint64_t demoted_bytes = 0;
  uint64_t clean_drops = 0;  // copies above dropped with no write (this level had the block)
  uint64_t promotions = 0;   // this level -> host on a fetch
  uint64_t promoted_bytes = 0;
  uint64_t reads = 0;  // blocks a fetch read back from this level
  uint64_t read_bytes = 0;
  uint64_t evictions = 0;               // blocks evicted from this level for room
  uint64_t admissions_refused = 0;      // by the frequency gate or the write budget
  uint64_t not_admitted_evictions = 0;  // blocks above evicted instead of demoted here
  uint64_t write_failures = 0;          // writes this level refused (full, I/O)
  uint64_t checksum_failures = 0;       // copies here that failed verification: dropped

  // This level's moves, evictions, reads and failures; `tier` is its kind
  // ("ssd"), `above` the kind of the level its demotions come from ("host").
  void VisitCounters(std::string_view tier, std::string_view above, CounterVisitor& visitor) const;
};

struct TierCounters {
  std::array<LowerLevelCounters, kMaxLowerLevels> lower;  // by level, level 0 first
  // Fetches whose plan ended early because the blocks read back into the heap
  // (the pool was full) reached max_fetch_heap_bytes.
  uint64_t heap_bounded_fetches = 0;
  uint64_t migrate_passes = 0;
  uint64_t moves_unlogged = 0;  // move records dropped: the log was not drained in time
  // The GPU tier (device_tier.h): blocks with a device copy and their sizes,
  // copies placed (host or a lower level -> gpu), blocks a placement found
  // there already, copies dropped (for room, past the watermark, or because
  // the block's bytes changed or it left the cache) and writes it refused.
  uint64_t device_blocks = 0;
  uint64_t device_payload_bytes = 0;
  uint64_t device_placements = 0;
  uint64_t device_placed_bytes = 0;
  uint64_t device_hits = 0;
  uint64_t device_drops_room = 0;
  uint64_t device_drops_pressure = 0;
  uint64_t device_drops_invalidated = 0;
  uint64_t device_write_failures = 0;

  // Blocks with no host copy (in some lower level only).
  uint64_t lower_only_blocks() const {
    uint64_t n = 0;
    for (const LowerLevelCounters& l : lower) n += l.only_blocks;
    return n;
  }
  // The GPU tier's placements, drops and failures. Only when there is one.
  void VisitDeviceCounters(CounterVisitor& visitor) const;
};

// Checkpoints (server/checkpoint): not the cache's own numbers; the daemon
// fills them in next to the cache's for the metrics.
struct CheckpointCounters {
  bool enabled = false;
  uint64_t ok = 0;                       // checkpoints committed
  uint64_t failed = 0;                   // checkpoint runs that failed
  double last_success_unix_seconds = 0;  // 0: none yet
  double started_unix_seconds = 0;       // when checkpointing started (the daemon did)
  double last_duration_seconds = 0;
  uint64_t last_bytes = 0;
  bool in_progress = false;
  std::string restore_state;  // "off", "reattaching", "restoring", "done", "failed", "stopped"
  uint64_t restored_blocks = 0;
  uint64_t restore_skipped_blocks = 0;
  uint64_t restore_failed_checkpoints = 0;  // unreadable or corrupt at start-up
  uint64_t reattached_copies = 0;
  uint64_t reattach_failures = 0;

  // The checkpoint families; none unless `enabled`. `now` dates the age.
  void VisitCounters(absl::Time now, CounterVisitor& visitor) const;
};

// Host pool compaction (Compactor::CompactPool) since start.
struct PoolCompactionCounters {
  uint64_t passes = 0;
  uint64_t moved_blocks = 0;
  uint64_t moved_bytes = 0;
  uint64_t changed_blocks = 0;     // copied, not swapped: changed during the copy
  uint64_t mismatched_blocks = 0;  // copied, not swapped: the copy failed its checksum

  void VisitCounters(CounterVisitor& visitor) const;
};

// What the Compactor's passes counted since start, kept by the cache under
// its lock (CacheAccess::Held::compactor_counters) for GetStats.
struct CompactorCounters {
  ScoreHistogram scores;  // of every token (entry) a compression pass scored
  uint64_t passes = 0;    // compression passes (Compactor::Compact)
  PoolCompactionCounters pool;
};

struct CacheStats {
  std::vector<ModelStats> models;
  SlabPoolStats host_pool;
  uint64_t blocks = 0;
  uint64_t payload_bytes = 0;
  uint64_t active_leases = 0;
  uint64_t capacity_evictions = 0;
  uint64_t quota_evictions = 0;  // a namespace's own blocks, to stay under its quota
  // A namespace's own blocks, to keep its metadata within its share of the
  // metadata budget (also counted in metadata_evictions).
  uint64_t namespace_metadata_evictions = 0;
  uint64_t rejected_appends = 0;
  ScoreHistogram scores;
  uint64_t compaction_passes = 0;
  PoolCompactionCounters pool_compaction;
  uint64_t conflicting_appends = 0;  // appends that carried a conflicting block
  uint64_t metadata_evictions = 0;   // evictions to keep metadata within its budget
  uint64_t metadata_bytes = 0;       // index nodes, tokens, importance state, lease tokens
  uint64_t staged_bytes = 0;         // pool memory of appends in flight
  uint64_t lease_tokens = 0;         // tokens held by live leases
  // The levels below host memory, in order (level 0 first); empty: none.
  // TierCounters::lower holds their counters by the same index.
  std::vector<TierStats> lower_stores;
  bool has_lower() const { return !lower_stores.empty(); }
  // The GPU tier, when there is one.
  bool has_device = false;
  TierStats device_store;
  TierCounters tiers;
  WorkStats prefetch;     // background promotions
  WorkStats fetch_reads;  // fetches whose lower-tier reads left the caller's thread
  CheckpointCounters checkpoint;

  // Every counter and gauge above, each group's in turn: the models' (their
  // families listed even with no model), each tier's size, the cache's own,
  // pool compaction's, the lower and GPU tiers' when they exist, the
  // checkpoints' when enabled. `now` is the time of the scrape. `scores` is
  // not visited: it is a histogram, which the metrics module renders itself.
  void VisitCounters(absl::Time now, CounterVisitor& visitor) const;
};

}  // namespace kvcache

#endif  // KVCACHE_SERVER_CORE_CACHE_STATS_H_
