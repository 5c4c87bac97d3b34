// kvcache/kernels/quantize.h: symmetric INT8 quantization of KV slices (KIVI-style).
//
// Cold KV is demoted from fp16/bf16/fp32 to INT8 with one fp32 scale per group. Following KIVI
// (Liu et al., 2024), the grouping differs for keys and values because their outliers differ:
//   * keys:   QuantAxis::kPerChannel, one scale per (head, channel) over the slice's tokens;
//             scales has num_heads * head_dim entries, index h * head_dim + d.
//   * values: QuantAxis::kPerToken, one scale per (head, token) over head_dim;
//             scales has num_heads * num_tokens entries, index h * num_tokens + t.
// Layout of data and codes: see "KV slice" in types.h; codes use the same indexing as data.
//
// Formula (per group G, in fp32 arithmetic, round-to-nearest-even everywhere):
//   A     = max over x in G of |x|
//   scale = A / 127                      (stored)
//   inv   = A > 0 ? 127 / A : 0
//   q(x)  = round_half_even(clamp(x * inv, -127, 127))     (int8 in [-127, 127]; -128 unused)
//   x'    = q * scale                    (then rounded to the output dtype)
// Error bound, for every finite x:
//   |x' - x| <= scale * (0.5 + 2^-15) + |x'| * u + eta,
//   u = 0 (f32), 2^-11 (f16), 2^-8 (bf16); eta = 2^-25 for f16 (subnormal outputs), else 0.
// So the error is at most half a quantization step; on Gaussian data the relative RMSE is
// about A / (127 * sqrt(12) * sigma), i.e. 0.5%-0.8% for groups of 64-128 elements.
// Exactness: if a group's values are k * 2^e with integer |k| <= 127 and some |k| = 127, the
// round trip reproduces them bit for bit. A group of zeros gets scale 0 and codes 0.
// The CUDA twins produce bit-identical codes, scales and dequantized values.
//
// Thread-safety: pure functions (see types.h).
#ifndef KVCACHE_KERNELS_QUANTIZE_H_
#define KVCACHE_KERNELS_QUANTIZE_H_

#include <cstdint>

#include "kvcache/kernels/types.h"

namespace kvcache::kernels {

enum class QuantAxis : int32_t {
  kPerChannel = 0,  // One scale per (head, channel): use for keys.
  kPerToken = 1,    // One scale per (head, token): use for values.
};

// Number of scales a slice of this shape needs (num_heads * head_dim or
// num_heads * num_tokens); -1 for an invalid shape or axis.
int64_t Int8ScaleCount(QuantAxis axis, int64_t num_heads, int64_t num_tokens, int64_t head_dim);

// Quantizes the KV slice `src` (dtype kFloat32, kFloat16 or kBFloat16) into int8 codes `dst`
// (num_heads * num_tokens * head_dim bytes) and fp32 `scales` (Int8ScaleCount entries).
// REQUIRES: buffers do not overlap.
KernelStatus QuantizeInt8Cpu(const void* src, DType src_dtype, int64_t num_heads,
                             int64_t num_tokens, int64_t head_dim, QuantAxis axis, int8_t* dst,
                             float* scales);

// Inverse of QuantizeInt8Cpu: writes q * scale, rounded to `dst_dtype` (kFloat32, kFloat16 or
// kBFloat16), into the KV slice `dst`.
// REQUIRES: buffers do not overlap.
KernelStatus DequantizeInt8Cpu(const int8_t* src, const float* scales, int64_t num_heads,
                               int64_t num_tokens, int64_t head_dim, QuantAxis axis,
                               DType dst_dtype, void* dst);

}  // namespace kvcache::kernels

#endif  // KVCACHE_KERNELS_QUANTIZE_H_
