#include "kvcache/kernels/novelty.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <vector>

#include "test_util.h"

namespace kvcache::kernels {
namespace {

// Keys [heads][tokens][dim] for one head from a list of token vectors.
std::vector<float> Keys(const std::vector<std::vector<float>>& tokens) {
  std::vector<float> out;
  for (const auto& t : tokens) out.insert(out.end(), t.begin(), t.end());
  return out;
}

std::vector<float> Novelty(const std::vector<float>& keys, int64_t heads, int64_t tokens,
                           int64_t dim, DType dtype = DType::kFloat32) {
  const std::vector<uint8_t> bytes = test::Encode(keys, dtype);
  std::vector<float> out(static_cast<size_t>(tokens), -1.0f);
  EXPECT_EQ(KeyNoveltyCpu(bytes.data(), dtype, heads, tokens, dim, out.data()), KernelStatus::kOk);
  return out;
}

// The novelty.h formula in fp64.
std::vector<double> NaiveNovelty(const std::vector<float>& k, int64_t heads, int64_t tokens,
                                 int64_t dim) {
  std::vector<double> out(static_cast<size_t>(tokens), 0.0);
  out[0] = 1.0;
  for (int64_t t = 1; t < tokens; ++t) {
    for (int64_t h = 0; h < heads; ++h) {
      double dot = 0, na = 0, nb = 0;
      for (int64_t d = 0; d < dim; ++d) {
        const double a = k[(h * tokens + t - 1) * dim + d], b = k[(h * tokens + t) * dim + d];
        dot += a * b;
        na += a * a;
        nb += b * b;
      }
      out[t] += (na > 0 && nb > 0) ? 1.0 - dot / std::sqrt(na * nb) : 1.0;
    }
    out[t] /= static_cast<double>(heads);
  }
  return out;
}

TEST(NoveltyTest, FirstTokenIsOneAndIdenticalKeysAreExactlyZero) {
  for (DType dtype : {DType::kFloat32, DType::kFloat16, DType::kBFloat16}) {
    SCOPED_TRACE(DTypeName(dtype));
    const std::vector<float> v = test::Gaussian(128, 1);
    const std::vector<float> n = Novelty(Keys({v, v, v}), 1, 3, 128, dtype);
    EXPECT_EQ(n[0], 1.0f);
    EXPECT_EQ(n[1], 0.0f);
    EXPECT_EQ(n[2], 0.0f);
  }
}

TEST(NoveltyTest, OrthogonalIsOneOppositeIsTwoScaledIsZero) {
  const std::vector<float> e0 = {1, 0, 0, 0}, e1 = {0, 2, 0, 0}, m1 = {0, -5, 0, 0};
  const std::vector<float> s1 = {0, 7, 0, 0};
  const std::vector<float> n = Novelty(Keys({e0, e1, m1, s1, s1}), 1, 5, 4);
  EXPECT_FLOAT_EQ(n[1], 1.0f);
  EXPECT_FLOAT_EQ(n[2], 2.0f);
  EXPECT_FLOAT_EQ(n[3], 2.0f);
  EXPECT_EQ(n[4], 0.0f);
}

TEST(NoveltyTest, AveragesOverHeads) {
  // Head 0 repeats its key (0), head 1 turns by 90 degrees (1): mean 0.5.
  const std::vector<float> keys = {1, 0, 1, 0, /* head 1: */ 1, 0, 0, 1};
  const std::vector<float> n = Novelty(keys, 2, 2, 2);
  EXPECT_FLOAT_EQ(n[1], 0.5f);
}

TEST(NoveltyTest, ZeroKeyCountsAsOrthogonal) {
  const std::vector<float> n = Novelty(Keys({{0, 0, 0}, {1, 2, 3}, {0, 0, 0}}), 1, 3, 3);
  EXPECT_EQ(n[1], 1.0f);
  EXPECT_EQ(n[2], 1.0f);
}

TEST(NoveltyTest, MatchesDoublePrecisionOnRandomKeys) {
  const int64_t heads = 8, tokens = 65, dim = 100;
  // Correlated neighbours, as in real KV: k[t] = k[t-1] + noise.
  std::vector<float> keys = test::Gaussian(static_cast<size_t>(heads * tokens * dim), 4);
  const std::vector<float> noise = test::Gaussian(keys.size(), 5, 0.3f);
  for (int64_t h = 0; h < heads; ++h) {
    for (int64_t t = 1; t < tokens; ++t) {
      for (int64_t d = 0; d < dim; ++d) {
        const size_t i = static_cast<size_t>((h * tokens + t) * dim + d);
        keys[i] = keys[i - dim] + noise[i];
      }
    }
  }
  const std::vector<float> got = Novelty(keys, heads, tokens, dim);
  const std::vector<double> want = NaiveNovelty(keys, heads, tokens, dim);
  for (int64_t t = 0; t < tokens; ++t) {
    EXPECT_NEAR(got[t], want[t], 1e-5) << t;
    EXPECT_GE(got[t], 0.0f);
    EXPECT_LE(got[t], 2.0f);
  }
}

TEST(NoveltyTest, ArgumentChecks) {
  float out[2] = {5, 5};
  const float keys[4] = {1, 2, 3, 4};
  EXPECT_EQ(KeyNoveltyCpu(keys, DType::kInt8, 1, 2, 2, out), KernelStatus::kInvalidArgument);
  EXPECT_EQ(KeyNoveltyCpu(nullptr, DType::kFloat32, 1, 2, 2, out), KernelStatus::kInvalidArgument);
  EXPECT_EQ(KeyNoveltyCpu(keys, DType::kFloat32, 1, 2, 2, nullptr), KernelStatus::kInvalidArgument);
  EXPECT_EQ(KeyNoveltyCpu(keys, DType::kFloat32, 1, -2, 2, out), KernelStatus::kInvalidArgument);
  EXPECT_EQ(out[0], 5.0f);
  EXPECT_EQ(KeyNoveltyCpu(nullptr, DType::kFloat32, 0, 2, 2, nullptr), KernelStatus::kOk);
  EXPECT_EQ(KeyNoveltyCpu(keys, DType::kFloat32, 1, 1, 4, out), KernelStatus::kOk);
  EXPECT_EQ(out[0], 1.0f);
}

}  // namespace
}  // namespace kvcache::kernels
