// CUDA twins of quantize.h. Codes, scales and dequantized values are bit-identical to the CPU:
// max|x| is exact in any order, scale and inverse use IEEE division (nvcc's default
// -prec-div=true), and products use __fmul_rn so no FMA contraction can change a rounding.
#include <algorithm>
#include <cstdint>

#include "cuda_common.cuh"
#include "kvcache/kernels/cuda_kernels.h"
#include "validate.h"

namespace kvcache::kernels {
namespace {

using cuda_internal::FromFloat;
using cuda_internal::kWarpSize;
using cuda_internal::Pack;
using cuda_internal::ToFloat;

constexpr int kThreads = 256;
constexpr int kWarpsPerBlock = kThreads / kWarpSize;
constexpr int kChannelRows = 8;  // Per-channel kernel: block is 32 x kChannelRows threads.

__device__ __forceinline__ int8_t QuantizeOne(float x, float inv) {
  float v = __fmul_rn(x, inv);
  v = fminf(fmaxf(v, -127.0f), 127.0f);  // NaN -> -127, as on the CPU.
  return static_cast<int8_t>(__float2int_rn(v));
}

__device__ __forceinline__ float ScaleOf(float amax) { return amax / 127.0f; }
__device__ __forceinline__ float InverseScaleOf(float amax) {
  return amax > 0.0f ? 127.0f / amax : 0.0f;
}

// One element at any address: the scalar path serves pointers that are not
// even aligned to the element (the CPU twin accepts them), where a plain load
// or store would fault with cudaErrorMisalignedAddress.
template <typename T>
__device__ __forceinline__ T LoadElement(const T* p) {
  if ((reinterpret_cast<uintptr_t>(p) & (alignof(T) - 1)) == 0) return *p;
  T v;
  const unsigned char* from = reinterpret_cast<const unsigned char*>(p);
  unsigned char* to = reinterpret_cast<unsigned char*>(&v);
#pragma unroll
  for (int i = 0; i < static_cast<int>(sizeof(T)); ++i) to[i] = from[i];
  return v;
}

template <typename T>
__device__ __forceinline__ void StoreElement(T* p, T v) {
  if ((reinterpret_cast<uintptr_t>(p) & (alignof(T) - 1)) == 0) {
    *p = v;
    return;
  }
  const unsigned char* from = reinterpret_cast<const unsigned char*>(&v);
  unsigned char* to = reinterpret_cast<unsigned char*>(p);
#pragma unroll
  for (int i = 0; i < static_cast<int>(sizeof(T)); ++i) to[i] = from[i];
}

template <typename T, int kVec>
__device__ __forceinline__ void LoadFloats(const T* p, float (&out)[kVec]) {
  if constexpr (kVec == 1) {
    out[0] = ToFloat(LoadElement(p));
  } else {
    const Pack<T, kVec> pack = *reinterpret_cast<const Pack<T, kVec>*>(p);
#pragma unroll
    for (int i = 0; i < kVec; ++i) out[i] = ToFloat(pack.v[i]);
  }
}

// One warp per row (head, token): amax by butterfly reduction, then quantize.
template <typename T, int kVec>
__global__ void QuantizePerTokenKernel(const T* __restrict__ src, int64_t rows, int64_t cols,
                                       int8_t* __restrict__ dst, float* __restrict__ scales) {
  const int lane = threadIdx.x % kWarpSize;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * kWarpsPerBlock;
  for (int64_t row = static_cast<int64_t>(blockIdx.x) * kWarpsPerBlock + threadIdx.x / kWarpSize;
       row < rows; row += stride) {
    const T* x = src + row * cols;
    float amax = 0.0f;
    for (int64_t c = static_cast<int64_t>(lane) * kVec; c < cols; c += kWarpSize * kVec) {
      float v[kVec];
      LoadFloats<T, kVec>(x + c, v);
#pragma unroll
      for (int i = 0; i < kVec; ++i) amax = fmaxf(amax, fabsf(v[i]));
    }
    amax = cuda_internal::WarpMax(amax);
    const float inv = InverseScaleOf(amax);
    if (lane == 0) scales[row] = ScaleOf(amax);
    int8_t* q = dst + row * cols;
    for (int64_t c = static_cast<int64_t>(lane) * kVec; c < cols; c += kWarpSize * kVec) {
      float v[kVec];
      LoadFloats<T, kVec>(x + c, v);
      Pack<int8_t, kVec> out;
#pragma unroll
      for (int i = 0; i < kVec; ++i) out.v[i] = QuantizeOne(v[i], inv);
      *reinterpret_cast<Pack<int8_t, kVec>*>(q + c) = out;
    }
  }
}

// Block (32 x kChannelRows) per (matrix, chunk of 32 * kVec columns): each thread owns kVec
// columns and strides over rows; the column maxima are combined through shared memory.
template <typename T, int kVec>
__global__ void QuantizePerChannelKernel(const T* __restrict__ src, int64_t mats, int64_t rows,
                                         int64_t cols, int8_t* __restrict__ dst,
                                         float* __restrict__ scales) {
  __shared__ float shared[kChannelRows][kWarpSize][kVec];
  const int tx = threadIdx.x;
  const int ty = threadIdx.y;
  const int64_t chunk_cols = kWarpSize * kVec;
  const int64_t chunks = (cols + chunk_cols - 1) / chunk_cols;
  for (int64_t work = blockIdx.x; work < mats * chunks; work += gridDim.x) {
    const int64_t m = work / chunks;
    const int64_t c = (work % chunks) * chunk_cols + static_cast<int64_t>(tx) * kVec;
    const bool active = c < cols;  // kVec divides cols, so c < cols means all kVec are.
    const T* mat = src + m * rows * cols;
    float amax[kVec];
#pragma unroll
    for (int i = 0; i < kVec; ++i) amax[i] = 0.0f;
    if (active) {
      for (int64_t r = ty; r < rows; r += kChannelRows) {
        float v[kVec];
        LoadFloats<T, kVec>(mat + r * cols + c, v);
#pragma unroll
        for (int i = 0; i < kVec; ++i) amax[i] = fmaxf(amax[i], fabsf(v[i]));
      }
    }
#pragma unroll
    for (int i = 0; i < kVec; ++i) shared[ty][tx][i] = amax[i];
    __syncthreads();
    if (ty == 0) {
#pragma unroll
      for (int i = 0; i < kVec; ++i) {
        float a = shared[0][tx][i];
        for (int y = 1; y < kChannelRows; ++y) a = fmaxf(a, shared[y][tx][i]);
        if (active) scales[m * cols + c + i] = ScaleOf(a);
        shared[0][tx][i] = InverseScaleOf(a);
      }
    }
    __syncthreads();
    float inv[kVec];
#pragma unroll
    for (int i = 0; i < kVec; ++i) inv[i] = shared[0][tx][i];
    if (active) {
      int8_t* qmat = dst + m * rows * cols;
      for (int64_t r = ty; r < rows; r += kChannelRows) {
        float v[kVec];
        LoadFloats<T, kVec>(mat + r * cols + c, v);
        Pack<int8_t, kVec> out;
#pragma unroll
        for (int i = 0; i < kVec; ++i) out.v[i] = QuantizeOne(v[i], inv[i]);
        *reinterpret_cast<Pack<int8_t, kVec>*>(qmat + r * cols + c) = out;
      }
    }
    __syncthreads();  // `shared` is reused by the next work item.
  }
}

// One warp per row; the scale is per row or per (matrix, column).
template <typename T, int kVec, bool kPerChannel>
__global__ void DequantizeKernel(const int8_t* __restrict__ src, const float* __restrict__ scales,
                                 int64_t rows, int64_t rows_per_mat, int64_t cols,
                                 T* __restrict__ dst) {
  const int lane = threadIdx.x % kWarpSize;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * kWarpsPerBlock;
  for (int64_t row = static_cast<int64_t>(blockIdx.x) * kWarpsPerBlock + threadIdx.x / kWarpSize;
       row < rows; row += stride) {
    const float* row_scales = kPerChannel ? scales + (row / rows_per_mat) * cols : scales + row;
    for (int64_t c = static_cast<int64_t>(lane) * kVec; c < cols; c += kWarpSize * kVec) {
      const Pack<int8_t, kVec> q =
          *reinterpret_cast<const Pack<int8_t, kVec>*>(src + row * cols + c);
      Pack<T, kVec> out;
#pragma unroll
      for (int i = 0; i < kVec; ++i) {
        const float s = kPerChannel ? row_scales[c + i] : row_scales[0];
        out.v[i] = FromFloat<T>(__fmul_rn(static_cast<float>(q.v[i]), s));
      }
      if constexpr (kVec == 1) {
        StoreElement(dst + row * cols + c, out.v[0]);
      } else {
        *reinterpret_cast<Pack<T, kVec>*>(dst + row * cols + c) = out;
      }
    }
  }
}

// Widest access: 16 bytes of input per thread when the row length and pointers allow it.
template <typename T>
bool CanVectorize(int64_t cols, const void* data, const void* codes) {
  constexpr int kVec = 16 / sizeof(T);
  return cols % kVec == 0 && cuda_internal::Aligned(data, 16) &&
         cuda_internal::Aligned(codes, kVec);
}

template <typename T>
void LaunchQuantize(const void* src, int64_t heads, int64_t tokens, int64_t cols, QuantAxis axis,
                    int8_t* dst, float* scales, cudaStream_t stream) {
  constexpr int kVec = 16 / sizeof(T);
  const T* s = static_cast<const T*>(src);
  const bool vec = CanVectorize<T>(cols, src, dst);
  if (axis == QuantAxis::kPerToken) {
    const int64_t rows = heads * tokens;
    const unsigned blocks = cuda_internal::BlocksFor(rows, kWarpsPerBlock);
    if (vec) {
      QuantizePerTokenKernel<T, kVec><<<blocks, kThreads, 0, stream>>>(s, rows, cols, dst, scales);
    } else {
      QuantizePerTokenKernel<T, 1><<<blocks, kThreads, 0, stream>>>(s, rows, cols, dst, scales);
    }
    return;
  }
  const dim3 block(kWarpSize, kChannelRows);
  if (vec) {
    const int64_t chunks = (cols + kWarpSize * kVec - 1) / (kWarpSize * kVec);
    const unsigned blocks = cuda_internal::BlocksFor(heads * chunks, 1);
    QuantizePerChannelKernel<T, kVec>
        <<<blocks, block, 0, stream>>>(s, heads, tokens, cols, dst, scales);
  } else {
    const int64_t chunks = (cols + kWarpSize - 1) / kWarpSize;
    const unsigned blocks = cuda_internal::BlocksFor(heads * chunks, 1);
    QuantizePerChannelKernel<T, 1>
        <<<blocks, block, 0, stream>>>(s, heads, tokens, cols, dst, scales);
  }
}

template <typename T>
void LaunchDequantize(const int8_t* src, const float* scales, int64_t heads, int64_t tokens,
                      int64_t cols, QuantAxis axis, void* dst, cudaStream_t stream) {
  constexpr int kVec = 16 / sizeof(T);
  T* d = static_cast<T*>(dst);
  const int64_t rows = heads * tokens;
  const unsigned blocks = cuda_internal::BlocksFor(rows, kWarpsPerBlock);
  const bool vec = CanVectorize<T>(cols, dst, src);
  if (axis == QuantAxis::kPerToken) {
    if (vec) {
      DequantizeKernel<T, kVec, false>
          <<<blocks, kThreads, 0, stream>>>(src, scales, rows, tokens, cols, d);
    } else {
      DequantizeKernel<T, 1, false>
          <<<blocks, kThreads, 0, stream>>>(src, scales, rows, tokens, cols, d);
    }
  } else {
    if (vec) {
      DequantizeKernel<T, kVec, true>
          <<<blocks, kThreads, 0, stream>>>(src, scales, rows, tokens, cols, d);
    } else {
      DequantizeKernel<T, 1, true>
          <<<blocks, kThreads, 0, stream>>>(src, scales, rows, tokens, cols, d);
    }
  }
}

}  // namespace

KernelStatus QuantizeInt8Cuda(const void* src, DType src_dtype, int64_t num_heads,
                              int64_t num_tokens, int64_t head_dim, QuantAxis axis, int8_t* dst,
                              float* scales, cudaStream_t stream) {
  int64_t elements = 0;
  const KernelStatus status = internal::CheckQuantize(src, src_dtype, num_heads, num_tokens,
                                                      head_dim, axis, dst, scales, &elements);
  if (status != KernelStatus::kOk || elements == 0) return status;
  switch (src_dtype) {
    case DType::kFloat16:
      LaunchQuantize<__half>(src, num_heads, num_tokens, head_dim, axis, dst, scales, stream);
      break;
    case DType::kBFloat16:
      LaunchQuantize<__nv_bfloat16>(src, num_heads, num_tokens, head_dim, axis, dst, scales,
                                    stream);
      break;
    default:
      LaunchQuantize<float>(src, num_heads, num_tokens, head_dim, axis, dst, scales, stream);
      break;
  }
  return cuda_internal::LaunchStatus();
}

KernelStatus DequantizeInt8Cuda(const int8_t* src, const float* scales, int64_t num_heads,
                                int64_t num_tokens, int64_t head_dim, QuantAxis axis,
                                DType dst_dtype, void* dst, cudaStream_t stream) {
  int64_t elements = 0;
  const KernelStatus status = internal::CheckQuantize(dst, dst_dtype, num_heads, num_tokens,
                                                      head_dim, axis, src, scales, &elements);
  if (status != KernelStatus::kOk || elements == 0) return status;
  switch (dst_dtype) {
    case DType::kFloat16:
      LaunchDequantize<__half>(src, scales, num_heads, num_tokens, head_dim, axis, dst, stream);
      break;
    case DType::kBFloat16:
      LaunchDequantize<__nv_bfloat16>(src, scales, num_heads, num_tokens, head_dim, axis, dst,
                                      stream);
      break;
    default:
      LaunchDequantize<float>(src, scales, num_heads, num_tokens, head_dim, axis, dst, stream);
      break;
  }
  return cuda_internal::LaunchStatus();
}

}  // namespace kvcache::kernels
