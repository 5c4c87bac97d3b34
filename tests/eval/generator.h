// kvcache-eval: a seeded synthetic generator of attention inputs (Q, K, V
// after rotary embedding) whose statistics follow what is published about
// real decoder-only models.
//
// What it builds into the data (docs/importance.md lists the measured
// statistics next to their targets; statistics.h measures them):
//   * attention sinks: past the first `sink_from_layer` layers, most query
//     heads give the first token 0.6-0.9 of their attention (the share is
//     set per query by solving for the query's component along the sink
//     key), and the sink's value vector is small;
//   * heavy hitters with a power law: every token has a salience whose
//     attention factor exp(salience) is Pareto distributed (tail index 1,
//     i.e. Zipf-like rank-frequency), carried by low-frequency rotary
//     dimensions so it does not depend on distance; heads share part of it
//     (a Gaussian copula with correlation `salience_head_correlation`);
//     queries change it only slightly, so heavy hitters persist;
//   * local and broad heads: a per-head component in the high-frequency
//     rotary dimensions makes the logit fall with distance (strongly in
//     local heads, weakly in broad ones);
//   * query-specific noise: random query and key content;
//   * a few fixed outlier key channels per kv head (large, stable values);
//   * rotary embedding (interleaved pairs, base `rope_theta`) on Q and K;
//   * near-duplicate spans: runs of tokens whose keys and values copy the
//     run's first token up to small noise (many more in kRedundant).
// Everything is a deterministic function of the config (own normal and
// exponential transforms over std::mt19937_64, which is bit-specified).
// Values are rounded to fp16, so the fp16 cache is the exact reference.
//
// Thread-safety: Generate is a pure function of its config.
#ifndef KVCACHE_TESTS_EVAL_GENERATOR_H_
#define KVCACHE_TESTS_EVAL_GENERATOR_H_

#include <cstdint>
#include <string>
#include <string_view>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "tests/eval/dataset.h"

namespace kvcache::eval {

enum class Profile { kStandard, kRedundant };

// "standard" / "redundant"; ParseProfile returns false for anything else.
const char* ProfileName(Profile p);
bool ParseProfile(std::string_view name, Profile* out);

struct GeneratorConfig {
  Profile profile = Profile::kStandard;
  uint64_t seed = 1;
  int layers = 8;
  int q_heads = 8;
  int kv_heads = 2;
  int head_dim = 128;      // even, >= 32
  int64_t context = 2048;  // cached tokens
  int64_t future = 64;     // held-out query tokens after the context
  double rope_theta = 500000.0;

  // Attention sinks (token 0).
  int sink_from_layer = 2;
  double sink_share_min = 0.6;
  double sink_share_max = 0.9;
  double sinkless_head_share = 0.1;  // heads past sink_from_layer with a weak sink
  double sink_value_scale = 0.1;     // |v_0| relative to a typical value

  // Head types and logit scales.
  double local_head_share = 0.3;
  double query_noise = 0.6;                // std of the query-content logit
  double salience_head_correlation = 0.5;  // heavy hitters shared across heads

  // Outlier key channels per kv head.
  int outlier_channels = 4;
  double outlier_min = 6.0;  // magnitude, in units of a normal channel's std
  double outlier_max = 12.0;

  // Near-duplicate spans over the context.
  double duplicate_share = 0.08;  // share of context tokens inside a span (copies)
  int duplicate_min = 4;
  int duplicate_max = 24;
  double duplicate_noise = 0.03;  // relative noise of a copy

  int threads = 1;

  // The defaults with the profile's duplicate settings.
  static GeneratorConfig ForProfile(Profile profile);

  // INVALID_ARGUMENT naming the field when a setting is out of range.
  absl::Status Validate() const;
};

absl::StatusOr<KvDataset> Generate(const GeneratorConfig& config);

}  // namespace kvcache::eval

#endif  // KVCACHE_TESTS_EVAL_GENERATOR_H_
