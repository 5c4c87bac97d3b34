// The Cache's side of its tier moves: a block's copies changing level (and
// the policy that ranks it with them) and the lower levels' eviction. The moves themselves
// (demotion, read-back, promotion, prefetch) are TierManager's (tier_manager.h). See cache.h
// ("Tiers") and docs/tiers.md.
#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "server/core/block_move.h"
#include "server/core/cache.h"

namespace kvcache {
void Cache::DropHostCopyLocked(IndexNode* node, std::vector<BlockRef>* dropped) {
  const size_t top = static_cast<size_t>(node->lower.top());
  node->index->host_policy()->Release(node);
  payload_bytes_ -= node->payload->size();
  dropped->push_back(std::move(node->payload));
  lower_policies_[top]->Adopt(node);
  ++tier_.lower[top].only_blocks;
}

void Cache::SetHostCopyLocked(IndexNode* node, BlockRef payload) {
  const size_t top = static_cast<size_t>(node->lower.top());
  lower_policies_[top]->Release(node);
  --tier_.lower[top].only_blocks;
  payload_bytes_ += payload->size();
  node->payload = std::move(payload);
  node->index->host_policy()->Adopt(node);
}

void Cache::AddLowerCopyLocked(IndexNode* node, size_t level, StoredRef copy) {
  const uint64_t size = copy->seal().size;
  const int top = node->lower.top();
  const bool new_top = node->payload == nullptr && top > static_cast<int>(level);
  if (new_top) {  // a copy above the block's top one: it ranks here now
    lower_policies_[static_cast<size_t>(top)]->Release(node);
    --tier_.lower[static_cast<size_t>(top)].only_blocks;
  }
  node->lower.at(level) = std::move(copy);
  ++tier_.lower[level].blocks;
  tier_.lower[level].payload_bytes += size;
  if (new_top) {
    lower_policies_[level]->Adopt(node);
    ++tier_.lower[level].only_blocks;
  }
}

void Cache::DropLowerCopyLocked(IndexNode* node, size_t level) {
  if (node->lower.at(level) == nullptr) return;
  const bool was_top = node->payload == nullptr && node->lower.top() == static_cast<int>(level);
  if (was_top) {
    lower_policies_[level]->Release(node);
    --tier_.lower[level].only_blocks;
  }
  --tier_.lower[level].blocks;
  tier_.lower[level].payload_bytes -= node->lower.at(level)->seal().size;
  node->lower.at(level).reset();
  if (was_top) {  // its next copy down ranks it now
    const size_t top = static_cast<size_t>(node->lower.top());
    lower_policies_[top]->Adopt(node);
    ++tier_.lower[top].only_blocks;
  }
}

void Cache::DropLowerCopiesLocked(IndexNode* node) {
  for (size_t level = 0; level < lower_.size(); ++level) DropLowerCopyLocked(node, level);
}

bool Cache::FreeLowerLevelLocked(size_t level, std::vector<BlockRef>* dropped) {
  // Nothing pins the copy (leases and reads in flight do); a block with no
  // copy below must be a leaf to leave.
  IndexNode* victim = lower_policies_[level]->PickVictim([level](const IndexNode& n) {
    return !n.lower.at(level)->pins().pinned() &&
           (n.is_leaf() || n.lower.below(level) != LowerCopies::kNone);
  });
  if (victim == nullptr) return false;
  const uint64_t size = victim->lower.at(level)->seal().size;
  if (const int below = victim->lower.below(level); below != LowerCopies::kNone) {
    tiers_->LogMove(*victim, lower_names_[level].c_str(),
                    lower_names_[static_cast<size_t>(below)].c_str(), "clean", size);
    ++tier_.lower[static_cast<size_t>(below)].clean_drops;
    DropLowerCopyLocked(victim, level);
    return true;
  }
  tiers_->LogMove(*victim, lower_names_[level].c_str(), "none", "capacity", size);
  RemoveSubtreeLocked(*models_.OfIndex(victim->index), victim, dropped);
  ++tier_.lower[level].evictions;
  return true;
}

bool Cache::EvictLowerLeafLocked(absl::FunctionRef<bool(const IndexNode&)> also, const char* reason,
                                 std::vector<BlockRef>* dropped) {
  for (size_t level = lower_.size(); level-- > 0;) {
    IndexNode* victim = lower_policies_[level]->PickVictim([&](const IndexNode& n) {
      return n.is_leaf() && !n.lower.at(level)->pins().pinned() && also(n);
    });
    if (victim == nullptr) continue;
    tiers_->LogMove(*victim, lower_names_[level].c_str(), "none", reason,
                    victim->lower.at(level)->seal().size);
    RemoveSubtreeLocked(*models_.OfIndex(victim->index), victim, dropped);
    ++tier_.lower[level].evictions;
    return true;
  }
  return false;
}

uint64_t Cache::CommittedHostBytes() const {
  const uint64_t allocated = pool_->GetStats().allocated_bytes;
  return allocated - std::min(allocated, staged_bytes_.load(std::memory_order_relaxed));
}

}  // namespace kvcache
