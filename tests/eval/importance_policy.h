// kvcache-eval: the importance-aware policy, deciding exactly as kvcached's
// daemon does (server/importance/scoring.h, server/core/importance.cc and
// importance_compaction.cc).
//
// Inputs, all from the past only:
//   * activity: every `report_every` past queries form one attention report
//     (per-token attention mass summed over the reported heads and
//     queries). Each report is normalised with importance::
//     NormaliseAttention and folded into each cached token's activity with
//     importance::DecayActivity(previous, elapsed, half_life, observed,
//     weight), elapsed = report_every * seconds_per_token (0 at a token's
//     first report), as ReportAttention does. Tokens of a block are updated
//     once the whole block is cached. kAccumulate instead normalises the sum
//     of all reports (a normalised accumulation).
//     kSequence normalises by the largest mass of the whole sequence (the
//     daemon today: the attention sink is usually that maximum);
//     kUnprotected by the largest mass of an unprotected token at report
//     time (protected tokens clamp to 1), so sinks do not squash the scale.
//   * novelty: kernels::KeyNoveltyCpu per `block_tokens` block (a block's
//     first token has novelty 1; novelty_per_block = false: over the whole
//     sequence), averaged over the daemon's novelty layers (up to 4 evenly
//     spaced; server/core/importance_policy.cc NoveltyLayers).
//   * position: kernels::PositionFactor through importance::ScoreTokens.
// Decision: importance::ScoreTokens, then importance::SelectByMass with the
// structurally protected tokens (sinks, recent window) kept at FP16. With
// scope kBlock the threshold is applied per block (the daemon's compaction
// works block by block); kSequence applies it once over the whole context.
// Kept unprotected tokens are FP16 (int8 = false) or INT8 (int8 = true,
// the daemon's prune mode).
// At a budget the target mass is the largest one (found by bisection) whose
// plan fits. When everything fits, INT8 tokens are promoted to FP16 in
// score order while the budget allows. With natural_target > 0 the policy
// has one operating point: SelectByMass at that target, no budget.
// Granularity kModel makes one decision per token for every layer and head
// (what the daemon's block format stores); kHead decides per kv unit from
// that unit's attention and keys (an alternative the format does not have).
//
// Thread-safety: as RetentionPolicy.
#ifndef KVCACHE_TESTS_EVAL_IMPORTANCE_POLICY_H_
#define KVCACHE_TESTS_EVAL_IMPORTANCE_POLICY_H_

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "kvcache/kernels/importance.h"
#include "server/importance/calibration.h"
#include "tests/eval/policies.h"

namespace kvcache::eval {

enum class Granularity { kModel, kHead };
enum class ActivityMode { kDecay, kAccumulate };
enum class ActivityNorm { kSequence, kUnprotected };
enum class SelectScope { kBlock, kSequence };

struct ImportanceOptions {
  kernels::ImportanceParams params;  // the daemon's defaults
  bool int8 = false;
  Granularity granularity = Granularity::kModel;
  ActivityMode activity = ActivityMode::kDecay;
  ActivityNorm norm = ActivityNorm::kSequence;
  SelectScope scope = SelectScope::kBlock;
  int64_t block_tokens = 64;  // the daemon's default block
  // Novelty per block as the daemon computes it at append (a block's first
  // token gets 1), or over the whole sequence (it compares with the
  // previous block's last key).
  bool novelty_per_block = true;
  double seconds_per_token = 0.05;  // time between past queries
  double half_life_seconds = 600;   // daemon default
  float activity_weight = 0.5f;     // daemon default
  double natural_target = 0;        // > 0: single operating point
};

// The layers novelty reads (the daemon's rule): all when num_layers <= 4,
// else (2i + 1) * num_layers / 8 for i = 0..3.
std::vector<int> DaemonNoveltyLayers(int num_layers);

// Activity of one decision group after every past report (exposed for tests
// and the report): `units` are the kv units whose attention is summed.
// When `calibrator` is not null, every report first adds one
// importance::CalibrationSample per updated token, as ReportAttention does
// (activity faded to the report's time, position factor within the
// sequence so far, novelty clamped to 1, observed attention); with
// `unprotected_only` the tokens protected at that time are left out.
// REQUIRES: novelty holds past.context values when calibrator is not null.
std::vector<float> GroupActivity(const PastAttention& past, const std::vector<int64_t>& units,
                                 const ImportanceOptions& options,
                                 std::span<const float> novelty = {},
                                 importance::Calibrator* calibrator = nullptr,
                                 bool unprotected_only = false);

// Which tokens feed weight calibration.
enum class CalibrationMode { kOff, kDaemon, kUnprotected };

struct CalibrationOutcome {
  bool ok = false;
  importance::Weights weights;  // normalised to sum 1 when ok
  double correlation = 0;       // of the fitted score with the observations
  size_t samples = 0;
};

// The weights the daemon's calibration converges to on this context's past
// reports (model granularity: one calibrator, every kv unit's attention):
// samples as GroupActivity records them, reservoir importance::Calibrator
// with its defaults, importance::FitWeights with 256 samples minimum. The
// daemon steps toward the fit by a bounded amount per refit; this is the
// point it converges to.
CalibrationOutcome CalibrateWeights(const PolicyContext& ctx, const ImportanceOptions& options,
                                    CalibrationMode mode);

std::unique_ptr<RetentionPolicy> MakeImportancePolicy(const PolicyContext& ctx,
                                                      const ImportanceOptions& options,
                                                      std::string name);

}  // namespace kvcache::eval

#endif  // KVCACHE_TESTS_EVAL_IMPORTANCE_POLICY_H_
