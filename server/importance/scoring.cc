#include "server/importance/scoring.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>

namespace kvcache::importance {
namespace {

float Sanitise(float x) { return std::isfinite(x) && x > 0 ? x : 0.0f; }

}  // namespace

void ScoreTokens(const kernels::ImportanceParams& params, int64_t first_position,
                 int64_t sequence_tokens, std::span<const float> activity,
                 std::span<const float> novelty, std::span<float> out) {
  for (size_t i = 0; i < out.size(); ++i) {
    const int64_t t = first_position + static_cast<int64_t>(i);
    const float a = activity.empty() ? 0.0f : std::min(Sanitise(activity[i]), 1.0f);
    const float n = novelty.empty() ? 0.0f : std::min(Sanitise(novelty[i]), 1.0f);
    const float p = kernels::PositionFactor(t, sequence_tokens, params);
    out[i] = params.alpha * a + params.beta * p + params.gamma * n;
  }
}

bool IsStructurallyProtected(const kernels::ImportanceParams& params, int64_t position,
                             int64_t sequence_tokens) {
  return position < params.sink_tokens || position >= sequence_tokens - params.recent_window;
}

Selection SelectByMass(std::span<const float> scores, double target_mass,
                       std::span<const uint8_t> protected_mask) {
  Selection s;
  const size_t n = scores.size();
  s.keep.assign(n, 0);
  s.threshold = std::numeric_limits<float>::infinity();
  std::vector<uint32_t> order;
  order.reserve(n);
  for (size_t t = 0; t < n; ++t) {
    const double v = Sanitise(scores[t]);
    s.total_mass += v;
    if (!protected_mask.empty() && protected_mask[t] != 0) {
      s.keep[t] = 1;
      s.kept_mass += v;
      ++s.kept;
    } else if (v > 0) {
      order.push_back(static_cast<uint32_t>(t));
    }
  }
  std::sort(order.begin(), order.end(), [&](uint32_t a, uint32_t b) {
    const float va = Sanitise(scores[a]);
    const float vb = Sanitise(scores[b]);
    return va != vb ? va > vb : a > b;
  });
  const double goal = target_mass * s.total_mass;
  for (uint32_t t : order) {
    if (s.kept_mass >= goal) break;
    s.keep[t] = 1;
    s.kept_mass += Sanitise(scores[t]);
    s.threshold = Sanitise(scores[t]);
    ++s.kept;
  }
  return s;
}

float DecayActivity(float previous, double elapsed_seconds, double half_life_seconds,
                    float observed, float weight) {
  double a = std::clamp(static_cast<double>(Sanitise(previous)), 0.0, 1.0);
  if (half_life_seconds > 0 && elapsed_seconds > 0) {
    a *= std::exp2(-elapsed_seconds / half_life_seconds);
  }
  const double o = std::clamp(static_cast<double>(Sanitise(observed)), 0.0, 1.0);
  const double w = std::clamp(static_cast<double>(weight), 0.0, 1.0);
  return static_cast<float>(std::clamp(a + w * (o - a), 0.0, 1.0));
}

std::vector<float> NormaliseAttention(std::span<const float> mass) {
  std::vector<float> out(mass.size());
  float max = 0;
  for (size_t i = 0; i < mass.size(); ++i) {
    out[i] = Sanitise(mass[i]);
    max = std::max(max, out[i]);
  }
  if (max > 0) {
    for (float& v : out) v /= max;
  }
  return out;
}

std::vector<float> ObserveAttention(std::span<const float> mass,
                                    const kernels::ImportanceParams& params) {
  const int64_t n = static_cast<int64_t>(mass.size());
  float max = 0;
  for (int64_t t = 0; t < n; ++t) {
    if (!IsStructurallyProtected(params, t, n)) max = std::max(max, Sanitise(mass[t]));
  }
  if (!(max > 0)) return NormaliseAttention(mass);
  std::vector<float> out(mass.size());
  for (int64_t t = 0; t < n; ++t) out[t] = std::min(1.0f, Sanitise(mass[t]) / max);
  return out;
}

}  // namespace kvcache::importance
