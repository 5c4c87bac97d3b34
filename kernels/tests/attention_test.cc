#include "kvcache/kernels/attention.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#include "test_util.h"

namespace kvcache::kernels {
namespace {

struct Naive {
  std::vector<double> out, weights;
};

// softmax(q K^T / sqrt(d)) V in fp64, straight from the definition.
Naive NaiveAttention(const std::vector<float>& q, const std::vector<float>& k,
                     const std::vector<float>& v, int64_t nq, int64_t nk, int64_t d) {
  Naive r;
  r.out.assign(nq * d, 0.0);
  r.weights.assign(nq * nk, 0.0);
  for (int64_t i = 0; i < nq; ++i) {
    std::vector<double> s(nk);
    for (int64_t j = 0; j < nk; ++j) {
      for (int64_t c = 0; c < d; ++c) s[j] += static_cast<double>(q[i * d + c]) * k[j * d + c];
      s[j] /= std::sqrt(static_cast<double>(d));
    }
    const double m = *std::max_element(s.begin(), s.end());
    double sum = 0;
    for (double& x : s) sum += (x = std::exp(x - m));
    for (int64_t j = 0; j < nk; ++j) {
      r.weights[i * nk + j] = s[j] / sum;
      for (int64_t c = 0; c < d; ++c) r.out[i * d + c] += s[j] / sum * v[j * d + c];
    }
  }
  return r;
}

TEST(AttentionTest, MatchesDoublePrecision) {
  for (int64_t d : {1, 7, 64, 128}) {
    const int64_t nq = 5, nk = 300;
    const std::vector<float> q = test::Gaussian(nq * d, 1, 1.5f), k = test::Gaussian(nk * d, 2),
                             v = test::Gaussian(nk * d, 3);
    std::vector<float> out(nq * d), weights(nq * nk);
    ASSERT_EQ(
        ReferenceAttentionCpu(q.data(), k.data(), v.data(), nq, nk, d, out.data(), weights.data()),
        KernelStatus::kOk);
    const Naive want = NaiveAttention(q, k, v, nq, nk, d);
    for (size_t i = 0; i < out.size(); ++i) EXPECT_NEAR(out[i], want.out[i], 1e-5) << d;
    for (int64_t i = 0; i < nq; ++i) {
      double row = 0;
      for (int64_t j = 0; j < nk; ++j) {
        const double w = weights[i * nk + j], w0 = want.weights[i * nk + j];
        EXPECT_NEAR(w, w0, 1e-5 * w0 + 1e-9);
        row += w;
      }
      EXPECT_NEAR(row, 1.0, 1e-5);
    }
    // Without the weights buffer the output is the same.
    std::vector<float> out2(nq * d);
    ASSERT_EQ(ReferenceAttentionCpu(q.data(), k.data(), v.data(), nq, nk, d, out2.data(), nullptr),
              KernelStatus::kOk);
    EXPECT_EQ(out, out2);
  }
}

TEST(AttentionTest, SingleKeyReturnsItsValueAndLargeScoresDoNotOverflow) {
  const int64_t d = 16;
  std::vector<float> q = test::Gaussian(d, 4, 1000.0f), k = test::Gaussian(2 * d, 5, 1000.0f);
  const std::vector<float> v = test::Gaussian(2 * d, 6);
  std::vector<float> out(d), weights(2);
  ASSERT_EQ(
      ReferenceAttentionCpu(q.data(), k.data(), v.data(), 1, 1, d, out.data(), weights.data()),
      KernelStatus::kOk);
  EXPECT_EQ(weights[0], 1.0f);
  for (int64_t c = 0; c < d; ++c) EXPECT_EQ(out[c], v[c]);
  // Scores ~1e6 apart: one key takes all the weight, no NaN or Inf.
  ASSERT_EQ(
      ReferenceAttentionCpu(q.data(), k.data(), v.data(), 1, 2, d, out.data(), weights.data()),
      KernelStatus::kOk);
  EXPECT_TRUE(std::isfinite(weights[0]) && std::isfinite(weights[1]));
  EXPECT_FLOAT_EQ(weights[0] + weights[1], 1.0f);
}

TEST(AttentionTest, ArgumentChecks) {
  const float x[4] = {1, 2, 3, 4};
  float out[4] = {9, 9, 9, 9};
  EXPECT_EQ(ReferenceAttentionCpu(x, x, x, 1, 0, 4, out, nullptr), KernelStatus::kInvalidArgument);
  EXPECT_EQ(ReferenceAttentionCpu(x, x, x, 1, 1, 0, out, nullptr), KernelStatus::kInvalidArgument);
  EXPECT_EQ(ReferenceAttentionCpu(x, nullptr, x, 1, 1, 4, out, nullptr),
            KernelStatus::kInvalidArgument);
  EXPECT_EQ(ReferenceAttentionCpu(x, x, x, 1, 1, 4, nullptr, nullptr),
            KernelStatus::kInvalidArgument);
  EXPECT_EQ(out[0], 9.0f);
  EXPECT_EQ(ReferenceAttentionCpu(nullptr, nullptr, nullptr, 0, 0, 0, nullptr, nullptr),
            KernelStatus::kOk);
}

}  // namespace
}  // namespace kvcache::kernels
