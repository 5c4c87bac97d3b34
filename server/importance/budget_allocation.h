// The budget rule ("quantize first"): which precision each (layer, KV head,
// token) entry of one block gets so that its version-2 encoding
// (block_codec.h) fits a byte budget. This is tests/eval/kv_policies.py
// allocate() with int4=True, applied to one block:
//
//   1. Fixed entries (attention sinks, pinned ranges, non-finite values) are
//      full; every other entry starts at INT8.
//   2. The free entries are ordered least important first: by rank_first
//      (entries that rank above every other, e.g. the recent window), then by
//      score, ties by flat index [layer][head][token] ascending (a stable sort).
//   3. If the all-INT8 map fits, the most important INT8 entries are promoted
//      to full, as many as fit. Otherwise the least important are demoted to
//      INT4, as few as fit; if even all-INT4 does not fit, the least important
//      are pruned, as few as fit; if nothing fits, everything free is pruned
//      (fits == false).
//   "As many / as few as fit" is the reference's binary search over the
//   count (sizes are nearly but not exactly monotone in it: a group's K
//   ranges appear with its first INT8 or INT4 entry), reproduced literally so
//   the daemon decides as the evaluation measured.
//
// Thread-safety: pure.
#ifndef KVCACHE_SERVER_IMPORTANCE_BUDGET_ALLOCATION_H_
#define KVCACHE_SERVER_IMPORTANCE_BUDGET_ALLOCATION_H_

#include <cstdint>
#include <span>
#include <vector>

#include "absl/status/statusor.h"
#include "server/importance/block_codec.h"

namespace kvcache::importance {

struct BudgetAllocation {
  std::vector<TokenPrecision> precision;  // shape.entries() values, [layer][head][token]
  uint64_t bytes = 0;                     // CompressedSizeV2 of `precision`
  bool fits = false;                      // bytes <= the budget
  uint32_t promoted = 0;                  // INT8 entries promoted to full (step 3, first branch)
  uint32_t int4 = 0;                      // entries at INT4
  uint32_t pruned = 0;                    // entries pruned
};

// scores, fixed_full and rank_first have shape.entries() values each
// (fixed_full / rank_first: nonzero for yes; either may be empty for none).
// Non-finite scores count as 0. budget_bytes: the most bytes the encoding may
// take (e.g. target_bytes * shape.raw_bytes()).
// INVALID_ARGUMENT for an invalid shape or mismatched sizes.
absl::StatusOr<BudgetAllocation> AllocateBudget(const BlockShape& shape,
                                                std::span<const float> scores,
                                                std::span<const uint8_t> fixed_full,
                                                std::span<const uint8_t> rank_first,
                                                double budget_bytes);

}  // namespace kvcache::importance

#endif  // KVCACHE_SERVER_IMPORTANCE_BUDGET_ALLOCATION_H_
