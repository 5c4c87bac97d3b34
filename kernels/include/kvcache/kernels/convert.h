// kvcache/kernels/convert.h: conversions between fp32 and the 16-bit float formats.
//
// The CPU kernels read and write fp16 / bf16 as raw bit patterns. These routines are the single
// definition of how bits become floats and back, shared by the kernels, the tests and callers
// that need to prepare or inspect 16-bit KV data on the host.
//
// Semantics (identical to the CUDA intrinsics __half2float / __float2half_rn /
// __bfloat162float / __float2bfloat16_rn, and to the F16C instructions):
//   * 16-bit -> fp32 is exact for every input, including subnormals, Inf and NaN.
//   * fp32 -> 16-bit rounds to nearest, ties to even; overflow gives +-Inf; subnormal results
//     are produced (no flush to zero); NaN stays NaN (quieted, sign kept).
// The array versions pick an AVX2+F16C implementation at run time when the CPU has it, and a
// portable auto-vectorized one otherwise; both give bit-identical results.
// Thread-safety: all functions are pure.
#ifndef KVCACHE_KERNELS_CONVERT_H_
#define KVCACHE_KERNELS_CONVERT_H_

#include <cstdint>

#include "kvcache/kernels/types.h"

namespace kvcache::kernels {

float HalfBitsToFloat(uint16_t bits);
uint16_t FloatToHalfBits(float value);
float BFloat16BitsToFloat(uint16_t bits);
uint16_t FloatToBFloat16Bits(float value);

// Converts `count` elements from `src` (of `src_dtype`) to `dst` (of `dst_dtype`).
// Supported dtypes: kFloat32, kFloat16, kBFloat16 (any pair, including identity, which copies).
// REQUIRES: src and dst do not overlap.
// Returns kInvalidArgument for an unsupported dtype, a negative count or a null pointer with
// count > 0.
KernelStatus ConvertCpu(const void* src, DType src_dtype, int64_t count, DType dst_dtype,
                        void* dst);

}  // namespace kvcache::kernels

#endif  // KVCACHE_KERNELS_CONVERT_H_
