// BlockTokenState: what the cache knows about each token of a cached block,
// for importance-aware retention (docs/importance.md).
//
// Novelty is computed once, when the block is appended; activity is the
// decayed attention that workers report; pins are the token ranges a worker
// asked to protect. num_int8 / num_pruned (version-1 blocks) or the
// *_entries counters (version-2 blocks) describe the block's current
// representation (all 0 for a raw block). Vectors are empty until there is
// something to hold (a block nobody reported on has no activity vector).
//
// Thread-safety: owned by an IndexNode and guarded by the cache's mutex.
#ifndef KVCACHE_SERVER_CORE_TOKEN_STATE_H_
#define KVCACHE_SERVER_CORE_TOKEN_STATE_H_

#include <algorithm>
#include <cstdint>
#include <vector>

#include "absl/time/time.h"

namespace kvcache {

struct BlockTokenState {
  std::vector<float> novelty;   // block_tokens values in [0, 2], or empty
  std::vector<float> activity;  // block_tokens values in [0, 1], or empty
  absl::Time activity_updated = absl::InfinitePast();
  std::vector<uint8_t> pinned;  // block_tokens flags (1: worker-pinned), or empty
  uint32_t num_int8 = 0;        // tokens stored as INT8
  uint32_t num_pruned = 0;      // tokens dropped
  // Budget mode: per (layer, KV head, token) activity, [layer][head][token]
  // (num_layers * num_kv_heads * block_tokens values), or empty (then every
  // head uses `activity`). Not kept in checkpoints.
  std::vector<float> head_activity;
  // Version-2 blocks: entries stored as INT8, INT4, or dropped (num_int8 and
  // num_pruned stay 0 for them).
  uint32_t int8_entries = 0;
  uint32_t int4_entries = 0;
  uint32_t pruned_entries = 0;
  uint64_t bytes_saved = 0;  // pool memory the compressed copy freed
  bool compressed = false;   // the payload uses the compressed block format

  // Seconds from activity_updated to `now`, never negative; 0 before the
  // first report. What activity decays by.
  double SecondsSinceActivity(absl::Time now) const {
    if (activity_updated == absl::InfinitePast()) return 0;
    return std::max(0.0, absl::ToDoubleSeconds(now - activity_updated));
  }
};

}  // namespace kvcache

#endif  // KVCACHE_SERVER_CORE_TOKEN_STATE_H_
