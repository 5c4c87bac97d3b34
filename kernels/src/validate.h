// Internal: argument checks shared by the CPU kernels and their CUDA twins, so both reject
// exactly the same calls. Not part of the public API.
#ifndef KVCACHE_KERNELS_SRC_VALIDATE_H_
#define KVCACHE_KERNELS_SRC_VALIDATE_H_

#include <cstdint>

#include "kvcache/kernels/importance.h"
#include "kvcache/kernels/quantize.h"
#include "kvcache/kernels/types.h"

namespace kvcache::kernels::internal {

// True for kFloat32, kFloat16 and kBFloat16.
bool IsFloatDType(DType dtype);

// Checks each dimension is in [0, kMaxDimension] and that the element count, in bytes of the
// widest dtype, fits comfortably in int64. On success sets *elements (0 for an empty shape).
KernelStatus CheckSlice(int64_t num_heads, int64_t num_tokens, int64_t head_dim, int64_t* elements);

// Quantize and dequantize: float dtype, known axis, non-null buffers when non-empty.
KernelStatus CheckQuantize(const void* data, DType dtype, int64_t num_heads, int64_t num_tokens,
                           int64_t head_dim, QuantAxis axis, const void* codes, const void* scales,
                           int64_t* elements);

KernelStatus CheckNovelty(const void* keys, DType dtype, int64_t num_heads, int64_t num_tokens,
                          int64_t head_dim, const float* novelty);

KernelStatus CheckImportance(int64_t num_tokens, const ImportanceParams& params,
                             const float* scores);

// Shape and pointers only; the CPU version checks the index values itself.
KernelStatus CheckGather(const void* src, DType dtype, int64_t num_heads, int64_t num_tokens,
                         int64_t head_dim, const int32_t* kept, int64_t num_kept, const void* dst);

KernelStatus CheckAttention(const float* q, const float* k, const float* v, int64_t num_queries,
                            int64_t num_keys, int64_t head_dim, const float* out);

}  // namespace kvcache::kernels::internal

#endif  // KVCACHE_KERNELS_SRC_VALIDATE_H_
