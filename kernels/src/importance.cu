// CUDA twin of importance.h. Every operation is the CPU's, with explicit round-to-nearest
// intrinsics so no FMA contraction changes a result; only expf may differ (<= 2 ulp).
#include <cstdint>

#include "cuda_common.cuh"
#include "kvcache/kernels/cuda_kernels.h"
#include "validate.h"

namespace kvcache::kernels {
namespace {

constexpr int kThreads = 256;

struct DeviceParams {
  float alpha, beta, gamma, decay_tau;
  int64_t sink_tokens, recent_window;
  bool hyperbolic;
};

__device__ __forceinline__ float PositionFactorDevice(int64_t t, int64_t tokens,
                                                      const DeviceParams& p) {
  const int64_t window_start = tokens - p.recent_window;
  if (t < p.sink_tokens || t >= window_start) return 1.0f;
  const float d = static_cast<float>(window_start - t);
  const float x = __fdiv_rn(d, p.decay_tau);
  if (p.hyperbolic) return __fdiv_rn(1.0f, __fadd_rn(1.0f, x));
  return expf(-x);
}

__global__ void ImportanceKernel(const float* __restrict__ attention,
                                 const float* __restrict__ novelty, int64_t tokens, DeviceParams p,
                                 float* __restrict__ scores) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t t = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; t < tokens;
       t += stride) {
    const float a = attention != nullptr ? attention[t] : 0.0f;
    const float n = novelty != nullptr ? novelty[t] : 0.0f;
    const float pos = PositionFactorDevice(t, tokens, p);
    const float ap = __fadd_rn(__fmul_rn(p.alpha, a), __fmul_rn(p.beta, pos));
    scores[t] = __fadd_rn(ap, __fmul_rn(p.gamma, n));
  }
}

}  // namespace

KernelStatus ImportanceScoresCuda(const float* attention, const float* novelty, int64_t num_tokens,
                                  const ImportanceParams& params, float* scores,
                                  cudaStream_t stream) {
  const KernelStatus status = internal::CheckImportance(num_tokens, params, scores);
  if (status != KernelStatus::kOk || num_tokens == 0) return status;
  const DeviceParams p{params.alpha,
                       params.beta,
                       params.gamma,
                       params.decay_tau,
                       params.sink_tokens,
                       params.recent_window,
                       params.decay == PositionDecay::kHyperbolic};
  ImportanceKernel<<<cuda_internal::BlocksFor(num_tokens, kThreads), kThreads, 0, stream>>>(
      attention, novelty, num_tokens, p, scores);
  return cuda_internal::LaunchStatus();
}

}  // namespace kvcache::kernels
