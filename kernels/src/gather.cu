// CUDA twin of gather.h: one warp per output row, copying with the widest access (16, 8, 4, 2
// or 1 bytes) that the row size and both base pointers allow.
#include <cstdint>

#include "cuda_common.cuh"
#include "kvcache/kernels/cuda_kernels.h"
#include "validate.h"

namespace kvcache::kernels {
namespace {

using cuda_internal::kWarpSize;

constexpr int kThreads = 256;
constexpr int kWarpsPerBlock = kThreads / kWarpSize;

// U is the copy unit; rows are row_units units long. Out-of-range indices give zero rows.
template <typename U>
__global__ void GatherKernel(const U* __restrict__ src, int64_t tokens, int64_t row_units,
                             const int32_t* __restrict__ kept, int64_t num_kept, int64_t out_rows,
                             U* __restrict__ dst) {
  const int lane = threadIdx.x % kWarpSize;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * kWarpsPerBlock;
  for (int64_t row = static_cast<int64_t>(blockIdx.x) * kWarpsPerBlock + threadIdx.x / kWarpSize;
       row < out_rows; row += stride) {
    const int64_t head = row / num_kept;
    const int64_t index = kept[row % num_kept];
    U* out = dst + row * row_units;
    if (index < 0 || index >= tokens) {
      for (int64_t u = lane; u < row_units; u += kWarpSize) out[u] = U{};
      continue;
    }
    const U* in = src + (head * tokens + index) * row_units;
    for (int64_t u = lane; u < row_units; u += kWarpSize) out[u] = in[u];
  }
}

template <typename U>
void Launch(const void* src, int64_t tokens, int64_t row_bytes, const int32_t* kept,
            int64_t num_kept, int64_t out_rows, void* dst, cudaStream_t stream) {
  GatherKernel<U><<<cuda_internal::BlocksFor(out_rows, kWarpsPerBlock), kThreads, 0, stream>>>(
      static_cast<const U*>(src), tokens, row_bytes / static_cast<int64_t>(sizeof(U)), kept,
      num_kept, out_rows, static_cast<U*>(dst));
}

}  // namespace

KernelStatus GatherTokensCuda(const void* src, DType dtype, int64_t num_heads, int64_t num_tokens,
                              int64_t head_dim, const int32_t* kept, int64_t num_kept, void* dst,
                              cudaStream_t stream) {
  const KernelStatus status =
      internal::CheckGather(src, dtype, num_heads, num_tokens, head_dim, kept, num_kept, dst);
  if (status != KernelStatus::kOk) return status;
  if (num_heads == 0 || num_kept == 0 || head_dim == 0) return KernelStatus::kOk;
  const int64_t row_bytes = head_dim * static_cast<int64_t>(DTypeSize(dtype));
  const int64_t out_rows = num_heads * num_kept;
  auto fits = [&](size_t unit) {
    return row_bytes % static_cast<int64_t>(unit) == 0 && cuda_internal::Aligned(src, unit) &&
           cuda_internal::Aligned(dst, unit);
  };
  if (fits(16)) {
    Launch<uint4>(src, num_tokens, row_bytes, kept, num_kept, out_rows, dst, stream);
  } else if (fits(8)) {
    Launch<uint2>(src, num_tokens, row_bytes, kept, num_kept, out_rows, dst, stream);
  } else if (fits(4)) {
    Launch<uint32_t>(src, num_tokens, row_bytes, kept, num_kept, out_rows, dst, stream);
  } else if (fits(2)) {
    Launch<uint16_t>(src, num_tokens, row_bytes, kept, num_kept, out_rows, dst, stream);
  } else {
    Launch<uint8_t>(src, num_tokens, row_bytes, kept, num_kept, out_rows, dst, stream);
  }
  return cuda_internal::LaunchStatus();
}

}  // namespace kvcache::kernels
