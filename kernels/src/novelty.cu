// CUDA twin of novelty.h: one block per token, its warps split the heads; each warp reduces
// dot(k[t-1], k[t]) and both squared norms over head_dim, then applies the same fp64 cosine
// formula as the CPU.
#include <cstdint>

#include "cuda_common.cuh"
#include "kvcache/kernels/cuda_kernels.h"
#include "validate.h"

namespace kvcache::kernels {
namespace {

using cuda_internal::kWarpSize;
using cuda_internal::ToFloat;

constexpr int kThreads = 256;
constexpr int kWarpsPerBlock = kThreads / kWarpSize;

__device__ __forceinline__ float OneMinusCosine(float dot, float norm2_a, float norm2_b) {
  if (!(norm2_a > 0.0f) || !(norm2_b > 0.0f)) return 1.0f;
  double c =
      static_cast<double>(dot) / sqrt(static_cast<double>(norm2_a) * static_cast<double>(norm2_b));
  c = c < -1.0 ? -1.0 : (c > 1.0 ? 1.0 : c);
  return 1.0f - static_cast<float>(c);
}

template <typename T>
__global__ void KeyNoveltyKernel(const T* __restrict__ keys, int64_t heads, int64_t tokens,
                                 int64_t dim, float* __restrict__ novelty) {
  __shared__ float partial[kWarpsPerBlock];
  const int warp = threadIdx.x / kWarpSize;
  const int lane = threadIdx.x % kWarpSize;
  for (int64_t t = blockIdx.x; t < tokens; t += gridDim.x) {
    if (t == 0) {
      if (threadIdx.x == 0) novelty[0] = 1.0f;
      continue;
    }
    float sum = 0.0f;
    for (int64_t h = warp; h < heads; h += kWarpsPerBlock) {
      const T* cur = keys + (h * tokens + t) * dim;
      const T* prev = cur - dim;
      float dot = 0.0f, norm2_prev = 0.0f, norm2_cur = 0.0f;
      for (int64_t c = lane; c < dim; c += kWarpSize) {
        const float a = ToFloat(prev[c]);
        const float b = ToFloat(cur[c]);
        dot += a * b;
        norm2_prev += a * a;
        norm2_cur += b * b;
      }
      dot = cuda_internal::WarpSum(dot);
      norm2_prev = cuda_internal::WarpSum(norm2_prev);
      norm2_cur = cuda_internal::WarpSum(norm2_cur);
      sum += OneMinusCosine(dot, norm2_prev, norm2_cur);
    }
    if (lane == 0) partial[warp] = sum;
    __syncthreads();
    if (threadIdx.x == 0) {
      float total = 0.0f;
      for (int w = 0; w < kWarpsPerBlock; ++w) total += partial[w];
      novelty[t] = total / static_cast<float>(heads);
    }
    __syncthreads();
  }
}

template <typename T>
void Launch(const void* keys, int64_t heads, int64_t tokens, int64_t dim, float* novelty,
            cudaStream_t stream) {
  KeyNoveltyKernel<T><<<cuda_internal::BlocksFor(tokens, 1), kThreads, 0, stream>>>(
      static_cast<const T*>(keys), heads, tokens, dim, novelty);
}

}  // namespace

KernelStatus KeyNoveltyCuda(const void* keys, DType dtype, int64_t num_heads, int64_t num_tokens,
                            int64_t head_dim, float* novelty, cudaStream_t stream) {
  const KernelStatus status =
      internal::CheckNovelty(keys, dtype, num_heads, num_tokens, head_dim, novelty);
  if (status != KernelStatus::kOk) return status;
  if (num_heads == 0 || num_tokens == 0 || head_dim == 0) return KernelStatus::kOk;
  switch (dtype) {
    case DType::kFloat16:
      Launch<__half>(keys, num_heads, num_tokens, head_dim, novelty, stream);
      break;
    case DType::kBFloat16:
      Launch<__nv_bfloat16>(keys, num_heads, num_tokens, head_dim, novelty, stream);
      break;
    default:
      Launch<float>(keys, num_heads, num_tokens, head_dim, novelty, stream);
      break;
  }
  return cuda_internal::LaunchStatus();
}

}  // namespace kvcache::kernels
