// DeviceCopies: the GPU tier's copies of cached blocks, in the order the tier
// gives them up.
//
// The GPU tier is inclusive (device_tier.h), so any of its copies can be
// dropped without a write; it only needs each block's copy and a recency
// order over them. Few blocks have a device copy compared with the index, so
// the copies live here, keyed by node, rather than in every IndexNode; the
// blocks are also tracked by the host or SSD tier's EvictionPolicy through
// IndexNode::policy_hook.
//
// Not thread-safe: the owning Cache serialises access under its lock.
#ifndef KVCACHE_SERVER_CORE_DEVICE_COPIES_H_
#define KVCACHE_SERVER_CORE_DEVICE_COPIES_H_

#include <cstddef>
#include <list>
#include <utility>

#include "absl/container/flat_hash_map.h"
#include "absl/functional/function_ref.h"
#include "server/core/prefix_index.h"
#include "server/core/tier.h"

namespace kvcache {

// Why a device copy is dropped: for room, past the GPU tier's watermark, or
// because its block's bytes changed (re-encoded, made exact again).
enum class DeviceDrop : uint8_t { kRoom, kPressure, kRecompressed, kRestored };

class DeviceCopies {
 public:
  // `node`'s device copy, or null.
  const StoredRef* Find(const IndexNode* node) const {
    auto it = where_.find(node);
    return it == where_.end() ? nullptr : &it->second->second;
  }
  // Gives `node` the device copy `copy` (REQUIRES: it has none), as the most
  // recently used.
  void Put(IndexNode* node, StoredRef copy) {
    order_.emplace_front(node, std::move(copy));
    where_.emplace(node, order_.begin());
  }
  // Makes `node`'s copy the most recently used (nothing when it has none).
  void Touch(const IndexNode* node) {
    auto it = where_.find(node);
    if (it != where_.end()) order_.splice(order_.begin(), order_, it->second);
  }
  // Removes `node`'s copy and returns it (null when it had none).
  StoredRef Take(const IndexNode* node) {
    auto it = where_.find(node);
    if (it == where_.end()) return nullptr;
    StoredRef copy = std::move(it->second->second);
    order_.erase(it->second);
    where_.erase(it);
    return copy;
  }
  // The node with the least recently used copy for which `droppable` holds,
  // looking at most `max_examined` copies from the cold end; null when none.
  IndexNode* PickVictim(absl::FunctionRef<bool(const StoredRef&)> droppable,
                        size_t max_examined = 4096) const {
    size_t examined = 0;
    for (auto it = order_.rbegin(); it != order_.rend() && examined < max_examined;
         ++it, ++examined) {
      if (droppable(it->second)) return it->first;
    }
    return nullptr;
  }
  size_t size() const { return where_.size(); }

 private:
  using Entry = std::pair<IndexNode*, StoredRef>;
  std::list<Entry> order_;  // most recently used first
  absl::flat_hash_map<const IndexNode*, std::list<Entry>::iterator> where_;
};

}  // namespace kvcache

#endif  // KVCACHE_SERVER_CORE_DEVICE_COPIES_H_
