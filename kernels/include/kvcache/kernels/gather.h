// kvcache/kernels/gather.h: compaction of a KV slice to the tokens that are kept.
//
// After scoring, eviction keeps a subset of tokens; this kernel copies their rows, in order,
// into a dense slice: dst[h][i][:] = src[h][kept[i]][:] for every head h and i < num_kept.
// Works on any dtype including kInt8 (codes) -- it moves bytes. Per-token INT8 scales
// (num_heads x num_tokens fp32) can be compacted with the same call using
// dtype kFloat32 and head_dim 1.
// Output is num_heads * num_kept * head_dim elements, layout as in types.h with num_kept rows.
// The CUDA twin is bit-identical.
// Thread-safety: pure function (see types.h).
#ifndef KVCACHE_KERNELS_GATHER_H_
#define KVCACHE_KERNELS_GATHER_H_

#include <cstdint>

#include "kvcache/kernels/types.h"

namespace kvcache::kernels {

// REQUIRES: kept[0..num_kept) strictly increasing, each in [0, num_tokens) (so
//           num_kept <= num_tokens); dst does not overlap src or kept.
// The CPU version checks the index list and returns kInvalidArgument (writing nothing) when
// it is not sorted or out of range. The CUDA version, whose indices live on the device,
// cannot check cheaply: it zero-fills the rows of out-of-range indices and never reads
// outside src.
KernelStatus GatherTokensCpu(const void* src, DType dtype, int64_t num_heads, int64_t num_tokens,
                             int64_t head_dim, const int32_t* kept, int64_t num_kept, void* dst);

}  // namespace kvcache::kernels

#endif  // KVCACHE_KERNELS_GATHER_H_
