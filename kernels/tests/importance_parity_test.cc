// GPU vs CPU: importance scores within 1e-6 relative (importance.h).
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <vector>

#include "cuda_test_util.h"
#include "kvcache/kernels/cuda_kernels.h"
#include "kvcache/kernels/importance.h"
#include "test_util.h"

namespace kvcache::kernels {
namespace {

using ImportanceParityTest = test::CudaParityTest;
using test::DeviceBuffer;

TEST_F(ImportanceParityTest, WithinToleranceOfCpu) {
  const int64_t n = 5000;
  const std::vector<float> attention = test::Uniform(n, 1, 0.0f, 1.0f);
  const std::vector<float> novelty = test::Uniform(n, 2, 0.0f, 2.0f);
  DeviceBuffer d_attention(attention), d_novelty(novelty), d_scores(n * sizeof(float));
  for (PositionDecay decay : {PositionDecay::kExponential, PositionDecay::kHyperbolic}) {
    for (bool with_inputs : {true, false}) {
      ImportanceParams p;
      p.decay = decay;
      p.sink_tokens = 7;
      p.recent_window = 100;
      p.decay_tau = 333.0f;
      std::vector<float> cpu(n);
      const float* a = with_inputs ? attention.data() : nullptr;
      const float* nv = with_inputs ? novelty.data() : nullptr;
      ASSERT_EQ(ImportanceScoresCpu(a, nv, n, p, cpu.data()), KernelStatus::kOk);
      ASSERT_EQ(ImportanceScoresCuda(with_inputs ? d_attention.get<float>() : nullptr,
                                     with_inputs ? d_novelty.get<float>() : nullptr, n, p,
                                     d_scores.get<float>(), nullptr),
                KernelStatus::kOk);
      const std::vector<float> gpu = d_scores.Download<float>(n);
      for (int64_t t = 0; t < n; ++t) {
        EXPECT_NEAR(gpu[t], cpu[t], 1e-6 * std::fabs(cpu[t]) + 1e-30) << t;
      }
    }
  }
  ImportanceParams bad;
  bad.decay_tau = -1.0f;
  EXPECT_EQ(ImportanceScoresCuda(nullptr, nullptr, n, bad, d_scores.get<float>(), nullptr),
            KernelStatus::kInvalidArgument);
}

}  // namespace
}  // namespace kvcache::kernels
