// The Cache's side of its tier moves: a block's copies changing level and
// the lower tier's eviction. The moves themselves (demotion, read-back,
// promotion, prefetch) are TierManager's (tier_manager.h). See cache.h
// ("Tiers") and docs/tiers.md.
#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "server/core/block_move.h"
#include "server/core/cache.h"

namespace kvcache {
void Cache::DropHostCopyLocked(IndexNode* node, std::vector<BlockRef>* dropped) {
  policy_->Release(node);
  payload_bytes_ -= node->payload->size();
  dropped->push_back(std::move(node->payload));
  lower_policy_->Adopt(node);
  ++tier_.lower_only_blocks;
}

void Cache::SetHostCopyLocked(IndexNode* node, BlockRef payload) {
  lower_policy_->Release(node);
  payload_bytes_ += payload->size();
  node->payload = std::move(payload);
  policy_->Adopt(node);
  --tier_.lower_only_blocks;
}

void Cache::DropLowerCopyLocked(IndexNode* node) {
  if (node->lower == nullptr) return;
  --tier_.lower_blocks;
  tier_.lower_payload_bytes -= node->lower->seal().size;
  node->lower.reset();
}

bool Cache::EvictLowerOneLocked(std::vector<BlockRef>* dropped) {
  // A lower-only leaf that nothing pins (leases and reads in flight do).
  IndexNode* victim = lower_policy_->PickVictim(
      [](const IndexNode& n) { return n.is_leaf() && !n.lower->pins().pinned(); });
  if (victim == nullptr) return false;
  tiers_->LogMove(*victim, "ssd", "none", "capacity", victim->lower->seal().size);
  RemoveSubtreeLocked(*models_.OfIndex(victim->index), victim, dropped);
  ++tier_.lower_evictions;
  return true;
}

uint64_t Cache::CommittedHostBytes() const {
  const uint64_t allocated = pool_->GetStats().allocated_bytes;
  return allocated - std::min(allocated, staged_bytes_.load(std::memory_order_relaxed));
}

}  // namespace kvcache
