// GPU vs CPU: INT8 quantize / dequantize must be bit-identical (quantize.h).
#include <gtest/gtest.h>

#include <cstdint>
#include <string>
#include <tuple>
#include <vector>

#include "cuda_test_util.h"
#include "kvcache/kernels/cuda_kernels.h"
#include "kvcache/kernels/quantize.h"
#include "test_util.h"

namespace kvcache::kernels {
namespace {

using test::DeviceBuffer;

struct Case {
  int64_t heads, tokens, dim;
  size_t misalign;  // Bytes added to every device pointer (forces the scalar path when > 0).
};

class QuantizeParityTest : public test::CudaParityTestWithParam<std::tuple<DType, QuantAxis>> {};

TEST_P(QuantizeParityTest, BitIdenticalToCpu) {
  const DType dtype = std::get<0>(GetParam());
  const QuantAxis axis = std::get<1>(GetParam());
  for (const Case& c : {Case{8, 64, 128, 0}, Case{64, 16, 128, 0}, Case{3, 17, 100, 0},
                        Case{2, 5, 7, 0}, Case{4, 33, 128, 2}, Case{1, 1000, 64, 0}}) {
    SCOPED_TRACE(::testing::Message()
                 << c.heads << "x" << c.tokens << "x" << c.dim << " +" << c.misalign);
    const size_t n = static_cast<size_t>(c.heads * c.tokens * c.dim);
    const size_t num_scales = static_cast<size_t>(Int8ScaleCount(axis, c.heads, c.tokens, c.dim));
    const std::vector<uint8_t> src = test::Encode(test::Gaussian(n, 42, 2.0f), dtype);

    std::vector<int8_t> cpu_codes(n);
    std::vector<float> cpu_scales(num_scales);
    ASSERT_EQ(QuantizeInt8Cpu(src.data(), dtype, c.heads, c.tokens, c.dim, axis, cpu_codes.data(),
                              cpu_scales.data()),
              KernelStatus::kOk);
    std::vector<uint8_t> cpu_out(src.size());
    ASSERT_EQ(DequantizeInt8Cpu(cpu_codes.data(), cpu_scales.data(), c.heads, c.tokens, c.dim, axis,
                                dtype, cpu_out.data()),
              KernelStatus::kOk);

    DeviceBuffer d_src(src, c.misalign);
    DeviceBuffer d_codes(n, c.misalign);
    DeviceBuffer d_scales(num_scales * sizeof(float));
    DeviceBuffer d_out(src.size(), c.misalign);
    ASSERT_EQ(QuantizeInt8Cuda(d_src.get(), dtype, c.heads, c.tokens, c.dim, axis,
                               d_codes.get<int8_t>(), d_scales.get<float>(), nullptr),
              KernelStatus::kOk);
    ASSERT_EQ(DequantizeInt8Cuda(d_codes.get<int8_t>(), d_scales.get<float>(), c.heads, c.tokens,
                                 c.dim, axis, dtype, d_out.get(), nullptr),
              KernelStatus::kOk);
    EXPECT_EQ(d_codes.Download<int8_t>(n), cpu_codes);
    EXPECT_EQ(d_scales.Download<float>(num_scales), cpu_scales);
    EXPECT_EQ(d_out.Download<uint8_t>(src.size()), cpu_out);
  }
}

TEST_P(QuantizeParityTest, SameArgumentChecks) {
  const DType dtype = std::get<0>(GetParam());
  const QuantAxis axis = std::get<1>(GetParam());
  EXPECT_EQ(QuantizeInt8Cuda(nullptr, dtype, 1, 2, 3, axis, nullptr, nullptr, nullptr),
            KernelStatus::kInvalidArgument);
  EXPECT_EQ(QuantizeInt8Cuda(nullptr, dtype, 0, 2, 3, axis, nullptr, nullptr, nullptr),
            KernelStatus::kOk);
  EXPECT_EQ(DequantizeInt8Cuda(nullptr, nullptr, 1, -2, 3, axis, dtype, nullptr, nullptr),
            KernelStatus::kInvalidArgument);
}

std::string ParamName(const ::testing::TestParamInfo<std::tuple<DType, QuantAxis>>& info) {
  return std::string(DTypeName(std::get<0>(info.param))) +
         (std::get<1>(info.param) == QuantAxis::kPerToken ? "_per_token" : "_per_channel");
}

INSTANTIATE_TEST_SUITE_P(
    AllDTypesAndAxes, QuantizeParityTest,
    ::testing::Combine(::testing::Values(DType::kFloat32, DType::kFloat16, DType::kBFloat16),
                       ::testing::Values(QuantAxis::kPerChannel, QuantAxis::kPerToken)),
    ParamName);

}  // namespace
}  // namespace kvcache::kernels
