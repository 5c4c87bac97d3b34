// CapacityArbiter: which model gives up a block when the host tier needs
// room.
//
// Each model's blocks in host memory are ranked by a policy of their own
// (ModelState::host_policy, siblings of the configured policy), so that hits
// and commits of different models change different policies side by side.
// The host tier's capacity is still one: the block to evict is the coldest
// of all the models' blocks, which is the coldest of each model's own
// victim (EvictionPolicy::OrderOf compares blocks of siblings). Exactly the
// one policy's choice for LRU; for LRU-K the same comparison of ranks, with
// each model's probation segment its own.
//
// Cost: one PickVictim per model per pick (O(log n) each for LRU-K, the
// first evictable block of the list for LRU), so a batch of evictions
// (Cache::kEvictionBatchBlocks) across M models asks M x batch times. Fine
// for the tens of models a daemon serves; keeping the models in a heap by
// their victim's order would make it O(log M) per pick.
//
// Not thread-safe: used under the cache's lock held exclusively, when no
// model's policy changes but through it.
#ifndef KVCACHE_SERVER_CORE_CAPACITY_ARBITER_H_
#define KVCACHE_SERVER_CORE_CAPACITY_ARBITER_H_

#include <span>

#include "absl/functional/function_ref.h"
#include "server/core/eviction_policy.h"
#include "server/core/prefix_index.h"

namespace kvcache {

class CapacityArbiter {
 public:
  // The coldest block `evictable` accepts among the victims of `policies`
  // (siblings), or nullptr when none has one.
  static IndexNode* PickVictim(std::span<EvictionPolicy* const> policies,
                               absl::FunctionRef<bool(const IndexNode&)> evictable);
};

}  // namespace kvcache

#endif  // KVCACHE_SERVER_CORE_CAPACITY_ARBITER_H_
