#include "server/importance/calibration.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <limits>

namespace kvcache::importance {
namespace {

constexpr int kFeatures = 3;
using Vec = std::array<double, kFeatures>;

// Features and observation of a sample, each sanitised to [0, 1] (non-finite -> 0).
double Clean(float x) {
  return std::isfinite(x) ? std::clamp(static_cast<double>(x), 0.0, 1.0) : 0;
}

Vec FeaturesOf(const CalibrationSample& s) {
  return {Clean(s.activity), Clean(s.position), Clean(s.novelty)};
}

double Dot(const Vec& a, const Vec& b) { return a[0] * b[0] + a[1] * b[1] + a[2] * b[2]; }

double CleanWeight(float w) { return std::isfinite(w) && w > 0 ? static_cast<double>(w) : 0.0; }

// Solves the k x k system a x = b (Gaussian elimination, partial pivoting) in place.
// False when the system is singular relative to `scale` (the largest diagonal of the full
// normal matrix).
bool Solve(int k, double a[kFeatures][kFeatures], double b[kFeatures], double scale,
           double x[kFeatures]) {
  const double tiny = 1e-12 * std::max(scale, std::numeric_limits<double>::min());
  for (int c = 0; c < k; ++c) {
    int pivot = c;
    for (int r = c + 1; r < k; ++r) {
      if (std::abs(a[r][c]) > std::abs(a[pivot][c])) pivot = r;
    }
    if (std::abs(a[pivot][c]) <= tiny) return false;
    if (pivot != c) {
      for (int j = 0; j < k; ++j) std::swap(a[c][j], a[pivot][j]);
      std::swap(b[c], b[pivot]);
    }
    for (int r = c + 1; r < k; ++r) {
      const double f = a[r][c] / a[c][c];
      for (int j = c; j < k; ++j) a[r][j] -= f * a[c][j];
      b[r] -= f * b[c];
    }
  }
  for (int r = k - 1; r >= 0; --r) {
    double v = b[r];
    for (int j = r + 1; j < k; ++j) v -= a[r][j] * x[j];
    x[r] = v / a[r][r];
  }
  return true;
}

}  // namespace

FitResult FitWeights(std::span<const CalibrationSample> samples, size_t min_samples) {
  FitResult result;
  if (samples.empty() || samples.size() < min_samples) return result;

  // Normal equations: xtx = X^T X, xty = X^T y.
  double xtx[kFeatures][kFeatures] = {};
  double xty[kFeatures] = {};
  for (const CalibrationSample& s : samples) {
    const Vec f = FeaturesOf(s);
    const double y = Clean(s.observed);
    for (int i = 0; i < kFeatures; ++i) {
      xty[i] += f[i] * y;
      for (int j = 0; j < kFeatures; ++j) xtx[i][j] += f[i] * f[j];
    }
  }
  const double scale = std::max({xtx[0][0], xtx[1][1], xtx[2][2]});

  // Exact NNLS: the optimum is the unconstrained least-squares fit on its own support, so try
  // every support, keep the feasible (all weights >= 0) fits and pick the smallest error.
  // The error is measured on the samples rather than expanded from the normal equations, which
  // would cancel catastrophically for good fits.
  auto squared_error = [&](const Vec& w) {
    double sse = 0;
    for (const CalibrationSample& s : samples) {
      const double r = Dot(w, FeaturesOf(s)) - Clean(s.observed);
      sse += r * r;
    }
    return sse;
  };
  Vec best{0, 0, 0};
  double best_sse = squared_error(best);
  for (int mask = 1; mask < (1 << kFeatures); ++mask) {
    int idx[kFeatures];
    int k = 0;
    for (int i = 0; i < kFeatures; ++i) {
      if (mask & (1 << i)) idx[k++] = i;
    }
    double a[kFeatures][kFeatures];
    double b[kFeatures];
    double x[kFeatures];
    for (int r = 0; r < k; ++r) {
      b[r] = xty[idx[r]];
      for (int c = 0; c < k; ++c) a[r][c] = xtx[idx[r]][idx[c]];
    }
    if (!Solve(k, a, b, scale, x)) continue;
    Vec w{0, 0, 0};
    bool feasible = true;
    for (int r = 0; r < k; ++r) {
      if (!(x[r] >= 0)) feasible = false;  // also rejects NaN
      w[idx[r]] = x[r];
    }
    if (!feasible) continue;
    const double sse = squared_error(w);
    if (sse < best_sse) {
      best_sse = sse;
      best = w;
    }
  }

  result.mse_fitted = best_sse / static_cast<double>(samples.size());
  const double sum = best[0] + best[1] + best[2];
  if (!(sum > 0) || !std::isfinite(sum)) return result;
  result.ok = true;
  result.weights = Weights{static_cast<float>(best[0] / sum), static_cast<float>(best[1] / sum),
                           static_cast<float>(best[2] / sum)};
  // Pearson correlation is invariant to the positive normalisation.
  result.correlation = ScoreCorrelation(samples, result.weights);
  return result;
}

Weights StepToward(const Weights& current, const Weights& target, float max_step) {
  Vec c{CleanWeight(current.alpha), CleanWeight(current.beta), CleanWeight(current.gamma)};
  Vec t{CleanWeight(target.alpha), CleanWeight(target.beta), CleanWeight(target.gamma)};
  const double c_sum = c[0] + c[1] + c[2];
  const double t_sum = t[0] + t[1] + t[2];
  if (!(c_sum > 0) && !(t_sum > 0)) return Weights{};
  // A side without positive weight carries no policy: take the other as it is.
  if (!(c_sum > 0)) c = t;
  if (!(t_sum > 0)) t = c;
  const double cs = c[0] + c[1] + c[2];
  const double ts = t[0] + t[1] + t[2];
  for (int i = 0; i < kFeatures; ++i) {
    c[i] /= cs;
    t[i] /= ts;
  }
  // Both are on the simplex; move along the segment between them by the largest fraction that
  // moves no weight by more than max_step. The result stays on the simplex (sum 1, >= 0).
  const double step = std::isfinite(max_step) && max_step > 0 ? max_step : 0.0;
  double largest = 0;
  for (int i = 0; i < kFeatures; ++i) largest = std::max(largest, std::abs(t[i] - c[i]));
  const double fraction = largest <= step ? 1.0 : step / largest;
  Vec w;
  for (int i = 0; i < kFeatures; ++i) w[i] = std::max(0.0, c[i] + fraction * (t[i] - c[i]));
  const double sum = w[0] + w[1] + w[2];
  return Weights{static_cast<float>(w[0] / sum), static_cast<float>(w[1] / sum),
                 static_cast<float>(w[2] / sum)};
}

double ScoreCorrelation(std::span<const CalibrationSample> samples, const Weights& weights) {
  if (samples.size() < 2) return 0;
  const Vec w{CleanWeight(weights.alpha), CleanWeight(weights.beta), CleanWeight(weights.gamma)};
  const double n = static_cast<double>(samples.size());
  double mean_x = 0;
  double mean_y = 0;
  for (const CalibrationSample& s : samples) {
    mean_x += Dot(w, FeaturesOf(s));
    mean_y += Clean(s.observed);
  }
  mean_x /= n;
  mean_y /= n;
  double sxx = 0;
  double syy = 0;
  double sxy = 0;
  for (const CalibrationSample& s : samples) {
    const double dx = Dot(w, FeaturesOf(s)) - mean_x;
    const double dy = Clean(s.observed) - mean_y;
    sxx += dx * dx;
    syy += dy * dy;
    sxy += dx * dy;
  }
  // Variance below rounding noise of the means counts as none.
  const double eps = 1e-24 * n;
  if (sxx <= eps || syy <= eps) return 0;
  return std::clamp(sxy / std::sqrt(sxx * syy), -1.0, 1.0);
}

Calibrator::Calibrator(size_t capacity, uint64_t seed) : capacity_(capacity), rng_(seed) {
  samples_.reserve(std::min<size_t>(capacity_, size_t{1} << 16));
}

void Calibrator::Add(const CalibrationSample& sample) {
  ++seen_;
  if (samples_.size() < capacity_) {
    samples_.push_back(sample);
    return;
  }
  if (capacity_ == 0) return;
  // Algorithm R: the seen_-th sample replaces a random slot with probability capacity / seen_.
  std::uniform_int_distribution<uint64_t> pick(0, seen_ - 1);
  const uint64_t j = pick(rng_);
  if (j < capacity_) samples_[static_cast<size_t>(j)] = sample;
}

void Calibrator::Clear() {
  samples_.clear();
  seen_ = 0;
}

}  // namespace kvcache::importance
