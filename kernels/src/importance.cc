#include "kvcache/kernels/importance.h"

#include <cmath>

#include "validate.h"

namespace kvcache::kernels {
namespace {

bool FiniteNonNegative(float x) { return std::isfinite(x) && x >= 0.0f; }

}  // namespace

bool ImportanceParams::Valid() const {
  return FiniteNonNegative(alpha) && FiniteNonNegative(beta) && FiniteNonNegative(gamma) &&
         sink_tokens >= 0 && sink_tokens <= kMaxDimension && recent_window >= 0 &&
         recent_window <= kMaxDimension && std::isfinite(decay_tau) && decay_tau > 0.0f &&
         (decay == PositionDecay::kExponential || decay == PositionDecay::kHyperbolic);
}

float PositionFactor(int64_t t, int64_t num_tokens, const ImportanceParams& params) {
  if (t < 0 || t >= num_tokens) return 0.0f;
  const int64_t window_start = num_tokens - params.recent_window;
  if (t < params.sink_tokens || t >= window_start) return 1.0f;
  const float d = static_cast<float>(window_start - t);
  if (params.decay == PositionDecay::kHyperbolic) return 1.0f / (1.0f + d / params.decay_tau);
  return std::exp(-d / params.decay_tau);
}

KernelStatus ImportanceScoresCpu(const float* attention, const float* novelty, int64_t num_tokens,
                                 const ImportanceParams& params, float* scores) {
  const KernelStatus status = internal::CheckImportance(num_tokens, params, scores);
  if (status != KernelStatus::kOk) return status;
  for (int64_t t = 0; t < num_tokens; ++t) {
    const float a = attention != nullptr ? attention[t] : 0.0f;
    const float n = novelty != nullptr ? novelty[t] : 0.0f;
    const float p = PositionFactor(t, num_tokens, params);
    const float ap = params.alpha * a + params.beta * p;  // Built with -ffp-contract=off.
    scores[t] = ap + params.gamma * n;
  }
  return KernelStatus::kOk;
}

}  // namespace kvcache::kernels
