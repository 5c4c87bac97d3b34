#include "server/core/capacity_arbiter.h"

namespace kvcache {
namespace {

// The coldest of the policies' victims, as `victim_of` gives them.
IndexNode* Coldest(std::span<EvictionPolicy* const> policies,
                   absl::FunctionRef<IndexNode*(EvictionPolicy*)> victim_of) {
  IndexNode* coldest = nullptr;
  EvictionOrder coldest_order;
  for (EvictionPolicy* policy : policies) {
    IndexNode* victim = victim_of(policy);
    if (victim == nullptr) continue;
    const EvictionOrder order = policy->OrderOf(*victim);
    if (coldest == nullptr || order < coldest_order) {
      coldest = victim;
      coldest_order = order;
    }
  }
  return coldest;
}

}  // namespace

IndexNode* CapacityArbiter::PickVictim(std::span<EvictionPolicy* const> policies,
                                       absl::FunctionRef<bool(const IndexNode&)> evictable) {
  return Coldest(policies, [&](EvictionPolicy* policy) { return policy->PickVictim(evictable); });
}

IndexNode* CapacityArbiter::Round::Pick(std::span<EvictionPolicy* const> policies,
                                        absl::FunctionRef<bool(const IndexNode&)> evictable) {
  return Coldest(policies, [&](EvictionPolicy* policy) {
    auto [known, asked] = victims_.try_emplace(policy, nullptr);
    if (asked) known->second = policy->PickVictim(evictable);
    return known->second;
  });
}

}  // namespace kvcache
