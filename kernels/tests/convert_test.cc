#include "kvcache/kernels/convert.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

#include "test_util.h"

namespace kvcache::kernels {
namespace {

uint32_t Bits(float f) {
  uint32_t b;
  std::memcpy(&b, &f, sizeof b);
  return b;
}

// binary16 decoded with ldexp: the definition, not a trick.
double DecodeHalfSlow(uint16_t h) {
  const int sign = (h >> 15) ? -1 : 1;
  const int exponent = (h >> 10) & 0x1F;
  const int mantissa = h & 0x3FF;
  if (exponent == 0) return sign * std::ldexp(mantissa, -24);
  if (exponent == 31) return mantissa ? NAN : sign * INFINITY;
  return sign * std::ldexp(1024 + mantissa, exponent - 25);
}

// Nearest representable value of a format, ties to the even encoding, by search over the two
// neighbours of the truncated encoding. `decode` maps an encoding to its value.
template <typename Decode>
uint16_t RoundSlow(float f, uint16_t truncated, Decode decode) {
  const uint16_t up = static_cast<uint16_t>(truncated + 1);
  const double lo = decode(truncated), hi = decode(up);
  const double dl = std::fabs(f - lo), dh = std::fabs(f - hi);
  if (dl < dh) return truncated;
  if (dh < dl) return up;
  return (truncated & 1) ? up : truncated;
}

// Encoding of the binary16 value of largest magnitude <= |f|, with the sign of f.
uint16_t TruncatedHalf(float f) {
  uint16_t lo = 0, hi = 0x7C00;  // Decodes to 0 and +Inf.
  while (hi - lo > 1) {
    const uint16_t mid = static_cast<uint16_t>((lo + hi) / 2);
    (DecodeHalfSlow(mid) <= std::fabs(f) ? lo : hi) = mid;
  }
  return static_cast<uint16_t>(lo | (std::signbit(f) ? 0x8000 : 0));
}

TEST(ConvertTest, HalfToFloatIsExactForAllEncodings) {
  for (uint32_t h = 0; h <= 0xFFFF; ++h) {
    const float got = HalfBitsToFloat(static_cast<uint16_t>(h));
    const double want = DecodeHalfSlow(static_cast<uint16_t>(h));
    if (std::isnan(want)) {
      EXPECT_TRUE(std::isnan(got)) << h;
    } else {
      ASSERT_EQ(got, want) << "half bits " << h;
      ASSERT_EQ(std::signbit(got), (h & 0x8000) != 0) << h;
    }
  }
}

TEST(ConvertTest, HalfRoundTripsThroughFloat) {
  for (uint32_t h = 0; h <= 0xFFFF; ++h) {
    const float f = HalfBitsToFloat(static_cast<uint16_t>(h));
    if (std::isnan(f)) {
      EXPECT_TRUE(std::isnan(HalfBitsToFloat(FloatToHalfBits(f))));
    } else {
      ASSERT_EQ(FloatToHalfBits(f), h);
    }
  }
}

TEST(ConvertTest, FloatToHalfRoundsToNearestEven) {
  EXPECT_EQ(FloatToHalfBits(1.0f), 0x3C00);
  EXPECT_EQ(FloatToHalfBits(-2.0f), 0xC000);
  EXPECT_EQ(FloatToHalfBits(65504.0f), 0x7BFF);   // Largest finite.
  EXPECT_EQ(FloatToHalfBits(65519.99f), 0x7BFF);  // Just below the overflow tie.
  EXPECT_EQ(FloatToHalfBits(65520.0f), 0x7C00);   // Tie rounds to even: +Inf.
  EXPECT_EQ(FloatToHalfBits(1e10f), 0x7C00);
  EXPECT_EQ(FloatToHalfBits(-INFINITY), 0xFC00);
  EXPECT_EQ(FloatToHalfBits(std::ldexp(1.0f, -24)), 0x0001);         // Smallest subnormal.
  EXPECT_EQ(FloatToHalfBits(std::ldexp(1.0f, -25)), 0x0000);         // Tie to even: 0.
  EXPECT_EQ(FloatToHalfBits(std::ldexp(3.0f, -25)), 0x0002);         // Tie to even: 2.
  EXPECT_EQ(FloatToHalfBits(1.0f + std::ldexp(1.0f, -11)), 0x3C00);  // Tie down.
  EXPECT_EQ(FloatToHalfBits(1.0f + std::ldexp(3.0f, -11)), 0x3C02);  // Tie up.
  EXPECT_EQ(FloatToHalfBits(-0.0f), 0x8000);
  EXPECT_TRUE(std::isnan(HalfBitsToFloat(FloatToHalfBits(NAN))));
  // Random floats against the slow rounding, across the whole binary16 range.
  std::mt19937 rng(17);
  std::uniform_real_distribution<float> mantissa(1.0f, 2.0f);
  std::uniform_int_distribution<int> exponent(-26, 15);
  for (int i = 0; i < 20000; ++i) {
    const float f = std::ldexp(mantissa(rng), exponent(rng)) * (i % 2 ? -1.0f : 1.0f);
    if (std::fabs(f) >= 65504.0f) continue;
    ASSERT_EQ(FloatToHalfBits(f), RoundSlow(f, TruncatedHalf(f), DecodeHalfSlow)) << f;
  }
}

TEST(ConvertTest, BFloat16RoundsToNearestEven) {
  const auto decode = [](uint16_t b) { return static_cast<double>(BFloat16BitsToFloat(b)); };
  EXPECT_EQ(FloatToBFloat16Bits(1.0f), 0x3F80);
  EXPECT_EQ(BFloat16BitsToFloat(0x3F80), 1.0f);
  EXPECT_EQ(FloatToBFloat16Bits(1.0f + std::ldexp(1.0f, -8)), 0x3F80);  // Tie down.
  EXPECT_EQ(FloatToBFloat16Bits(1.0f + std::ldexp(3.0f, -8)), 0x3F82);  // Tie up.
  EXPECT_EQ(FloatToBFloat16Bits(3.4e38f), 0x7F80);                      // Overflow to Inf.
  EXPECT_TRUE(std::isnan(BFloat16BitsToFloat(FloatToBFloat16Bits(NAN))));
  for (float f : test::Gaussian(20000, 23, 1000.0f)) {
    const uint16_t truncated = static_cast<uint16_t>(Bits(f) >> 16);
    ASSERT_EQ(FloatToBFloat16Bits(f), RoundSlow(f, truncated, decode)) << f;
  }
}

TEST(ConvertTest, ArraysMatchScalarsForEveryPairAndLength) {
  const DType kTypes[] = {DType::kFloat32, DType::kFloat16, DType::kBFloat16};
  for (int n = 0; n <= 37; ++n) {
    std::vector<float> x = test::Gaussian(static_cast<size_t>(n), 100 + n, 50.0f);
    if (n > 3) x[3] = std::ldexp(1.5f, -20);  // A binary16 subnormal.
    for (DType from : kTypes) {
      const std::vector<uint8_t> src = test::Encode(x, from);
      for (DType to : kTypes) {
        std::vector<uint8_t> dst(static_cast<size_t>(n) * DTypeSize(to));
        ASSERT_EQ(ConvertCpu(src.data(), from, n, to, dst.data()), KernelStatus::kOk);
        const std::vector<float> mid = test::Decode(src, from);
        for (int i = 0; i < n; ++i) {
          uint16_t want16 = 0;
          if (to == DType::kFloat16) want16 = FloatToHalfBits(mid[i]);
          if (to == DType::kBFloat16) want16 = FloatToBFloat16Bits(mid[i]);
          if (to == DType::kFloat32) {
            float got;
            std::memcpy(&got, dst.data() + 4 * i, 4);
            ASSERT_EQ(got, mid[i]);
          } else {
            uint16_t got;
            std::memcpy(&got, dst.data() + 2 * i, 2);
            ASSERT_EQ(got, want16) << DTypeName(from) << "->" << DTypeName(to) << " n=" << n;
          }
        }
      }
    }
  }
}

TEST(ConvertTest, RejectsInvalidArguments) {
  float x = 1.0f;
  uint16_t y = 0;
  EXPECT_EQ(ConvertCpu(&x, DType::kInt8, 1, DType::kFloat16, &y), KernelStatus::kInvalidArgument);
  EXPECT_EQ(ConvertCpu(&x, DType::kFloat32, -1, DType::kFloat16, &y),
            KernelStatus::kInvalidArgument);
  EXPECT_EQ(ConvertCpu(nullptr, DType::kFloat32, 1, DType::kFloat16, &y),
            KernelStatus::kInvalidArgument);
  EXPECT_EQ(ConvertCpu(nullptr, DType::kFloat32, 0, DType::kFloat16, nullptr), KernelStatus::kOk);
  EXPECT_STREQ(DTypeName(DType::kBFloat16), "bf16");
  EXPECT_EQ(DTypeSize(DType::kFloat16), 2u);
  EXPECT_STREQ(KernelStatusName(KernelStatus::kDeviceError), "device_error");
}

}  // namespace
}  // namespace kvcache::kernels
