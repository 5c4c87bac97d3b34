#include "server/importance/calibration.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace kvcache::importance {
namespace {

using Vec3 = std::array<double, 3>;

Vec3 AsVec(const Weights& w) { return {w.alpha, w.beta, w.gamma}; }

Vec3 Features(const CalibrationSample& s) { return {s.activity, s.position, s.novelty}; }

double Dot(const Vec3& a, const Vec3& b) { return a[0] * b[0] + a[1] * b[1] + a[2] * b[2]; }

double Sum(const Vec3& v) { return v[0] + v[1] + v[2]; }

// Samples with independent uniform features and observed = w · features + N(0, noise).
std::vector<CalibrationSample> Planted(const Vec3& w, size_t n, double noise, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> u(0.0f, 1.0f);
  std::normal_distribution<double> g(0.0, noise);
  std::vector<CalibrationSample> out(n);
  for (CalibrationSample& s : out) {
    s.activity = u(rng);
    s.position = u(rng);
    s.novelty = u(rng);
    s.observed = static_cast<float>(std::clamp(Dot(w, Features(s)) + g(rng), 0.0, 1.0));
  }
  return out;
}

double SquaredError(const std::vector<CalibrationSample>& samples, const Vec3& w) {
  double sse = 0;
  for (const CalibrationSample& s : samples) {
    const double r = Dot(w, Features(s)) - s.observed;
    sse += r * r;
  }
  return sse;
}

// Non-negative least squares by projected gradient descent: slow but independent of the
// active-set enumeration under test.
Vec3 ProjectedGradientNnls(const std::vector<CalibrationSample>& samples) {
  double a[3][3] = {};
  double b[3] = {};
  for (const CalibrationSample& s : samples) {
    const Vec3 f = Features(s);
    for (int i = 0; i < 3; ++i) {
      b[i] += f[i] * s.observed;
      for (int j = 0; j < 3; ++j) a[i][j] += f[i] * f[j];
    }
  }
  const double lipschitz = a[0][0] + a[1][1] + a[2][2];
  Vec3 w{0, 0, 0};
  for (int iter = 0; iter < 200000; ++iter) {
    Vec3 next;
    for (int i = 0; i < 3; ++i) {
      const double grad = a[i][0] * w[0] + a[i][1] * w[1] + a[i][2] * w[2] - b[i];
      next[i] = std::max(0.0, w[i] - grad / lipschitz);
    }
    w = next;
  }
  return w;
}

// The unnormalised fit behind normalised weights: the best positive multiple.
Vec3 Unnormalise(const std::vector<CalibrationSample>& samples, const Vec3& wn) {
  double num = 0, den = 0;
  for (const CalibrationSample& s : samples) {
    const double p = Dot(wn, Features(s));
    num += p * s.observed;
    den += p * p;
  }
  const double k = num / den;
  return {wn[0] * k, wn[1] * k, wn[2] * k};
}

TEST(FitWeightsTest, RecoversPlantedWeights) {
  const Vec3 truths[] = {
      {0.6, 0.3, 0.1},   {0.2, 0.5, 0.3},   {0.7, 0.0, 0.3},
      {0.0, 0.0, 0.9},   {0.15, 0.15, 0.1},  // small overall scale
      {0.45, 0.45, 0.0},
  };
  uint32_t seed = 1;
  for (const Vec3& truth : truths) {
    SCOPED_TRACE(testing::Message() << truth[0] << " " << truth[1] << " " << truth[2]);
    const std::vector<CalibrationSample> samples = Planted(truth, 4000, 0.01, ++seed);
    const FitResult fit = FitWeights(samples, 100);
    ASSERT_TRUE(fit.ok);
    const double total = Sum(truth);
    const Vec3 got = AsVec(fit.weights);
    EXPECT_NEAR(Sum(got), 1.0, 1e-6);
    for (int i = 0; i < 3; ++i) {
      EXPECT_GE(got[i], 0.0) << i;
      EXPECT_NEAR(got[i], truth[i] / total, 0.02) << "weight " << i;
    }
    EXPECT_NEAR(fit.mse_fitted, 0.01 * 0.01, 0.5 * 0.01 * 0.01);
    EXPECT_GT(fit.correlation, 0.9);
    EXPECT_NEAR(fit.correlation, ScoreCorrelation(samples, fit.weights), 1e-12);
  }
}

TEST(FitWeightsTest, IsTheExactNonNegativeOptimum) {
  // Observations a negative weight would explain better: the fit must clip, and be optimal.
  std::mt19937 rng(17);
  std::uniform_real_distribution<float> u(0.0f, 1.0f);
  for (int trial = 0; trial < 6; ++trial) {
    SCOPED_TRACE(trial);
    std::vector<CalibrationSample> samples(1500);
    const double c[3] = {0.2 + 0.1 * trial, trial % 2 == 0 ? -0.4 : 0.3, trial < 3 ? 0.3 : -0.2};
    for (CalibrationSample& s : samples) {
      s.activity = u(rng);
      s.position = u(rng);
      // Correlated novelty makes the active set matter.
      s.novelty = std::clamp(0.5f * s.activity + 0.5f * u(rng), 0.0f, 1.0f);
      const double y = c[0] * s.activity + c[1] * s.position + c[2] * s.novelty + 0.3;
      s.observed = static_cast<float>(std::clamp(y, 0.0, 1.0));
    }
    const FitResult fit = FitWeights(samples, 10);
    ASSERT_TRUE(fit.ok);
    EXPECT_GE(std::min({fit.weights.alpha, fit.weights.beta, fit.weights.gamma}), 0.0f);
    const Vec3 w = Unnormalise(samples, AsVec(fit.weights));
    const double sse = SquaredError(samples, w);
    EXPECT_NEAR(fit.mse_fitted, sse / samples.size(), 1e-9);
    const Vec3 reference = ProjectedGradientNnls(samples);
    EXPECT_LE(sse, SquaredError(samples, reference) * (1 + 1e-9) + 1e-12);
    // KKT: zero gradient on the support, non-negative gradient off it.
    Vec3 grad{0, 0, 0};
    for (const CalibrationSample& s : samples) {
      const Vec3 f = Features(s);
      const double r = Dot(w, f) - s.observed;
      for (int i = 0; i < 3; ++i) grad[i] += f[i] * r;
    }
    for (int i = 0; i < 3; ++i) {
      if (w[i] > 1e-9) {
        EXPECT_NEAR(grad[i], 0.0, 1e-6 * samples.size()) << i;
      } else {
        EXPECT_GE(grad[i], -1e-6 * samples.size()) << i;
      }
    }
  }
}

TEST(FitWeightsTest, TooFewSamples) {
  const std::vector<CalibrationSample> samples = Planted({0.5, 0.3, 0.2}, 50, 0.01, 3);
  EXPECT_FALSE(FitWeights(samples, 51).ok);
  EXPECT_TRUE(FitWeights(samples, 50).ok);
  EXPECT_FALSE(FitWeights({}, 0).ok);
}

TEST(FitWeightsTest, DegenerateInputsAreNotOk) {
  // Nothing observed: the best fit is all zeros.
  std::vector<CalibrationSample> samples = Planted({0.5, 0.3, 0.2}, 200, 0.0, 4);
  for (CalibrationSample& s : samples) s.observed = 0;
  EXPECT_FALSE(FitWeights(samples, 10).ok);
  // No features: nothing can explain the observations.
  samples = Planted({0.5, 0.3, 0.2}, 200, 0.0, 5);
  for (CalibrationSample& s : samples) s.activity = s.position = s.novelty = 0;
  EXPECT_FALSE(FitWeights(samples, 10).ok);
  // Observations only explained by negative weights.
  samples = Planted({0.5, 0.3, 0.2}, 200, 0.0, 6);
  for (CalibrationSample& s : samples) {
    s.position = s.novelty = 0;
    s.observed = s.activity > 0.5f ? 0.0f : 1.0f;
    s.activity = s.activity > 0.5f ? s.activity : 0.0f;
  }
  EXPECT_FALSE(FitWeights(samples, 10).ok);
}

TEST(FitWeightsTest, CollinearAndNonFiniteFeatures) {
  // Activity equals position: the split is arbitrary but the fit must still be valid.
  std::vector<CalibrationSample> samples = Planted({0.4, 0.4, 0.2}, 500, 0.0, 7);
  for (CalibrationSample& s : samples) {
    s.position = s.activity;
    s.observed = 0.4f * s.activity + 0.4f * s.position + 0.2f * s.novelty;
  }
  FitResult fit = FitWeights(samples, 10);
  ASSERT_TRUE(fit.ok);
  EXPECT_NEAR(fit.weights.alpha + fit.weights.beta, 0.8, 0.01);
  EXPECT_NEAR(fit.weights.gamma, 0.2, 0.01);
  EXPECT_GT(fit.correlation, 0.999);

  // A few non-finite values must not poison the fit.
  samples = Planted({0.6, 0.3, 0.1}, 2000, 0.005, 8);
  samples[3].activity = std::numeric_limits<float>::quiet_NaN();
  samples[9].observed = std::numeric_limits<float>::infinity();
  samples[11].novelty = -std::numeric_limits<float>::infinity();
  fit = FitWeights(samples, 10);
  ASSERT_TRUE(fit.ok);
  EXPECT_TRUE(std::isfinite(fit.mse_fitted));
  EXPECT_NEAR(fit.weights.alpha, 0.6, 0.03);
  EXPECT_NEAR(fit.weights.beta, 0.3, 0.03);
  EXPECT_NEAR(fit.weights.gamma, 0.1, 0.03);
}

Weights RandomSimplex(std::mt19937& rng) {
  std::exponential_distribution<float> e(1.0f);
  const float a = e(rng), b = e(rng), g = e(rng);
  const float s = a + b + g;
  return Weights{a / s, b / s, g / s};
}

double MaxMove(const Weights& from, const Weights& to) {
  return std::max({std::abs(to.alpha - from.alpha), std::abs(to.beta - from.beta),
                   std::abs(to.gamma - from.gamma)});
}

TEST(StepTowardTest, BoundsEveryWeightsStep) {
  std::mt19937 rng(23);
  for (int trial = 0; trial < 2000; ++trial) {
    const Weights current = RandomSimplex(rng);
    const Weights target = RandomSimplex(rng);
    const float max_step = std::uniform_real_distribution<float>(0.0f, 0.2f)(rng);
    const Weights next = StepToward(current, target, max_step);
    const double moved = MaxMove(current, next);
    ASSERT_LE(moved, max_step + 1e-6) << "trial " << trial;
    EXPECT_NEAR(Sum(AsVec(next)), 1.0, 1e-6);
    EXPECT_GE(std::min({next.alpha, next.beta, next.gamma}), 0.0f);
    // Progress: the full bound is used unless the target is closer than that.
    EXPECT_NEAR(moved, std::min<double>(max_step, MaxMove(current, target)), 1e-6);
  }
}

TEST(StepTowardTest, ConvergesOverRepeatedSteps) {
  std::mt19937 rng(29);
  for (int trial = 0; trial < 200; ++trial) {
    Weights w = RandomSimplex(rng);
    const Weights target = RandomSimplex(rng);
    const float max_step = 0.05f;
    const int needed = static_cast<int>(std::ceil(MaxMove(w, target) / max_step)) + 1;
    double distance = MaxMove(w, target);
    for (int i = 0; i < needed; ++i) {
      w = StepToward(w, target, max_step);
      const double d = MaxMove(w, target);
      EXPECT_LE(d, distance + 1e-7);
      distance = d;
    }
    EXPECT_LT(distance, 1e-5) << "trial " << trial;
  }
}

TEST(StepTowardTest, ZeroStepAndNormalisation) {
  const Weights current{0.6f, 0.3f, 0.1f};
  const Weights target{0.1f, 0.1f, 0.8f};
  Weights w = StepToward(current, target, 0.0f);
  EXPECT_FLOAT_EQ(w.alpha, 0.6f);
  EXPECT_FLOAT_EQ(w.beta, 0.3f);
  EXPECT_FLOAT_EQ(w.gamma, 0.1f);
  w = StepToward(current, target, -1.0f);
  EXPECT_FLOAT_EQ(w.alpha, 0.6f);
  w = StepToward(current, target, std::numeric_limits<float>::quiet_NaN());
  EXPECT_FLOAT_EQ(w.alpha, 0.6f);
  // Unnormalised inputs are normalised first: (2, 2, 0) is (0.5, 0.5, 0).
  w = StepToward(Weights{2.0f, 2.0f, 0.0f}, Weights{0.0f, 0.0f, 5.0f}, 1.0f);
  EXPECT_FLOAT_EQ(w.gamma, 1.0f);
  w = StepToward(Weights{2.0f, 2.0f, 0.0f}, Weights{2.0f, 2.0f, 0.0f}, 0.1f);
  EXPECT_FLOAT_EQ(w.alpha, 0.5f);
  EXPECT_FLOAT_EQ(w.beta, 0.5f);
}

TEST(StepTowardTest, DegenerateWeights) {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  // No current policy: take the target.
  Weights w = StepToward(Weights{0, 0, 0}, Weights{0.2f, 0.2f, 0.6f}, 0.01f);
  EXPECT_FLOAT_EQ(w.gamma, 0.6f);
  // No target: stay.
  w = StepToward(Weights{0.2f, 0.2f, 0.6f}, Weights{nan, -1.0f, 0.0f}, 0.5f);
  EXPECT_FLOAT_EQ(w.gamma, 0.6f);
  // Neither: the defaults.
  w = StepToward(Weights{0, 0, 0}, Weights{nan, nan, nan}, 0.5f);
  EXPECT_FLOAT_EQ(w.alpha, Weights{}.alpha);
  EXPECT_FLOAT_EQ(w.beta, Weights{}.beta);
  EXPECT_FLOAT_EQ(w.gamma, Weights{}.gamma);
  // A NaN weight counts as 0.
  w = StepToward(Weights{nan, 0.5f, 0.5f}, Weights{nan, 0.5f, 0.5f}, 0.1f);
  EXPECT_FLOAT_EQ(w.alpha, 0.0f);
  EXPECT_FLOAT_EQ(w.beta, 0.5f);
}

TEST(ScoreCorrelationTest, PerfectAntiAndNone) {
  std::vector<CalibrationSample> samples = Planted({0.5, 0.3, 0.2}, 300, 0.0, 31);
  EXPECT_NEAR(ScoreCorrelation(samples, Weights{0.5f, 0.3f, 0.2f}), 1.0, 1e-6);
  EXPECT_LT(ScoreCorrelation(samples, Weights{0.0f, 0.0f, 1.0f}), 0.9);
  for (CalibrationSample& s : samples) s.observed = 1.0f - s.activity;
  EXPECT_NEAR(ScoreCorrelation(samples, Weights{1.0f, 0.0f, 0.0f}), -1.0, 1e-6);
  // No variance on either side.
  for (CalibrationSample& s : samples) s.observed = 0.25f;
  EXPECT_EQ(ScoreCorrelation(samples, Weights{1.0f, 0.0f, 0.0f}), 0.0);
  samples = Planted({0.5, 0.3, 0.2}, 300, 0.0, 32);
  for (CalibrationSample& s : samples) s.position = 1.0f;
  EXPECT_EQ(ScoreCorrelation(samples, Weights{0.0f, 1.0f, 0.0f}), 0.0);
  EXPECT_EQ(ScoreCorrelation(std::span(samples).first(1), Weights{}), 0.0);
  EXPECT_EQ(ScoreCorrelation({}, Weights{}), 0.0);
}

CalibrationSample Tagged(size_t i) {
  CalibrationSample s;
  s.activity = static_cast<float>(i);  // exact for i < 2^24
  return s;
}

TEST(CalibratorTest, KeepsEverythingUntilCapacityThenStaysAtCapacity) {
  Calibrator c(16, 1);
  for (size_t i = 0; i < 10; ++i) c.Add(Tagged(i));
  EXPECT_EQ(c.size(), 10u);
  EXPECT_EQ(c.seen(), 10u);
  for (size_t i = 0; i < 10; ++i) EXPECT_EQ(c.samples()[i].activity, static_cast<float>(i));
  for (size_t i = 10; i < 1000; ++i) c.Add(Tagged(i));
  EXPECT_EQ(c.size(), 16u);
  EXPECT_EQ(c.seen(), 1000u);
  // Entries are distinct samples from the stream.
  std::vector<float> tags;
  for (const CalibrationSample& s : c.samples()) tags.push_back(s.activity);
  std::sort(tags.begin(), tags.end());
  EXPECT_EQ(std::adjacent_find(tags.begin(), tags.end()), tags.end());
  EXPECT_GE(tags.front(), 0.0f);
  EXPECT_LT(tags.back(), 1000.0f);

  c.Clear();
  EXPECT_EQ(c.size(), 0u);
  EXPECT_EQ(c.seen(), 0u);
  c.Add(Tagged(5));
  EXPECT_EQ(c.size(), 1u);
  EXPECT_EQ(c.seen(), 1u);

  Calibrator empty(0, 1);
  empty.Add(Tagged(1));
  EXPECT_EQ(empty.size(), 0u);
  EXPECT_EQ(empty.seen(), 1u);
}

TEST(CalibratorTest, ReservoirIsRoughlyUniform) {
  constexpr size_t kCapacity = 100;
  constexpr size_t kStream = 1000;
  constexpr int kTrials = 2000;
  constexpr size_t kBuckets = 10;
  std::vector<double> hits(kBuckets, 0);
  for (int trial = 0; trial < kTrials; ++trial) {
    Calibrator c(kCapacity, 1000 + trial);
    for (size_t i = 0; i < kStream; ++i) c.Add(Tagged(i));
    ASSERT_EQ(c.size(), kCapacity);
    for (const CalibrationSample& s : c.samples()) {
      hits[static_cast<size_t>(s.activity) * kBuckets / kStream] += 1;
    }
  }
  // Each bucket of 100 stream positions holds a tenth of the reservoir on average:
  // expected 20000 hits, standard deviation about 135.
  const double expected = double(kTrials) * kCapacity / kBuckets;
  for (size_t b = 0; b < kBuckets; ++b) {
    EXPECT_NEAR(hits[b], expected, 0.04 * expected) << "bucket " << b;
  }
}

}  // namespace
}  // namespace kvcache::importance
