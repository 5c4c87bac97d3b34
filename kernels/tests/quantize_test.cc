#include "kvcache/kernels/quantize.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>
#include <tuple>
#include <vector>

#include "kvcache/kernels/convert.h"
#include "test_util.h"

namespace kvcache::kernels {
namespace {

struct Shape {
  int64_t heads, tokens, dim;
  size_t Elements() const { return static_cast<size_t>(heads * tokens * dim); }
};

// Scale index of element (h, t, d) under `axis` (quantize.h).
int64_t GroupOf(const Shape& s, QuantAxis axis, int64_t h, int64_t t, int64_t d) {
  return axis == QuantAxis::kPerToken ? h * s.tokens + t : h * s.dim + d;
}

struct Quantized {
  std::vector<int8_t> codes;
  std::vector<float> scales;
};

// The quantize.h formula written the obvious way, one element at a time.
Quantized NaiveQuantize(const std::vector<float>& x, const Shape& s, QuantAxis axis) {
  Quantized out;
  out.codes.resize(s.Elements());
  std::vector<float> amax(static_cast<size_t>(Int8ScaleCount(axis, s.heads, s.tokens, s.dim)));
  for (int64_t h = 0; h < s.heads; ++h) {
    for (int64_t t = 0; t < s.tokens; ++t) {
      for (int64_t d = 0; d < s.dim; ++d) {
        float& a = amax[GroupOf(s, axis, h, t, d)];
        a = std::max(a, std::fabs(x[(h * s.tokens + t) * s.dim + d]));
      }
    }
  }
  for (float a : amax) out.scales.push_back(a / 127.0f);
  for (int64_t h = 0; h < s.heads; ++h) {
    for (int64_t t = 0; t < s.tokens; ++t) {
      for (int64_t d = 0; d < s.dim; ++d) {
        const float a = amax[GroupOf(s, axis, h, t, d)];
        const float inv = a > 0.0f ? 127.0f / a : 0.0f;
        const size_t i = static_cast<size_t>((h * s.tokens + t) * s.dim + d);
        const float p = x[i] * inv;  // NaN (0 * inf in a tiny group) clamps to -127.
        const float v = std::isnan(p) ? -127.0f : std::clamp(p, -127.0f, 127.0f);
        out.codes[i] = static_cast<int8_t>(std::nearbyint(v));
      }
    }
  }
  return out;
}

class QuantizeTest : public ::testing::TestWithParam<std::tuple<DType, QuantAxis>> {
 protected:
  DType dtype() const { return std::get<0>(GetParam()); }
  QuantAxis axis() const { return std::get<1>(GetParam()); }

  // Quantizes `values` (first rounded to dtype()) and dequantizes back to dtype().
  void RoundTrip(const std::vector<float>& values, const Shape& s, Quantized* q,
                 std::vector<float>* restored) {
    const std::vector<uint8_t> src = test::Encode(values, dtype());
    q->codes.assign(s.Elements(), 0);
    q->scales.assign(static_cast<size_t>(Int8ScaleCount(axis(), s.heads, s.tokens, s.dim)), -1);
    ASSERT_EQ(QuantizeInt8Cpu(src.data(), dtype(), s.heads, s.tokens, s.dim, axis(),
                              q->codes.data(), q->scales.data()),
              KernelStatus::kOk);
    std::vector<uint8_t> out(src.size());
    ASSERT_EQ(DequantizeInt8Cpu(q->codes.data(), q->scales.data(), s.heads, s.tokens, s.dim, axis(),
                                dtype(), out.data()),
              KernelStatus::kOk);
    *restored = test::Decode(out, dtype());
  }
};

TEST_P(QuantizeTest, MatchesNaiveFormulaBitForBit) {
  // Shapes cover the SIMD main loops, tails, one element, and more than one 256-wide tile.
  for (const Shape& s :
       {Shape{8, 64, 128}, Shape{3, 17, 300}, Shape{1, 1, 1}, Shape{2, 5, 7}, Shape{1, 300, 9},
        Shape{2, 9, 64}, Shape{2, 8, 80}, Shape{1, 16, 200}, Shape{2, 11, 257}}) {
    SCOPED_TRACE(::testing::Message() << s.heads << "x" << s.tokens << "x" << s.dim);
    const std::vector<float> x = test::RoundTo(test::Gaussian(s.Elements(), 7, 3.0f), dtype());
    Quantized got;
    std::vector<float> restored;
    RoundTrip(x, s, &got, &restored);
    const Quantized want = NaiveQuantize(x, s, axis());
    EXPECT_EQ(got.codes, want.codes);
    EXPECT_EQ(got.scales, want.scales);
    for (size_t i = 0; i < x.size(); ++i) {
      const int64_t t = static_cast<int64_t>(i) / s.dim % s.tokens;
      const int64_t h = static_cast<int64_t>(i) / (s.dim * s.tokens);
      const int64_t d = static_cast<int64_t>(i) % s.dim;
      const float scale = want.scales[GroupOf(s, axis(), h, t, d)];
      const float expected = test::RoundTo({static_cast<float>(want.codes[i]) * scale}, dtype())[0];
      ASSERT_EQ(restored[i], expected) << "element " << i;
    }
  }
}

TEST_P(QuantizeTest, ErrorWithinDocumentedBoundAndRmseBelowOnePercent) {
  const Shape s{8, 64, 128};
  const std::vector<float> x = test::RoundTo(test::Gaussian(s.Elements(), 11), dtype());
  Quantized q;
  std::vector<float> restored;
  RoundTrip(x, s, &q, &restored);
  const double u = test::UnitRoundoff(dtype());
  const double eta = dtype() == DType::kFloat16 ? std::ldexp(1.0, -25) : 0.0;
  for (size_t i = 0; i < x.size(); ++i) {
    const int64_t t = static_cast<int64_t>(i) / s.dim % s.tokens;
    const int64_t h = static_cast<int64_t>(i) / (s.dim * s.tokens);
    const int64_t d = static_cast<int64_t>(i) % s.dim;
    const double scale = q.scales[GroupOf(s, axis(), h, t, d)];
    const double bound = scale * (0.5 + std::ldexp(1.0, -15)) + std::fabs(restored[i]) * u + eta;
    ASSERT_LE(std::fabs(static_cast<double>(restored[i]) - x[i]), bound) << "element " << i;
    ASSERT_GE(q.codes[i], -127);
  }
  const double rmse = test::RelativeRmse(x, restored);
  EXPECT_LE(rmse, 0.01);
  RecordProperty("relative_rmse", std::to_string(rmse));
}

TEST_P(QuantizeTest, RoundTripIsExactOnRepresentableValues) {
  // Every group holds k * 2^e with |k| <= 127 and one |k| == 127: exactly representable.
  const Shape s{4, 24, 40};
  std::vector<float> x(s.Elements());
  const std::vector<float> r = test::Uniform(s.Elements(), 5, -127.0f, 127.0f);
  for (int64_t h = 0; h < s.heads; ++h) {
    for (int64_t t = 0; t < s.tokens; ++t) {
      for (int64_t d = 0; d < s.dim; ++d) {
        const int64_t g = GroupOf(s, axis(), h, t, d);
        const size_t i = static_cast<size_t>((h * s.tokens + t) * s.dim + d);
        const bool pinned = axis() == QuantAxis::kPerToken ? d == g % s.dim : t == g % s.tokens;
        const float k = pinned ? (g % 2 == 0 ? 127.0f : -127.0f) : std::nearbyint(r[i]);
        x[i] = std::ldexp(k, static_cast<int>(g % 9) - 6);
      }
    }
  }
  Quantized q;
  std::vector<float> restored;
  RoundTrip(x, s, &q, &restored);
  EXPECT_EQ(restored, x);
}

// Groups whose maximum is below 127 / FLT_MAX (subnormal fp32 / bf16) have an infinite inverse
// scale, so x * inv is +-inf (or NaN for a zero) and the clamp decides: +-127 (-127 for NaN).
// (The SIMD loops used to turn +inf into -127.)
TEST_P(QuantizeTest, TinyGroupsFollowTheClampedFormula) {
  const Shape s{2, 16, 128};
  std::vector<float> x = test::Gaussian(s.Elements(), 17);
  for (size_t i = 0; i < x.size(); ++i) {
    const int64_t t = static_cast<int64_t>(i) / s.dim % s.tokens;
    const int64_t d = static_cast<int64_t>(i) % s.dim;
    if (t % 2 == 0 || d % 3 == 0) x[i] = std::ldexp(x[i], -132);
  }
  x = test::RoundTo(x, dtype());
  Quantized got;
  std::vector<float> restored;
  RoundTrip(x, s, &got, &restored);
  const Quantized want = NaiveQuantize(x, s, axis());
  EXPECT_EQ(got.codes, want.codes);
  EXPECT_EQ(got.scales, want.scales);
}

TEST_P(QuantizeTest, ZeroGroupsGetZeroScaleAndCodes) {
  const Shape s{2, 8, 16};
  std::vector<float> x = test::Gaussian(s.Elements(), 3);
  std::fill(x.begin(), x.begin() + static_cast<int64_t>(s.tokens * s.dim), 0.0f);  // Head 0.
  Quantized q;
  std::vector<float> restored;
  RoundTrip(x, s, &q, &restored);
  const size_t groups_in_head0 = q.scales.size() / 2;
  for (size_t g = 0; g < groups_in_head0; ++g) EXPECT_EQ(q.scales[g], 0.0f);
  for (int64_t i = 0; i < s.tokens * s.dim; ++i) {
    EXPECT_EQ(q.codes[i], 0);
    EXPECT_EQ(restored[i], 0.0f);
  }
}

std::string ParamName(const ::testing::TestParamInfo<std::tuple<DType, QuantAxis>>& info) {
  return std::string(DTypeName(std::get<0>(info.param))) +
         (std::get<1>(info.param) == QuantAxis::kPerToken ? "_per_token" : "_per_channel");
}

INSTANTIATE_TEST_SUITE_P(
    AllDTypesAndAxes, QuantizeTest,
    ::testing::Combine(::testing::Values(DType::kFloat32, DType::kFloat16, DType::kBFloat16),
                       ::testing::Values(QuantAxis::kPerChannel, QuantAxis::kPerToken)),
    ParamName);

TEST(QuantizeArgsTest, ScaleCountFollowsAxis) {
  EXPECT_EQ(Int8ScaleCount(QuantAxis::kPerChannel, 8, 64, 128), 8 * 128);
  EXPECT_EQ(Int8ScaleCount(QuantAxis::kPerToken, 8, 64, 128), 8 * 64);
  EXPECT_EQ(Int8ScaleCount(QuantAxis::kPerToken, -1, 64, 128), -1);
  EXPECT_EQ(Int8ScaleCount(static_cast<QuantAxis>(7), 1, 1, 1), -1);
}

TEST(QuantizeArgsTest, RejectsInvalidArgumentsWithoutWriting) {
  std::vector<float> x(64, 1.0f);
  std::vector<int8_t> codes(64, 5);
  std::vector<float> scales(64, 5.0f);
  const auto quantize = [&](const void* src, DType dtype, int64_t heads, QuantAxis axis,
                            int8_t* dst, float* sc) {
    return QuantizeInt8Cpu(src, dtype, heads, 8, 8, axis, dst, sc);
  };
  const QuantAxis kTok = QuantAxis::kPerToken;
  EXPECT_EQ(quantize(nullptr, DType::kFloat32, 1, kTok, codes.data(), scales.data()),
            KernelStatus::kInvalidArgument);
  EXPECT_EQ(quantize(x.data(), DType::kFloat32, 1, kTok, nullptr, scales.data()),
            KernelStatus::kInvalidArgument);
  EXPECT_EQ(quantize(x.data(), DType::kFloat32, 1, kTok, codes.data(), nullptr),
            KernelStatus::kInvalidArgument);
  EXPECT_EQ(quantize(x.data(), DType::kInt8, 1, kTok, codes.data(), scales.data()),
            KernelStatus::kInvalidArgument);
  EXPECT_EQ(quantize(x.data(), DType::kFloat32, -1, kTok, codes.data(), scales.data()),
            KernelStatus::kInvalidArgument);
  EXPECT_EQ(quantize(x.data(), DType::kFloat32, 1, static_cast<QuantAxis>(9), codes.data(),
                     scales.data()),
            KernelStatus::kInvalidArgument);
  EXPECT_EQ(QuantizeInt8Cpu(x.data(), DType::kFloat32, kMaxDimension, kMaxDimension, 8, kTok,
                            codes.data(), scales.data()),
            KernelStatus::kInvalidArgument);
  EXPECT_EQ(DequantizeInt8Cpu(codes.data(), scales.data(), 1, 8, 8, kTok, DType::kInt8, x.data()),
            KernelStatus::kInvalidArgument);
  EXPECT_EQ(DequantizeInt8Cpu(codes.data(), nullptr, 1, 8, 8, kTok, DType::kFloat32, x.data()),
            KernelStatus::kInvalidArgument);
  EXPECT_EQ(codes, std::vector<int8_t>(64, 5));
  EXPECT_EQ(scales, std::vector<float>(64, 5.0f));
  EXPECT_EQ(x, std::vector<float>(64, 1.0f));
}

TEST(QuantizeArgsTest, EmptyShapeIsANoOp) {
  EXPECT_EQ(QuantizeInt8Cpu(nullptr, DType::kFloat16, 4, 0, 128, QuantAxis::kPerChannel, nullptr,
                            nullptr),
            KernelStatus::kOk);
  EXPECT_EQ(DequantizeInt8Cpu(nullptr, nullptr, 0, 16, 128, QuantAxis::kPerToken, DType::kFloat16,
                              nullptr),
            KernelStatus::kOk);
}

// Why keys are quantized per channel (KIVI): keys have outlier channels, and a per-token scale
// would spend its range on the outlier, flattening every other channel of the token.
TEST(QuantizeArgsTest, PerChannelBeatsPerTokenOnOutlierChannels) {
  const Shape s{1, 64, 128};
  std::vector<float> keys = test::Gaussian(s.Elements(), 21);
  for (int64_t t = 0; t < s.tokens; ++t) keys[t * s.dim + 5] *= 30.0f;  // Outlier channel 5.
  double rmse[2];
  for (QuantAxis axis : {QuantAxis::kPerChannel, QuantAxis::kPerToken}) {
    std::vector<int8_t> codes(s.Elements());
    std::vector<float> scales(static_cast<size_t>(Int8ScaleCount(axis, s.heads, s.tokens, s.dim)));
    std::vector<float> restored(s.Elements());
    ASSERT_EQ(QuantizeInt8Cpu(keys.data(), DType::kFloat32, s.heads, s.tokens, s.dim, axis,
                              codes.data(), scales.data()),
              KernelStatus::kOk);
    ASSERT_EQ(DequantizeInt8Cpu(codes.data(), scales.data(), s.heads, s.tokens, s.dim, axis,
                                DType::kFloat32, restored.data()),
              KernelStatus::kOk);
    // Error over the ordinary channels only.
    double err = 0, norm = 0;
    for (size_t i = 0; i < keys.size(); ++i) {
      if (i % s.dim == 5) continue;
      err += (restored[i] - keys[i]) * (restored[i] - keys[i]);
      norm += keys[i] * keys[i];
    }
    rmse[static_cast<int>(axis)] = std::sqrt(err / norm);
  }
  EXPECT_LT(rmse[0] * 4, rmse[1]);
}

}  // namespace
}  // namespace kvcache::kernels
