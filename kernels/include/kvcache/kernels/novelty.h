// kvcache/kernels/novelty.h: semantic novelty of each token's key.
//
// Neighbouring tokens often have nearly identical keys; such a token adds little the previous
// one does not already provide. Novelty is the "semantic_novelty" input of importance scoring:
//   novelty[0] = 1
//   novelty[t] = (1 / H) * sum over heads h of (1 - cos(k[h][t], k[h][t-1])),   t > 0
//   cos(a, b)  = dot(a, b) / sqrt(|a|^2 * |b|^2), clamped to [-1, 1]; 0 if either norm is 0.
// So novelty is in [0, 2]: 0 for a key identical (up to a positive factor) to its
// predecessor in every head, 1 for orthogonal keys, 2 for opposite ones. Dot products and
// norms accumulate in fp32; the ratio is formed in fp64 (so identical keys give exactly 0).
// The CUDA twin agrees within 1e-5 absolute (different summation order).
// Thread-safety: pure function (see types.h).
#ifndef KVCACHE_KERNELS_NOVELTY_H_
#define KVCACHE_KERNELS_NOVELTY_H_

#include <cstdint>

#include "kvcache/kernels/types.h"

namespace kvcache::kernels {

// `keys` is a KV slice (types.h) of dtype kFloat32, kFloat16 or kBFloat16 holding one layer's
// keys for num_heads heads; writes num_tokens values to `novelty`.
// REQUIRES: `novelty` does not overlap `keys`.
KernelStatus KeyNoveltyCpu(const void* keys, DType dtype, int64_t num_heads, int64_t num_tokens,
                           int64_t head_dim, float* novelty);

}  // namespace kvcache::kernels

#endif  // KVCACHE_KERNELS_NOVELTY_H_
