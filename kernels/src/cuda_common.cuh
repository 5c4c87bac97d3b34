// Internal: device helpers shared by the CUDA twins. Not part of the public API.
#ifndef KVCACHE_KERNELS_SRC_CUDA_COMMON_CUH_
#define KVCACHE_KERNELS_SRC_CUDA_COMMON_CUH_

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "kvcache/kernels/types.h"

namespace kvcache::kernels::cuda_internal {

constexpr int kWarpSize = 32;
// Grid-stride loops cover any amount of work, so grids never need more blocks than this.
constexpr int64_t kMaxBlocks = int64_t{1} << 20;

inline unsigned BlocksFor(int64_t work_items, int64_t items_per_block) {
  int64_t blocks = (work_items + items_per_block - 1) / items_per_block;
  if (blocks < 1) blocks = 1;
  if (blocks > kMaxBlocks) blocks = kMaxBlocks;
  return static_cast<unsigned>(blocks);
}

inline bool Aligned(const void* p, size_t bytes) {
  return reinterpret_cast<uintptr_t>(p) % bytes == 0;
}

// Status of the launch just made; consumes the runtime's last error.
inline KernelStatus LaunchStatus() {
  return cudaGetLastError() == cudaSuccess ? KernelStatus::kOk : KernelStatus::kDeviceError;
}

__device__ __forceinline__ float ToFloat(float x) { return x; }
__device__ __forceinline__ float ToFloat(__half x) { return __half2float(x); }
__device__ __forceinline__ float ToFloat(__nv_bfloat16 x) { return __bfloat162float(x); }

template <typename T>
__device__ __forceinline__ T FromFloat(float x);
template <>
__device__ __forceinline__ float FromFloat<float>(float x) {
  return x;
}
template <>
__device__ __forceinline__ __half FromFloat<__half>(float x) {
  return __float2half_rn(x);
}
template <>
__device__ __forceinline__ __nv_bfloat16 FromFloat<__nv_bfloat16>(float x) {
  return __float2bfloat16_rn(x);
}

// N elements moved as one aligned memory access.
template <typename T, int N>
struct alignas(sizeof(T) * N) Pack {
  T v[N];
};

// Butterfly reductions: every lane ends with the same, bit-identical value.
__device__ __forceinline__ float WarpMax(float v) {
  for (int m = kWarpSize / 2; m > 0; m /= 2) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, m));
  return v;
}

__device__ __forceinline__ float WarpSum(float v) {
  for (int m = kWarpSize / 2; m > 0; m /= 2) v += __shfl_xor_sync(0xffffffffu, v, m);
  return v;
}

__device__ __forceinline__ double WarpSum(double v) {
  for (int m = kWarpSize / 2; m > 0; m /= 2) v += __shfl_xor_sync(0xffffffffu, v, m);
  return v;
}

}  // namespace kvcache::kernels::cuda_internal

#endif  // KVCACHE_KERNELS_SRC_CUDA_COMMON_CUH_
