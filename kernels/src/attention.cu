// CUDA twin of attention.h: one block per query, three passes over the keys (row maximum,
// fp64 sum of exponentials, then weights and the weighted sum of values). Scores are recomputed
// each pass instead of stored, so any num_keys works with O(head_dim) shared memory.
#include <cmath>
#include <cstdint>

#include "cuda_common.cuh"
#include "kvcache/kernels/cuda_kernels.h"
#include "validate.h"

namespace kvcache::kernels {
namespace {

using cuda_internal::kWarpSize;

constexpr int kThreads = 256;
constexpr int kWarps = kThreads / kWarpSize;

__device__ __forceinline__ float Score(const float* q, const float* k, int64_t dim, float scale) {
  float s = 0.0f;
  for (int64_t c = 0; c < dim; ++c) s += q[c] * k[c];
  return s * scale;
}

// Block-wide reductions; every thread gets the result.
__device__ float BlockMax(float v, float* scratch) {
  v = cuda_internal::WarpMax(v);
  if (threadIdx.x % kWarpSize == 0) scratch[threadIdx.x / kWarpSize] = v;
  __syncthreads();
  v = threadIdx.x < kWarps ? scratch[threadIdx.x] : -INFINITY;
  if (threadIdx.x < kWarpSize) v = cuda_internal::WarpMax(v);
  if (threadIdx.x == 0) scratch[0] = v;
  __syncthreads();
  const float result = scratch[0];
  __syncthreads();
  return result;
}

__device__ double BlockSum(double v, double* scratch) {
  v = cuda_internal::WarpSum(v);
  if (threadIdx.x % kWarpSize == 0) scratch[threadIdx.x / kWarpSize] = v;
  __syncthreads();
  v = threadIdx.x < kWarps ? scratch[threadIdx.x] : 0.0;
  if (threadIdx.x < kWarpSize) v = cuda_internal::WarpSum(v);
  if (threadIdx.x == 0) scratch[0] = v;
  __syncthreads();
  const double result = scratch[0];
  __syncthreads();
  return result;
}

// Dynamic shared memory: acc[dim] doubles, then q[dim] floats, then w[kThreads] floats.
__global__ void AttentionKernel(const float* __restrict__ q, const float* __restrict__ k,
                                const float* __restrict__ v, int64_t num_queries, int64_t num_keys,
                                int64_t dim, float scale, float* __restrict__ out,
                                float* __restrict__ weights) {
  extern __shared__ double dynamic_shared[];
  __shared__ float max_scratch[kWarps];
  __shared__ double sum_scratch[kWarps];
  double* acc = dynamic_shared;
  float* qs = reinterpret_cast<float*>(acc + dim);
  float* w = qs + dim;
  const int tid = threadIdx.x;
  for (int64_t qi = blockIdx.x; qi < num_queries; qi += gridDim.x) {
    for (int64_t c = tid; c < dim; c += kThreads) {
      qs[c] = q[qi * dim + c];
      acc[c] = 0.0;
    }
    __syncthreads();
    float m = -INFINITY;
    for (int64_t j = tid; j < num_keys; j += kThreads)
      m = fmaxf(m, Score(qs, k + j * dim, dim, scale));
    m = BlockMax(m, max_scratch);
    double l = 0.0;
    for (int64_t j = tid; j < num_keys; j += kThreads) {
      l += static_cast<double>(expf(Score(qs, k + j * dim, dim, scale) - m));
    }
    l = BlockSum(l, sum_scratch);
    for (int64_t j0 = 0; j0 < num_keys; j0 += kThreads) {
      const int64_t j = j0 + tid;
      float wj = 0.0f;
      if (j < num_keys) {
        wj = static_cast<float>(static_cast<double>(expf(Score(qs, k + j * dim, dim, scale) - m)) /
                                l);
        if (weights != nullptr) weights[qi * num_keys + j] = wj;
      }
      w[tid] = wj;
      __syncthreads();
      const int64_t n = num_keys - j0 < kThreads ? num_keys - j0 : kThreads;
      for (int64_t c = tid; c < dim; c += kThreads) {
        double a = acc[c];
        for (int64_t jj = 0; jj < n; ++jj) {
          a += static_cast<double>(w[jj]) * static_cast<double>(v[(j0 + jj) * dim + c]);
        }
        acc[c] = a;
      }
      __syncthreads();
    }
    for (int64_t c = tid; c < dim; c += kThreads) out[qi * dim + c] = static_cast<float>(acc[c]);
    __syncthreads();
  }
}

}  // namespace

KernelStatus ReferenceAttentionCuda(const float* q, const float* k, const float* v,
                                    int64_t num_queries, int64_t num_keys, int64_t head_dim,
                                    float* out, float* weights, cudaStream_t stream) {
  const KernelStatus status =
      internal::CheckAttention(q, k, v, num_queries, num_keys, head_dim, out);
  if (status != KernelStatus::kOk || num_queries == 0) return status;
  const size_t shared_bytes =
      static_cast<size_t>(head_dim) * (sizeof(double) + sizeof(float)) + kThreads * sizeof(float);
  constexpr size_t kDefaultSharedLimit = 48 * 1024;
  if (shared_bytes > kDefaultSharedLimit) {
    if (shared_bytes > static_cast<size_t>(INT32_MAX) ||
        cudaFuncSetAttribute(AttentionKernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                             static_cast<int>(shared_bytes)) != cudaSuccess) {
      cudaGetLastError();
      return KernelStatus::kDeviceError;
    }
  }
  const float scale = 1.0f / sqrtf(static_cast<float>(head_dim));
  AttentionKernel<<<cuda_internal::BlocksFor(num_queries, 1), kThreads, shared_bytes, stream>>>(
      q, k, v, num_queries, num_keys, head_dim, scale, out, weights);
  return cuda_internal::LaunchStatus();
}

}  // namespace kvcache::kernels
