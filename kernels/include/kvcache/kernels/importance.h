// kvcache/kernels/importance.h: per-token retention score.
//
//   score[t] = alpha * attention[t] + beta * position[t] + gamma * novelty[t]
//
// attention[t] is the token's recent attention activity (the caller aggregates and normalises
// it, e.g. attention mass received over the last window, in [0, 1]); novelty[t] comes from
// KeyNoveltyCpu; position[t] encodes structure. With T = num_tokens, S = sink_tokens,
// W = recent_window, tau = decay_tau:
//   position[t] = 1                          if t < S (attention sinks) or t >= T - W (recent)
//   position[t] = exp(-d / tau)              otherwise, d = (T - W) - t >= 1   (kExponential)
//   position[t] = 1 / (1 + d / tau)          otherwise                          (kHyperbolic)
// d is the distance from the start of the recent window, so the factor is continuous there
// and halves every tau * ln 2 tokens (exponential) or falls as 1/d (hyperbolic, heavier tail).
// Arithmetic is fp32 with separate roundings: fl(fl(fl(a*A) + fl(b*P)) + fl(g*N)).
// The CUDA twin agrees within 1e-6 relative (only expf differs, by at most 2 ulp).
// Thread-safety: pure functions (see types.h).
#ifndef KVCACHE_KERNELS_IMPORTANCE_H_
#define KVCACHE_KERNELS_IMPORTANCE_H_

#include <cstdint>

#include "kvcache/kernels/types.h"

namespace kvcache::kernels {

enum class PositionDecay : int32_t {
  kExponential = 0,
  kHyperbolic = 1,
};

// The scoring weights and position model. Defaults are the design's (alpha 0.6, beta 0.3,
// gamma 0.1); sinks and window follow StreamingLLM-style practice.
struct ImportanceParams {
  float alpha = 0.6f;          // Weight of attention activity.
  float beta = 0.3f;           // Weight of the position factor.
  float gamma = 0.1f;          // Weight of key novelty.
  int64_t sink_tokens = 4;     // S: leading tokens always at position factor 1.
  int64_t recent_window = 64;  // W: trailing tokens always at position factor 1.
  float decay_tau = 256.0f;    // tau, in tokens; > 0.
  PositionDecay decay = PositionDecay::kExponential;

  // True when weights are finite and >= 0, sink_tokens and recent_window are in
  // [0, kMaxDimension], decay_tau is finite and > 0 and decay is a known value.
  bool Valid() const;
};

// position[t] for token t of num_tokens (the formula above); 0 for t outside [0, num_tokens).
float PositionFactor(int64_t t, int64_t num_tokens, const ImportanceParams& params);

// Writes num_tokens scores. `attention` and `novelty` hold num_tokens values each; either may
// be null, which counts as all zeros.
// REQUIRES: `scores` does not overlap the inputs.
// Returns kInvalidArgument when !params.Valid().
KernelStatus ImportanceScoresCpu(const float* attention, const float* novelty, int64_t num_tokens,
                                 const ImportanceParams& params, float* scores);

}  // namespace kvcache::kernels

#endif  // KVCACHE_KERNELS_IMPORTANCE_H_
