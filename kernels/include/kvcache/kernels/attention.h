// kvcache/kernels/attention.h: reference single-head attention, for evaluating compression.
//
//   weights = softmax(Q K^T / sqrt(head_dim))     [num_queries][num_keys], rows sum to 1
//   out     = weights V                           [num_queries][head_dim]
//
// All fp32, row-major: q is [num_queries][head_dim], k and v are [num_keys][head_dim]. No mask:
// every query sees every key. The softmax subtracts the row maximum first, so it does not
// overflow for any finite input. This is an evaluation tool (compare the output over full KV
// with the output over compacted / dequantized KV), not a production attention kernel.
// CPU accuracy: within 1e-5 relative of an fp64 evaluation for head_dim <= 256 and
// |scores| < 30. The CUDA twin agrees with the CPU within 1e-5 absolute on weights and
// 1e-5 * max|v| on out.
// Thread-safety: pure function (see types.h).
#ifndef KVCACHE_KERNELS_ATTENTION_H_
#define KVCACHE_KERNELS_ATTENTION_H_

#include <cstdint>

#include "kvcache/kernels/types.h"

namespace kvcache::kernels {

// Writes out[num_queries][head_dim] and, when `weights` is not null, the attention weights
// weights[num_queries][num_keys]. num_queries == 0 is a no-op; otherwise num_keys and head_dim
// must be >= 1 (a softmax over no keys is undefined), else kInvalidArgument.
// REQUIRES: out and weights do not overlap each other or the inputs.
KernelStatus ReferenceAttentionCpu(const float* q, const float* k, const float* v,
                                   int64_t num_queries, int64_t num_keys, int64_t head_dim,
                                   float* out, float* weights);

}  // namespace kvcache::kernels

#endif  // KVCACHE_KERNELS_ATTENTION_H_
