// GPU vs CPU: reference attention within 1e-5 absolute on weights and 1e-5 * max|v| on the
// output (attention.h).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#include "cuda_test_util.h"
#include "kvcache/kernels/attention.h"
#include "kvcache/kernels/cuda_kernels.h"
#include "test_util.h"

namespace kvcache::kernels {
namespace {

using AttentionParityTest = test::CudaParityTest;
using test::DeviceBuffer;

TEST_F(AttentionParityTest, WithinToleranceOfCpu) {
  struct Case {
    int64_t queries, keys, dim;
  };
  for (const Case& c : {Case{4, 1000, 128}, Case{3, 17, 64}, Case{1, 1, 5}, Case{2, 300, 300},
                        Case{1, 200, 6000}}) {
    SCOPED_TRACE(::testing::Message() << c.queries << "x" << c.keys << "x" << c.dim);
    const std::vector<float> q = test::Gaussian(c.queries * c.dim, 1, 1.5f);
    const std::vector<float> k = test::Gaussian(c.keys * c.dim, 2);
    const std::vector<float> v = test::Gaussian(c.keys * c.dim, 3);
    std::vector<float> cpu_out(c.queries * c.dim), cpu_w(c.queries * c.keys);
    ASSERT_EQ(ReferenceAttentionCpu(q.data(), k.data(), v.data(), c.queries, c.keys, c.dim,
                                    cpu_out.data(), cpu_w.data()),
              KernelStatus::kOk);
    DeviceBuffer d_q(q), d_k(k), d_v(v);
    DeviceBuffer d_out(cpu_out.size() * sizeof(float)), d_w(cpu_w.size() * sizeof(float));
    ASSERT_EQ(
        ReferenceAttentionCuda(d_q.get<float>(), d_k.get<float>(), d_v.get<float>(), c.queries,
                               c.keys, c.dim, d_out.get<float>(), d_w.get<float>(), nullptr),
        KernelStatus::kOk);
    const std::vector<float> gpu_out = d_out.Download<float>(cpu_out.size());
    const std::vector<float> gpu_w = d_w.Download<float>(cpu_w.size());
    float vmax = 0;
    for (float x : v) vmax = std::max(vmax, std::fabs(x));
    for (size_t i = 0; i < cpu_out.size(); ++i) EXPECT_NEAR(gpu_out[i], cpu_out[i], 1e-5 * vmax);
    for (size_t i = 0; i < cpu_w.size(); ++i) EXPECT_NEAR(gpu_w[i], cpu_w[i], 1e-5);
    // Without the weights buffer.
    ASSERT_EQ(
        ReferenceAttentionCuda(d_q.get<float>(), d_k.get<float>(), d_v.get<float>(), c.queries,
                               c.keys, c.dim, d_out.get<float>(), nullptr, nullptr),
        KernelStatus::kOk);
    EXPECT_EQ(d_out.Download<float>(cpu_out.size()), gpu_out);
  }
}

}  // namespace
}  // namespace kvcache::kernels
