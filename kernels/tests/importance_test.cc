#include "kvcache/kernels/importance.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

#include "test_util.h"

namespace kvcache::kernels {
namespace {

ImportanceParams Params(int64_t sinks, int64_t window, float tau, PositionDecay decay) {
  ImportanceParams p;
  p.sink_tokens = sinks;
  p.recent_window = window;
  p.decay_tau = tau;
  p.decay = decay;
  return p;
}

TEST(ImportanceTest, DefaultsAreTheDesignWeights) {
  const ImportanceParams p;
  EXPECT_FLOAT_EQ(p.alpha, 0.6f);
  EXPECT_FLOAT_EQ(p.beta, 0.3f);
  EXPECT_FLOAT_EQ(p.gamma, 0.1f);
  EXPECT_TRUE(p.Valid());
}

TEST(ImportanceTest, PositionFactorExponential) {
  const ImportanceParams p = Params(2, 3, 4.0f, PositionDecay::kExponential);
  const int64_t n = 10;  // Sinks 0-1, window 7-9, decaying 2-6 with d = 7 - t.
  EXPECT_EQ(PositionFactor(0, n, p), 1.0f);
  EXPECT_EQ(PositionFactor(1, n, p), 1.0f);
  for (int64_t t = 2; t < 7; ++t) {
    EXPECT_FLOAT_EQ(PositionFactor(t, n, p), std::exp(-(7.0f - t) / 4.0f)) << t;
  }
  for (int64_t t = 7; t < 10; ++t) EXPECT_EQ(PositionFactor(t, n, p), 1.0f);
  EXPECT_EQ(PositionFactor(-1, n, p), 0.0f);
  EXPECT_EQ(PositionFactor(10, n, p), 0.0f);
  // Monotone: older tokens (outside sinks) never score higher.
  for (int64_t t = 3; t < 7; ++t) EXPECT_GT(PositionFactor(t, n, p), PositionFactor(t - 1, n, p));
}

TEST(ImportanceTest, PositionFactorHyperbolic) {
  const ImportanceParams p = Params(0, 1, 2.0f, PositionDecay::kHyperbolic);
  const int64_t n = 6;  // Window is token 5; d = 5 - t.
  for (int64_t t = 0; t < 5; ++t) {
    EXPECT_FLOAT_EQ(PositionFactor(t, n, p), 1.0f / (1.0f + (5.0f - t) / 2.0f)) << t;
  }
  EXPECT_EQ(PositionFactor(5, n, p), 1.0f);
}

TEST(ImportanceTest, WindowLongerThanSequenceCoversEverything) {
  const ImportanceParams p = Params(0, 100, 1.0f, PositionDecay::kExponential);
  for (int64_t t = 0; t < 10; ++t) EXPECT_EQ(PositionFactor(t, 10, p), 1.0f);
}

TEST(ImportanceTest, ScoreIsTheWeightedSum) {
  ImportanceParams p = Params(1, 2, 3.0f, PositionDecay::kExponential);
  p.alpha = 0.5f;
  p.beta = 0.25f;
  p.gamma = 2.0f;
  const int64_t n = 50;
  const std::vector<float> attention = test::Uniform(n, 1, 0.0f, 1.0f);
  const std::vector<float> novelty = test::Uniform(n, 2, 0.0f, 2.0f);
  std::vector<float> scores(n);
  ASSERT_EQ(ImportanceScoresCpu(attention.data(), novelty.data(), n, p, scores.data()),
            KernelStatus::kOk);
  for (int64_t t = 0; t < n; ++t) {
    const float want = 0.5f * attention[t] + 0.25f * PositionFactor(t, n, p) + 2.0f * novelty[t];
    EXPECT_FLOAT_EQ(scores[t], want) << t;
  }
  // Missing inputs count as zero.
  ASSERT_EQ(ImportanceScoresCpu(nullptr, nullptr, n, p, scores.data()), KernelStatus::kOk);
  for (int64_t t = 0; t < n; ++t) EXPECT_FLOAT_EQ(scores[t], 0.25f * PositionFactor(t, n, p));
}

TEST(ImportanceTest, InvalidParamsAreRejected) {
  std::vector<float> scores(4, 7.0f);
  const auto rejects = [&](const ImportanceParams& p) {
    EXPECT_FALSE(p.Valid());
    EXPECT_EQ(ImportanceScoresCpu(nullptr, nullptr, 4, p, scores.data()),
              KernelStatus::kInvalidArgument);
  };
  ImportanceParams p;
  p.alpha = -0.1f;
  rejects(p);
  p = ImportanceParams();
  p.gamma = std::numeric_limits<float>::quiet_NaN();
  rejects(p);
  p = ImportanceParams();
  p.decay_tau = 0.0f;
  rejects(p);
  p = ImportanceParams();
  p.recent_window = -1;
  rejects(p);
  p = ImportanceParams();
  p.decay = static_cast<PositionDecay>(5);
  rejects(p);
  EXPECT_EQ(scores, std::vector<float>(4, 7.0f));
  EXPECT_EQ(ImportanceScoresCpu(nullptr, nullptr, 4, ImportanceParams(), nullptr),
            KernelStatus::kInvalidArgument);
  EXPECT_EQ(ImportanceScoresCpu(nullptr, nullptr, 0, ImportanceParams(), nullptr),
            KernelStatus::kOk);
}

}  // namespace
}  // namespace kvcache::kernels
