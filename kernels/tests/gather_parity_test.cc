// GPU vs CPU: gather is bit-identical for valid index lists (gather.h); out-of-range indices
// give zero rows on the GPU.
#include <gtest/gtest.h>

#include <cstdint>
#include <vector>

#include "cuda_test_util.h"
#include "kvcache/kernels/cuda_kernels.h"
#include "kvcache/kernels/gather.h"

namespace kvcache::kernels {
namespace {

using GatherParityTest = test::CudaParityTest;
using test::DeviceBuffer;

TEST_F(GatherParityTest, BitIdenticalToCpu) {
  const int64_t heads = 4, tokens = 70;
  std::vector<int32_t> kept;
  for (int32_t t = 0; t < tokens; ++t) {
    if (t < 4 || t % 3 == 0 || t >= 60) kept.push_back(t);
  }
  const int64_t num_kept = static_cast<int64_t>(kept.size());
  for (DType dtype : {DType::kFloat32, DType::kFloat16, DType::kBFloat16, DType::kInt8}) {
    for (int64_t dim : {128, 7, 1, 9}) {
      for (size_t misalign : {0u, 1u}) {
        SCOPED_TRACE(::testing::Message()
                     << DTypeName(dtype) << " dim " << dim << " +" << misalign);
        const size_t elem = DTypeSize(dtype);
        std::vector<uint8_t> src(static_cast<size_t>(heads * tokens * dim) * elem);
        for (size_t i = 0; i < src.size(); ++i) src[i] = static_cast<uint8_t>(i * 37 + 11);
        const size_t out_bytes = static_cast<size_t>(heads * num_kept * dim) * elem;
        std::vector<uint8_t> cpu(out_bytes);
        ASSERT_EQ(GatherTokensCpu(src.data(), dtype, heads, tokens, dim, kept.data(), num_kept,
                                  cpu.data()),
                  KernelStatus::kOk);
        DeviceBuffer d_src(src, misalign), d_kept(kept), d_out(out_bytes, misalign);
        ASSERT_EQ(GatherTokensCuda(d_src.get(), dtype, heads, tokens, dim, d_kept.get<int32_t>(),
                                   num_kept, d_out.get(), nullptr),
                  KernelStatus::kOk);
        EXPECT_EQ(d_out.Download<uint8_t>(out_bytes), cpu);
      }
    }
  }
}

TEST_F(GatherParityTest, OutOfRangeIndicesGiveZeroRows) {
  const std::vector<float> src = {1, 2, 3, 4, 5, 6};  // 3 tokens x 2.
  const std::vector<int32_t> kept = {1, 7, -2};
  DeviceBuffer d_src(src), d_kept(kept), d_out(6 * sizeof(float));
  ASSERT_EQ(GatherTokensCuda(d_src.get(), DType::kFloat32, 1, 3, 2, d_kept.get<int32_t>(), 3,
                             d_out.get(), nullptr),
            KernelStatus::kOk);
  EXPECT_EQ(d_out.Download<float>(6), (std::vector<float>{3, 4, 0, 0, 0, 0}));
}

}  // namespace
}  // namespace kvcache::kernels
