// What the operator's tools read from a Cache (docs/operations.md): the
// results of CacheInspector's VerifyBlocks, SnapshotMemory, InspectSequence
// and TopPrefixes (cache_inspector.h).
//
//   VerifyBlocks     reads stored copies back and checks each against its
//                    seal (size, checksum) and, when compressed, its block
//                    format and the checksum of its decoding; throttled, the
//                    lock never held while bytes are hashed or read
//   SnapshotMemory   blocks and bytes per model by tier and stored form, the
//                    pool's size classes, and the live leases with ages
//   InspectSequence  per token of a cached prefix: the importance score and
//                    its inputs, protection, and the precision it is stored at
//   TopPrefixes      cached sequences grouped by their first block, with the
//                    uses and bytes of everything cached below it
//
// Plain values: nothing here points into the cache.
#ifndef KVCACHE_SERVER_CORE_CACHE_INSPECTION_H_
#define KVCACHE_SERVER_CORE_CACHE_INSPECTION_H_

#include <array>
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "absl/time/time.h"
#include "server/core/cache_stats.h"
#include "server/core/importance_policy.h"
#include "server/core/layout.h"
#include "server/core/pin.h"
#include "server/core/slab_pool.h"

namespace kvcache {

// --- VerifyBlocks -------------------------------------------------------------

// A stored copy that does not match what the index says of it.
struct BadBlockReport {
  ModelKey model;
  uint64_t key = 0;      // the block's chain key
  uint32_t index = 0;    // its position in its sequence
  std::string tier;      // "host" or a lower level's kind ("ssd"): the copy that failed
  std::string problem;   // what did not match
  bool dropped = false;  // removed (with the blocks below it)
};

struct VerifyProgress {
  uint64_t blocks_total = 0;  // copies to check, counted at the start
  uint64_t blocks_checked = 0;
  uint64_t bytes_total = 0;
  uint64_t bytes_checked = 0;
  uint64_t skipped_blocks = 0;  // changed or removed meanwhile: not checked
  uint64_t dropped_blocks = 0;  // removed by drop_bad (bad ones and the blocks below them)
  std::vector<BadBlockReport> bad_blocks;  // in a callback: found since the previous one
  bool done = false;
};

struct VerifyOptions {
  // Which blocks: one model (then `prefix`, when not empty, narrows it to the
  // cached blocks of that prefix), else every model of `ns` (empty: of every
  // namespace).
  std::optional<ModelKey> model;
  std::string ns;
  std::vector<Token> prefix;
  bool drop_bad = false;
  // Also read back the copies in the levels below host memory (each one).
  bool include_lower = false;
  // Bytes read back per second at most; 0: no limit.
  uint64_t max_bytes_per_second = uint64_t{256} << 20;
  // Called about every progress_interval and once at the end (done set);
  // returning false stops the walk (the caller went away). May be empty.
  std::function<bool(const VerifyProgress&)> on_progress;
  absl::Duration progress_interval = absl::Seconds(1);
};

// --- SnapshotMemory -----------------------------------------------------------

struct ModelMemory {
  ModelKey model;
  uint64_t host_blocks = 0;
  uint64_t host_bytes = 0;  // stored bytes of host copies
  uint64_t lower_blocks = 0;
  uint64_t lower_bytes = 0;
  uint64_t device_blocks = 0;
  uint64_t raw_blocks = 0;     // exact, at the model's dtype
  uint64_t int8_blocks = 0;    // compressed format version 1
  uint64_t budget_blocks = 0;  // compressed format version 2
  uint64_t raw_bytes = 0;      // what the blocks would take uncompressed
  uint64_t leased_blocks = 0;  // held by a live lease
  // Host copies something pins (pin.h: leases, fetches streaming, appends
  // that found them cached, moves, checkpoints and inspections in flight).
  uint64_t referenced_blocks = 0;
  // Blocks a copy of which (host or lower tier) is pinned for each reason,
  // indexed by PinReason; a block pinned for two reasons counts in both.
  std::array<uint64_t, kPinReasons> pinned_by{};
  uint64_t pinned_tokens = 0;
  uint64_t metadata_bytes = 0;
};

struct LeaseSnapshot {
  uint64_t id = 0;
  ModelKey model;
  uint64_t tokens = 0;
  uint64_t blocks = 0;
  uint64_t bytes = 0;
  absl::Time created;
  absl::Time expires;
};

struct MemorySnapshot {
  absl::Time taken;
  CacheStats stats;  // taken in the same pass as the rest
  std::vector<ModelMemory> models;
  std::vector<SlabClassStats> slab_classes;  // the host pool's, smallest first
  std::vector<LeaseSnapshot> leases;         // the oldest first, at most the limit asked
  uint64_t leases_total = 0;
};

// --- InspectSequence ----------------------------------------------------------

// How a token, or a (layer, KV head, token) entry, is stored.
enum class StoredPrecision : uint8_t {
  kFull = 0,  // the model's dtype, exact
  kInt8 = 1,
  kInt4 = 2,
  kPruned = 3,  // dropped
  kMixed = 4,   // a token whose entries differ (budget mode); never an entry's
};

struct InspectedBlock {
  uint32_t index = 0;
  uint64_t key = 0;
  bool in_host = false;
  bool in_lower = false;
  std::string lower_kind;  // with in_lower: the kind of its top lower level ("ssd")
  bool lossy = false;
  uint32_t format_version = 0;  // 0: raw; 1 or 2: compressed block format
  uint64_t stored_bytes = 0;
  uint64_t raw_bytes = 0;
  float importance = 0;  // the block's value to eviction, [0, 1]
};

// Arrays are per token of the matched prefix, except the head maps.
struct SequenceInspection {
  ModelLayout layout;
  ImportancePolicy policy;
  uint64_t matched_tokens = 0;
  std::vector<InspectedBlock> blocks;
  std::vector<float> importance;      // the score compaction ranks by, with the weights now
  std::vector<float> activity;        // decayed attention reports, [0, 1] (faded to now)
  std::vector<float> novelty;         // [0, 2]
  std::vector<float> position;        // the position factor
  std::vector<uint8_t> pinned;        // 1: protected by a worker's hints
  std::vector<uint8_t> is_protected;  // 1: kept exact whatever the score
  std::vector<StoredPrecision> precision;
  // With include_heads: [layer][head][token] over the prefix. head_activity
  // is empty when no block of the prefix holds per-head reports.
  std::vector<float> head_activity;
  std::vector<StoredPrecision> head_precision;
  uint64_t attention_reports = 0;  // the model's, so far
  std::vector<Token> tokens;       // the inspected prefix
};

// --- TopPrefixes --------------------------------------------------------------

// The cached sequences that begin with one first block.
struct PrefixSummary {
  ModelKey model;
  uint64_t key = 0;         // the first block's chain key
  uint64_t blocks = 0;      // cached blocks in the subtree
  uint64_t bytes = 0;       // their stored bytes (host and lower)
  uint64_t references = 0;  // lookups, fetches and appends that used them
  uint32_t depth = 0;       // blocks in the longest cached sequence
  absl::Time last_access = absl::InfinitePast();
  std::vector<Token> first_tokens;  // the first block's first tokens (at most 16)
};

}  // namespace kvcache

#endif  // KVCACHE_SERVER_CORE_CACHE_INSPECTION_H_
