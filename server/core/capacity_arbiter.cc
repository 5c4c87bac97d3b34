#include "server/core/capacity_arbiter.h"

namespace kvcache {

IndexNode* CapacityArbiter::PickVictim(std::span<EvictionPolicy* const> policies,
                                       absl::FunctionRef<bool(const IndexNode&)> evictable) {
  IndexNode* coldest = nullptr;
  EvictionOrder coldest_order;
  for (EvictionPolicy* policy : policies) {
    IndexNode* victim = policy->PickVictim(evictable);
    if (victim == nullptr) continue;
    const EvictionOrder order = policy->OrderOf(*victim);
    if (coldest == nullptr || order < coldest_order) {
      coldest = victim;
      coldest_order = order;
    }
  }
  return coldest;
}

}  // namespace kvcache
