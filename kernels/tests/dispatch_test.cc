// The AVX2+F16C and AVX-512 variants of the CPU kernels must be bit-identical to the baseline one.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "cpu_kernels.h"
#include "kvcache/kernels/quantize.h"
#include "test_util.h"

namespace kvcache::kernels {
namespace {

using internal::CpuKernels;

class DispatchTest : public ::testing::Test {
 protected:
  void SetUp() override {
    avx2_ = internal::Avx2CpuKernels();
    if (avx2_ == nullptr) GTEST_SKIP() << "AVX2 variant not compiled in";
    if (!internal::CpuHasAvx2F16c()) GTEST_SKIP() << "CPU lacks AVX2/F16C";
    variants_.push_back(avx2_);
    if (internal::Avx512CpuKernels() != nullptr && internal::CpuHasAvx512()) {
      variants_.push_back(internal::Avx512CpuKernels());
    }
  }
  const CpuKernels* avx2_ = nullptr;
  const CpuKernels& base_ = internal::BaselineCpuKernels();
  // The variants this CPU can run, other than the baseline.
  std::vector<const CpuKernels*> variants_;
};

// Gaussian data plus the awkward values: subnormals, the largest finite, signed zeros and an
// infinity (which makes its group's scale infinite and some dequantized values NaN).
std::vector<float> Awkward(size_t n, uint32_t seed) {
  std::vector<float> x = test::Gaussian(n, seed, 4.0f);
  const float specials[] = {
      std::ldexp(1.0f, -24), -std::ldexp(3.0f, -20), 65504.0f, -0.0f, 0.0f, 1e-30f, -3e38f,
      std::ldexp(1.0f, -133)};
  for (size_t i = 0; i < n; i += 17) x[i] = specials[(i / 17) % 8];
  return x;
}

TEST_F(DispatchTest, ConvertIsBitIdentical) {
  const DType kTypes[] = {DType::kFloat32, DType::kFloat16, DType::kBFloat16};
  for (size_t n : {1u, 7u, 8u, 9u, 255u, 1000u}) {
    const std::vector<float> x = Awkward(n, static_cast<uint32_t>(n));
    for (DType from : kTypes) {
      for (DType to : kTypes) {
        std::vector<uint8_t> src(n * DTypeSize(from)), a(n * DTypeSize(to)), b(a.size());
        base_.convert(x.data(), DType::kFloat32, static_cast<int64_t>(n), from, src.data());
        base_.convert(src.data(), from, static_cast<int64_t>(n), to, a.data());
        avx2_->convert(src.data(), from, static_cast<int64_t>(n), to, b.data());
        ASSERT_EQ(a, b) << DTypeName(from) << "->" << DTypeName(to) << " n=" << n;
      }
    }
  }
}

// Quantize and dequantize of `x` (mats x rows x cols) by `v` and by the baseline, both axes.
void ExpectSameQuantization(const CpuKernels& base, const CpuKernels& v,
                            const std::vector<float>& x, int64_t mats, int64_t rows, int64_t cols) {
  const size_t n = static_cast<size_t>(mats * rows * cols);
  for (DType dtype : {DType::kFloat32, DType::kFloat16, DType::kBFloat16}) {
    SCOPED_TRACE(::testing::Message()
                 << v.name << " " << DTypeName(dtype) << " " << mats << "x" << rows << "x" << cols);
    const std::vector<uint8_t> src = test::Encode(x, dtype);
    std::vector<int8_t> qa(n), qb(n);
    std::vector<float> sa(static_cast<size_t>(mats * rows)), sb(sa.size());
    base.quantize_per_token(src.data(), dtype, mats * rows, cols, qa.data(), sa.data());
    v.quantize_per_token(src.data(), dtype, mats * rows, cols, qb.data(), sb.data());
    EXPECT_EQ(qa, qb);
    EXPECT_EQ(0, std::memcmp(sa.data(), sb.data(), sa.size() * sizeof(float)));
    std::vector<uint8_t> da(src.size()), db(src.size());
    base.dequantize_per_token(qa.data(), sa.data(), mats * rows, cols, dtype, da.data());
    v.dequantize_per_token(qa.data(), sa.data(), mats * rows, cols, dtype, db.data());
    EXPECT_EQ(da, db);

    std::vector<float> ca(static_cast<size_t>(mats * cols)), cb(ca.size());
    base.quantize_per_channel(src.data(), dtype, mats, rows, cols, qa.data(), ca.data());
    v.quantize_per_channel(src.data(), dtype, mats, rows, cols, qb.data(), cb.data());
    EXPECT_EQ(qa, qb);
    EXPECT_EQ(0, std::memcmp(ca.data(), cb.data(), ca.size() * sizeof(float)));
    base.dequantize_per_channel(qa.data(), ca.data(), mats, rows, cols, dtype, da.data());
    v.dequantize_per_channel(qa.data(), ca.data(), mats, rows, cols, dtype, db.data());
    EXPECT_EQ(da, db);
  }
}

TEST_F(DispatchTest, QuantizeAndDequantizeAreBitIdentical) {
  const int64_t mats = 3, rows = 19, cols = 300;
  const std::vector<float> x = Awkward(static_cast<size_t>(mats * rows * cols), 99);
  for (const CpuKernels* v : variants_) ExpectSameQuantization(base_, *v, x, mats, rows, cols);
}

// Shapes around every SIMD width (8, 16, 32, 64 elements, 128- and 256-column blocks, batches of
// 8 rows), on Gaussian data without special values.
TEST_F(DispatchTest, QuantizeIsBitIdenticalOnAllTailShapes) {
  for (int64_t cols : {1,  7,  8,   15,  16,  17,  31,  32,  33,  48,  63,  64,  65,
                       80, 96, 100, 112, 127, 128, 129, 192, 255, 256, 257, 320, 513}) {
    for (int64_t rows : {1, 7, 8, 9, 17}) {
      const std::vector<float> x =
          test::Gaussian(static_cast<size_t>(2 * rows * cols), static_cast<uint32_t>(cols * rows));
      for (const CpuKernels* v : variants_) ExpectSameQuantization(base_, *v, x, 2, rows, cols);
    }
  }
}

// Groups of zeros, of subnormals only, with exact +-127 multiples, with NaN or Inf among
// ordinary values, and one huge value (scale near FLT_MAX / 127), at every position of a
// 128-wide row so that each SIMD lane and tail sees them.
TEST_F(DispatchTest, QuantizeIsBitIdenticalOnSpecialGroups) {
  const int64_t mats = 2, rows = 24, cols = 128 + 9;
  const size_t n = static_cast<size_t>(mats * rows * cols);
  const float inf = std::numeric_limits<float>::infinity();
  const float nan = std::numeric_limits<float>::quiet_NaN();
  for (int pattern = 0; pattern < 8; ++pattern) {
    std::vector<float> x = test::Gaussian(n, 1000 + static_cast<uint32_t>(pattern), 2.0f);
    for (size_t i = 0; i < n; ++i) {
      const int64_t col = static_cast<int64_t>(i) % cols;
      const int64_t row = static_cast<int64_t>(i) / cols;
      switch (pattern) {
        case 0:  // Zero rows and zero columns (signed zeros).
          if (row % 5 == 0 || col % 7 == 0) x[i] = (i % 2 == 0) ? 0.0f : -0.0f;
          break;
        case 1:  // Subnormal only (in every dtype), some groups.
          if (row % 3 == 0 || col % 4 == 0) x[i] = std::ldexp(x[i], -136);
          break;
        case 2:  // k * 2^e with |k| <= 127: exact codes and +-127 ties at the group maximum.
          x[i] = std::ldexp(std::nearbyint(std::clamp(x[i] * 40.0f, -127.0f, 127.0f)),
                            static_cast<int>(col % 5) - 3);
          if (col == row % cols) x[i] = (row % 2 == 0) ? 127.0f : -127.0f;
          break;
        case 3:  // x.5 after scaling: round-half-even cases.
          x[i] = (std::floor(x[i] * 20.0f) + 0.5f) / 8.0f;
          if (col % 11 == 0) x[i] = 127.0f / 8.0f;
          break;
        case 4:  // A NaN in some rows and columns.
          if ((row * 31 + col) % 97 == 0) x[i] = nan;
          break;
        case 5:  // An infinity in some rows and columns.
          if ((row * 17 + col) % 89 == 0) x[i] = (row % 2 == 0) ? inf : -inf;
          break;
        case 6:  // Huge values (fp32 only stays finite).
          if ((row + col) % 13 == 0) x[i] = std::ldexp(1.5f, 127);
          break;
        default:  // Tiny normal maxima: 127 / amax overflows the 2^16 range of an fp16 scale.
          x[i] = std::ldexp(x[i], -20);
          break;
      }
    }
    SCOPED_TRACE(::testing::Message() << "pattern " << pattern);
    for (const CpuKernels* v : variants_) ExpectSameQuantization(base_, *v, x, mats, rows, cols);
  }
}

// Random shapes (up to 3 x 40 x 700) with special values sprinkled at random positions.
TEST_F(DispatchTest, QuantizeIsBitIdenticalOnRandomShapes) {
  std::mt19937 rng(2024);
  const float specials[] = {0.0f,
                            -0.0f,
                            std::numeric_limits<float>::infinity(),
                            -std::numeric_limits<float>::infinity(),
                            std::numeric_limits<float>::quiet_NaN(),
                            std::ldexp(1.0f, -140),
                            std::ldexp(-3.0f, -20),
                            65504.0f,
                            127.0f,
                            -127.0f};
  for (int trial = 0; trial < 60; ++trial) {
    const int64_t mats = 1 + static_cast<int64_t>(rng() % 3);
    const int64_t rows = 1 + static_cast<int64_t>(rng() % 40);
    const int64_t cols = 1 + static_cast<int64_t>(rng() % 700);
    const size_t n = static_cast<size_t>(mats * rows * cols);
    std::vector<float> x = test::Gaussian(n, rng(), 1.0f + static_cast<float>(rng() % 100));
    const int mode = trial % 4;  // 0: clean, 1: a few specials, 2: many, 3: tiny groups.
    if (mode == 1 || mode == 2) {
      const size_t count = mode == 1 ? 3 : n / 10;
      for (size_t i = 0; i < count; ++i) x[rng() % n] = specials[rng() % 10];
    } else if (mode == 3) {
      for (float& v : x) v = std::ldexp(v, -130);
    }
    SCOPED_TRACE(::testing::Message() << "trial " << trial);
    for (const CpuKernels* v : variants_) ExpectSameQuantization(base_, *v, x, mats, rows, cols);
  }
}

// Dequantize with arbitrary scales: NaN, Inf, subnormal, negative, huge.
TEST_F(DispatchTest, DequantizeIsBitIdenticalForAnyScale) {
  const int64_t mats = 2, rows = 9, cols = 70;
  const size_t n = static_cast<size_t>(mats * rows * cols);
  std::vector<int8_t> codes(n);
  for (size_t i = 0; i < n; ++i)
    codes[i] = static_cast<int8_t>(static_cast<int>(i * 37 % 255) - 127);
  const float specials[] = {std::numeric_limits<float>::quiet_NaN(),
                            std::numeric_limits<float>::infinity(),
                            std::ldexp(1.0f, -140),
                            -0.75f,
                            3.0e38f,
                            std::ldexp(1.0f, -126),
                            0.0f,
                            1.0f / 127.0f};
  // Scales whose products with powers of two (and their multiples) fall exactly halfway
  // between two bf16 or fp16 values, so the round-to-nearest-even ties are exercised.
  const float ties[] = {
      1.0f + std::ldexp(1.0f, -8),    1.0f + std::ldexp(3.0f, -8),
      -(1.0f + std::ldexp(1.0f, -8)), 1.0f + std::ldexp(1.0f, -11),
      1.0f + std::ldexp(3.0f, -11),   std::ldexp(1.0f + std::ldexp(1.0f, -8), -30)};
  for (size_t which = 0; which < 9; ++which) {
    std::vector<float> scales = test::Uniform(static_cast<size_t>(mats * cols), 7, 0.0f, 0.1f);
    if (which < 8) {
      scales[which * 7 % scales.size()] = specials[which];
    } else {
      for (size_t j = 0; j < scales.size(); ++j) scales[j] = ties[j % 6];
    }
    for (DType dtype : {DType::kFloat32, DType::kFloat16, DType::kBFloat16}) {
      SCOPED_TRACE(::testing::Message() << DTypeName(dtype) << " special " << which);
      std::vector<uint8_t> da(n * DTypeSize(dtype)), db(da.size());
      for (const CpuKernels* v : variants_) {
        base_.dequantize_per_token(codes.data(), scales.data(), mats * rows, cols, dtype,
                                   da.data());
        v->dequantize_per_token(codes.data(), scales.data(), mats * rows, cols, dtype, db.data());
        EXPECT_EQ(da, db) << v->name;
        base_.dequantize_per_channel(codes.data(), scales.data(), mats, rows, cols, dtype,
                                     da.data());
        v->dequantize_per_channel(codes.data(), scales.data(), mats, rows, cols, dtype, db.data());
        EXPECT_EQ(da, db) << v->name;
      }
    }
  }
}

TEST_F(DispatchTest, ForcingBaselineSwitchesTheActiveVariant) {
  // The widest supported variant is active.
  EXPECT_EQ(&internal::ActiveCpuKernels(), variants_.back());
  internal::ForceBaselineCpuKernelsForTesting(true);
  EXPECT_EQ(&internal::ActiveCpuKernels(), &base_);
  EXPECT_STREQ(internal::ActiveCpuKernels().name, base_.name);
  internal::ForceBaselineCpuKernelsForTesting(false);
  EXPECT_EQ(&internal::ActiveCpuKernels(), variants_.back());
}

}  // namespace
}  // namespace kvcache::kernels
