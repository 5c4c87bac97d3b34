#include "server/core/claim_table.h"

namespace kvcache {

std::vector<bool> ClaimTable::Claim(uint64_t incarnation, std::span<const uint64_t> keys,
                                    const std::vector<bool>& wanted, const void* owner) {
  std::vector<bool> held(keys.size(), false);
  MutexLock lock(&mu_);
  for (size_t j = 0; j < keys.size(); ++j) {
    if (!wanted[j]) continue;
    auto [it, inserted] = claims_.try_emplace({incarnation, keys[j]}, owner);
    held[j] = inserted || it->second == owner;
  }
  return held;
}

void ClaimTable::Release(uint64_t incarnation, std::span<const uint64_t> keys,
                         const std::vector<bool>& held, const void* owner) {
  MutexLock lock(&mu_);
  for (size_t j = 0; j < keys.size(); ++j) {
    if (!held[j]) continue;
    auto it = claims_.find({incarnation, keys[j]});
    if (it != claims_.end() && it->second == owner) claims_.erase(it);
  }
}

size_t ClaimTable::size() const {
  MutexLock lock(&mu_);
  return claims_.size();
}

}  // namespace kvcache
