// GPU vs CPU: key novelty within 1e-5 absolute (novelty.h).
#include <gtest/gtest.h>

#include <cstdint>
#include <vector>

#include "cuda_test_util.h"
#include "kvcache/kernels/cuda_kernels.h"
#include "kvcache/kernels/novelty.h"
#include "test_util.h"

namespace kvcache::kernels {
namespace {

using NoveltyParityTest = test::CudaParityTest;
using test::DeviceBuffer;

TEST_F(NoveltyParityTest, WithinToleranceOfCpu) {
  struct Case {
    int64_t heads, tokens, dim;
  };
  for (DType dtype : {DType::kFloat32, DType::kFloat16, DType::kBFloat16}) {
    for (const Case& c : {Case{8, 64, 128}, Case{3, 257, 100}, Case{17, 5, 33}, Case{1, 1, 8}}) {
      SCOPED_TRACE(::testing::Message()
                   << DTypeName(dtype) << " " << c.heads << "x" << c.tokens << "x" << c.dim);
      const size_t n = static_cast<size_t>(c.heads * c.tokens * c.dim);
      std::vector<float> keys = test::Gaussian(n, 9);
      // Make every third token repeat its predecessor: exact zeros on both sides.
      for (int64_t h = 0; h < c.heads; ++h) {
        for (int64_t t = 3; t < c.tokens; t += 3) {
          for (int64_t d = 0; d < c.dim; ++d) {
            keys[(h * c.tokens + t) * c.dim + d] = keys[(h * c.tokens + t - 1) * c.dim + d];
          }
        }
      }
      const std::vector<uint8_t> src = test::Encode(keys, dtype);
      std::vector<float> cpu(c.tokens);
      ASSERT_EQ(KeyNoveltyCpu(src.data(), dtype, c.heads, c.tokens, c.dim, cpu.data()),
                KernelStatus::kOk);
      DeviceBuffer d_keys(src);
      DeviceBuffer d_out(c.tokens * sizeof(float));
      ASSERT_EQ(KeyNoveltyCuda(d_keys.get(), dtype, c.heads, c.tokens, c.dim, d_out.get<float>(),
                               nullptr),
                KernelStatus::kOk);
      const std::vector<float> gpu = d_out.Download<float>(c.tokens);
      for (int64_t t = 0; t < c.tokens; ++t) {
        EXPECT_NEAR(gpu[t], cpu[t], 1e-5) << t;
        if (t > 0 && t % 3 == 0) {
          EXPECT_EQ(gpu[t], 0.0f) << t;
        }
      }
    }
  }
}

}  // namespace
}  // namespace kvcache::kernels
