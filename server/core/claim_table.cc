#include "server/core/claim_table.h"

namespace kvcache {

std::vector<bool> ClaimTable::Claim(uint64_t incarnation, std::span<const uint64_t> keys,
                                    const std::vector<bool>& wanted, const void* owner) {
  std::vector<bool> held(keys.size(), false);
  Shard& shard = ShardOf(incarnation);
  MutexLock lock(&shard.mu);
  for (size_t j = 0; j < keys.size(); ++j) {
    if (!wanted[j]) continue;
    auto [it, inserted] = shard.claims.try_emplace({incarnation, keys[j]}, owner);
    held[j] = inserted || it->second == owner;
  }
  return held;
}

void ClaimTable::Release(uint64_t incarnation, std::span<const uint64_t> keys,
                         const std::vector<bool>& held, const void* owner) {
  Shard& shard = ShardOf(incarnation);
  MutexLock lock(&shard.mu);
  for (size_t j = 0; j < keys.size(); ++j) {
    if (!held[j]) continue;
    auto it = shard.claims.find({incarnation, keys[j]});
    if (it != shard.claims.end() && it->second == owner) shard.claims.erase(it);
  }
}

size_t ClaimTable::size() const {
  size_t n = 0;
  for (const Shard& shard : shards_) {
    MutexLock lock(&shard.mu);
    n += shard.claims.size();
  }
  return n;
}

}  // namespace kvcache
