// kvcache/kernels/cuda_kernels.h: the CUDA twins of the CPU kernels.
//
// Available when the library is built with CUDA (CMake target kvcache::kernels_cuda). Each
// `FooCuda` has the arguments, contract and results of `FooCpu` (see the header named next to
// it, which also states the parity tolerance), with these differences:
//   * Every data pointer is a device pointer (or managed memory). Scalars and `params` are
//     passed by value at launch.
//   * The work is enqueued on `stream` and runs asynchronously; the call returns once the
//     kernel is launched. Buffers must stay valid until the stream reaches that point.
//   * Argument errors return kInvalidArgument before anything is launched. A failed launch
//     returns kDeviceError (cudaGetLastError() is consumed); errors raised while the kernel
//     runs surface at the caller's next synchronisation, as usual in CUDA.
//   * No dynamic allocation, no synchronisation, no host <-> device copies.
// Thread-safety: as in CUDA; concurrent calls on different streams are independent.
#ifndef KVCACHE_KERNELS_CUDA_KERNELS_H_
#define KVCACHE_KERNELS_CUDA_KERNELS_H_

#include <cuda_runtime_api.h>

#include <cstdint>

#include "kvcache/kernels/attention.h"
#include "kvcache/kernels/gather.h"
#include "kvcache/kernels/importance.h"
#include "kvcache/kernels/novelty.h"
#include "kvcache/kernels/quantize.h"
#include "kvcache/kernels/types.h"

namespace kvcache::kernels {

// True when the CUDA runtime reports at least one usable device. Any runtime error (no
// driver, no device, incompatible driver) counts as "no device". Thread-safe.
bool CudaDeviceAvailable();

// quantize.h; bit-identical to the CPU twin.
KernelStatus QuantizeInt8Cuda(const void* src, DType src_dtype, int64_t num_heads,
                              int64_t num_tokens, int64_t head_dim, QuantAxis axis, int8_t* dst,
                              float* scales, cudaStream_t stream);
KernelStatus DequantizeInt8Cuda(const int8_t* src, const float* scales, int64_t num_heads,
                                int64_t num_tokens, int64_t head_dim, QuantAxis axis,
                                DType dst_dtype, void* dst, cudaStream_t stream);

// novelty.h; within 1e-5 absolute of the CPU twin.
KernelStatus KeyNoveltyCuda(const void* keys, DType dtype, int64_t num_heads, int64_t num_tokens,
                            int64_t head_dim, float* novelty, cudaStream_t stream);

// importance.h; within 1e-6 relative of the CPU twin.
KernelStatus ImportanceScoresCuda(const float* attention, const float* novelty, int64_t num_tokens,
                                  const ImportanceParams& params, float* scores,
                                  cudaStream_t stream);

// gather.h; bit-identical to the CPU twin for valid index lists.
KernelStatus GatherTokensCuda(const void* src, DType dtype, int64_t num_heads, int64_t num_tokens,
                              int64_t head_dim, const int32_t* kept, int64_t num_kept, void* dst,
                              cudaStream_t stream);

// attention.h; within the tolerances stated there.
KernelStatus ReferenceAttentionCuda(const float* q, const float* k, const float* v,
                                    int64_t num_queries, int64_t num_keys, int64_t head_dim,
                                    float* out, float* weights, cudaStream_t stream);

}  // namespace kvcache::kernels

#endif  // KVCACHE_KERNELS_CUDA_KERNELS_H_
