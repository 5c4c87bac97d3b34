// DeviceLru: the order in which the GPU tier gives its copies up.
//
// The GPU tier is inclusive (device_tier.h), so any of its copies can be
// dropped without a write; it only needs a recency order over the blocks
// that have a device copy. Those blocks are also tracked by the host or SSD
// tier's EvictionPolicy through IndexNode::policy_hook, so this order is kept
// apart from the node, in a list and a map of its own.
//
// Not thread-safe: the owning Cache serialises access under its lock.
#ifndef KVCACHE_SERVER_CORE_DEVICE_LRU_H_
#define KVCACHE_SERVER_CORE_DEVICE_LRU_H_

#include <cstddef>
#include <list>

#include "absl/container/flat_hash_map.h"
#include "absl/functional/function_ref.h"
#include "server/core/prefix_index.h"

namespace kvcache {

class DeviceLru {
 public:
  // Tracks `node` as the most recently used; moves it there if tracked.
  void Touch(IndexNode* node) {
    auto [it, inserted] = where_.try_emplace(node);
    if (!inserted) order_.erase(it->second);
    order_.push_front(node);
    it->second = order_.begin();
  }
  // Stops tracking `node` (nothing when it is not tracked).
  void Erase(IndexNode* node) {
    auto it = where_.find(node);
    if (it == where_.end()) return;
    order_.erase(it->second);
    where_.erase(it);
  }
  // The least recently used node for which `droppable` holds, looking at
  // most `max_examined` nodes from the cold end; null when none.
  IndexNode* PickVictim(absl::FunctionRef<bool(const IndexNode&)> droppable,
                        size_t max_examined = 4096) const {
    size_t examined = 0;
    for (auto it = order_.rbegin(); it != order_.rend() && examined < max_examined;
         ++it, ++examined) {
      if (droppable(**it)) return *it;
    }
    return nullptr;
  }
  bool contains(const IndexNode* node) const {
    return where_.contains(const_cast<IndexNode*>(node));
  }
  size_t size() const { return where_.size(); }

 private:
  std::list<IndexNode*> order_;  // most recent first
  absl::flat_hash_map<IndexNode*, std::list<IndexNode*>::iterator> where_;
};

}  // namespace kvcache

#endif  // KVCACHE_SERVER_CORE_DEVICE_LRU_H_
