// The AVX2+F16C variant of the CPU kernels must be bit-identical to the baseline one.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
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
  }
  const CpuKernels* avx2_ = nullptr;
  const CpuKernels& base_ = internal::BaselineCpuKernels();
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

TEST_F(DispatchTest, QuantizeAndDequantizeAreBitIdentical) {
  const int64_t mats = 3, rows = 19, cols = 300;
  const size_t n = static_cast<size_t>(mats * rows * cols);
  const std::vector<float> x = Awkward(n, 99);
  for (DType dtype : {DType::kFloat32, DType::kFloat16, DType::kBFloat16}) {
    SCOPED_TRACE(DTypeName(dtype));
    const std::vector<uint8_t> src = test::Encode(x, dtype);
    std::vector<int8_t> qa(n), qb(n);
    std::vector<float> sa(static_cast<size_t>(mats * rows)), sb(sa.size());
    base_.quantize_per_token(src.data(), dtype, mats * rows, cols, qa.data(), sa.data());
    avx2_->quantize_per_token(src.data(), dtype, mats * rows, cols, qb.data(), sb.data());
    EXPECT_EQ(qa, qb);
    EXPECT_EQ(0, std::memcmp(sa.data(), sb.data(), sa.size() * sizeof(float)));
    std::vector<uint8_t> da(src.size()), db(src.size());
    base_.dequantize_per_token(qa.data(), sa.data(), mats * rows, cols, dtype, da.data());
    avx2_->dequantize_per_token(qa.data(), sa.data(), mats * rows, cols, dtype, db.data());
    EXPECT_EQ(da, db);

    std::vector<float> ca(static_cast<size_t>(mats * cols)), cb(ca.size());
    base_.quantize_per_channel(src.data(), dtype, mats, rows, cols, qa.data(), ca.data());
    avx2_->quantize_per_channel(src.data(), dtype, mats, rows, cols, qb.data(), cb.data());
    EXPECT_EQ(qa, qb);
    EXPECT_EQ(0, std::memcmp(ca.data(), cb.data(), ca.size() * sizeof(float)));
    base_.dequantize_per_channel(qa.data(), ca.data(), mats, rows, cols, dtype, da.data());
    avx2_->dequantize_per_channel(qa.data(), ca.data(), mats, rows, cols, dtype, db.data());
    EXPECT_EQ(da, db);
  }
}

TEST_F(DispatchTest, ForcingBaselineSwitchesTheActiveVariant) {
  EXPECT_EQ(&internal::ActiveCpuKernels(), avx2_);
  internal::ForceBaselineCpuKernelsForTesting(true);
  EXPECT_EQ(&internal::ActiveCpuKernels(), &base_);
  EXPECT_STREQ(internal::ActiveCpuKernels().name, base_.name);
  internal::ForceBaselineCpuKernelsForTesting(false);
  EXPECT_EQ(&internal::ActiveCpuKernels(), avx2_);
}

}  // namespace
}  // namespace kvcache::kernels
