// kvcache-eval: the attention every policy and metric is computed from.
//
// Past attention: every context query i attends causally to keys [0, i]
// (kernels::ReferenceAttentionCpu, one query at a time). Retention policies
// may only use these weights; they are aggregated per kv unit (one
// (layer, kv head); the unit's query heads are summed, as grouped-query
// attention shares the keys) in the forms the policies read: the sum over
// all queries (H2O's accumulated attention), over the last `snap_window`
// queries (SnapKV's observation window) and per attention report of
// `report_every` consecutive queries (what a worker sends the daemon).
//
// Future reference: the held-out queries are the next decoding steps. Query
// f (token context + f) attends causally to the whole full-precision
// context and to the new tokens [context, context + f], which a retention
// policy never touches (they are not cached yet). Their weights, outputs
// and true top-k context positions are what the metrics compare a
// compressed cache against.
//
// Thread-safety: pure functions; work is split over `threads` threads.
#ifndef KVCACHE_TESTS_EVAL_ATTENTION_PASS_H_
#define KVCACHE_TESTS_EVAL_ATTENTION_PASS_H_

#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"
#include "tests/eval/dataset.h"

namespace kvcache::eval {

struct PastAttentionOptions {
  int64_t report_every = 64;   // queries per attention report
  int64_t snap_window = 32;    // SnapKV observation window (last queries)
  int64_t stats_window = 256;  // queries whose mean attention the statistics use
  int threads = 1;
};

struct PastAttention {
  int64_t context = 0;
  int64_t reports = 0;  // ceil(context / report_every)
  PastAttentionOptions options;
  // Per kv unit (layer * kv_heads + kv head), summed over its query heads:
  std::vector<std::vector<float>> accumulated;  // [context]: all past queries
  std::vector<std::vector<float>> window;       // [context]: last snap_window queries
  std::vector<std::vector<float>> report_mass;  // [reports][context]: report r's queries
  // Per query unit (layer * q_heads + head): mean weights of the last
  // stats_window queries, [context]; and their mean share of non-sink
  // attention on the 64 tokens up to the query itself.
  std::vector<std::vector<float>> recent_mean;
  std::vector<double> local_share;
};

// REQUIRES: data.Validate() is ok; 2 <= context <= data.shape.tokens.
absl::StatusOr<PastAttention> ComputePastAttention(const KvDataset& data, int64_t context,
                                                   const PastAttentionOptions& options);

struct FutureReference {
  int64_t context = 0;
  int64_t future = 0;
  int top_k = 0;
  // Per query unit (layer * q_heads + head):
  std::vector<std::vector<float>> weights;  // [future][context + future]: row f over
                                            // keys [0, context + f], zeros after
  std::vector<std::vector<float>> outputs;  // [future][head_dim]
  std::vector<std::vector<int32_t>> top;    // [future][top_k]: true top-k context positions
  // Per kv unit: sqrt(mean over context tokens of |v|^2).
  std::vector<double> value_rms;
};

// The queries of tokens [context, tokens), each over keys [0, its own token].
absl::StatusOr<FutureReference> ComputeFutureReference(const KvDataset& data, int64_t context,
                                                       int top_k, int threads);

}  // namespace kvcache::eval

#endif  // KVCACHE_TESTS_EVAL_ATTENTION_PASS_H_
