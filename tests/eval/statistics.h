// kvcache-eval: the measured statistics of a dataset, next to the published
// properties of real models' attention that the synthetic generator aims at.
//
// Measured from the data alone (the same code runs on real dumps):
//   sink        first-token share of each query head's attention (future
//               queries), in layers >= sink_from_layer; share of those heads
//               within [0.6, 0.9]              target: most heads (>= 75%)
//   sparsity    share of attention weights below 1% of their row's maximum
//                                             target: > 95%
//   power law   per head, the mean attention of the last `stats_window` past
//               queries over tokens [1, context - stats_window), sorted: a
//               log-log line fit over the top quarter of ranks; median R^2
//               and slope                      target: R^2 >= 0.9
//   persistence per head, the top 1% (at least 8) of those tokens (less the
//               near-duplicate copies, novelty < 0.05, whose order among
//               themselves is arbitrary) by past
//               attention and by future attention; of the future top sets'
//               future attention mass (pooled over heads), the share on
//               tokens also in the past top set   target: > 95%
//               (the per-head mean of that share and the plain share of
//               common tokens are reported beside it: local heads' far
//               field is position-driven and carries little mass, and
//               tokens at a set's edge have near-equal attention)
//   outliers    key channels whose RMS over the context exceeds 4x the
//               median channel's, per kv head; the same channels in both
//               halves of the context (Jaccard) target: a few (1-8), fixed
//   duplicates  share of context tokens whose key novelty (KeyNoveltyCpu,
//               mean over layers) is below 0.05 target: present (>= 2%);
//               >= 30% in the redundant profile
//   head types  local (>= 50% of the non-sink mass on the 64 tokens up to
//               the query, last stats_window past queries) and broad
//               (<= 20%) query heads           target: both present
//   sink value  |v_0| / median |v_t| in layers >= sink_from_layer (reported)
//
// Thread-safety: pure functions.
#ifndef KVCACHE_TESTS_EVAL_STATISTICS_H_
#define KVCACHE_TESTS_EVAL_STATISTICS_H_

#include <cstdint>
#include <string>
#include <vector>

#include "tests/eval/attention_pass.h"
#include "tests/eval/dataset.h"

namespace kvcache::eval {

struct DatasetStatistics {
  double sink_heads_in_range = 0;  // share of heads (layers >= from) in [0.6, 0.9]
  double sink_share_mean = 0;      // mean first-token share, layers >= from
  double sink_share_early = 0;     // mean first-token share, layers < from
  double sparsity = 0;
  double powerlaw_r2 = 0;
  double powerlaw_slope = 0;
  double persistence = 0;  // mass-weighted top-1% overlap, pooled
  double persistence_head_mean = 0;
  double persistence_count = 0;  // share of common top-1% tokens
  double outlier_channels = 0;   // mean per kv head
  double outlier_ratio = 0;      // mean of max channel RMS / median channel RMS
  double outlier_stability = 0;  // mean Jaccard of the two halves' outlier sets
  double duplicate_share = 0;
  double mean_novelty = 0;
  int local_heads = 0;
  int broad_heads = 0;
  int heads = 0;
  double sink_value_ratio = 0;
};

DatasetStatistics MeasureStatistics(const KvDataset& data, const PastAttention& past,
                                    const FutureReference& ref, int sink_from_layer = 2);

struct StatisticRow {
  std::string name;
  std::string measured;
  std::string target;
  bool has_target = false;
  bool met = false;
};

// Rows for the report; `redundant` selects the redundancy-heavy targets.
std::vector<StatisticRow> StatisticRows(const DatasetStatistics& s, bool redundant);

}  // namespace kvcache::eval

#endif  // KVCACHE_TESTS_EVAL_STATISTICS_H_
