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
// Cost: one PickVictim per model for a one-off pick (O(log n) each for
// LRU-K, the first evictable block of the list for LRU). Evictions come in
// batches under one exclusive section (Cache::kEvictionBatchBlocks): a
// Round keeps each model's victim for the rest of the section and asks again
// only a model whose tree changed, so a batch of B evictions across M models
// asks about M + B times, not M x B. Comparing the M victims is O(M) per
// pick; keeping them in a heap would make it O(log M), which the tens of
// models a daemon serves do not need.
//
// Not thread-safe: used under the cache's lock held exclusively, when no
// model's policy changes but through it.
#ifndef KVCACHE_SERVER_CORE_CAPACITY_ARBITER_H_
#define KVCACHE_SERVER_CORE_CAPACITY_ARBITER_H_

#include <span>

#include "absl/container/flat_hash_map.h"
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

  // The picks of one exclusive section, with one `evictable` rule: each
  // policy's victim is asked once and kept until Forget. REQUIRES: the
  // caller forgets a policy whenever a block of its model leaves the index
  // or changes copies (what its victim may be changes); nothing else may
  // change while the round lives (pins are taken under the same lock).
  class Round {
   public:
    IndexNode* Pick(std::span<EvictionPolicy* const> policies,
                    absl::FunctionRef<bool(const IndexNode&)> evictable);
    void Forget(const EvictionPolicy* policy) { victims_.erase(policy); }

   private:
    absl::flat_hash_map<const EvictionPolicy*, IndexNode*> victims_;  // null: none
  };
};

}  // namespace kvcache

#endif  // KVCACHE_SERVER_CORE_CAPACITY_ARBITER_H_
