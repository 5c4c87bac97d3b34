// LowerCopies: a block's copies in the levels below host memory, one slot per
// level, in the cache's order (level 0 first: the fastest; the SSD, then a
// remote store). docs/tiers.md, "Levels".
//
// A block may have a copy in any of the levels at once: a copy written to a
// deeper level stays when the block comes back up (it is clean: dropping the
// copy above needs no write). The cache reads a block back from its top copy,
// the fastest level that holds one.
//
// Not thread-safe: a node's slots are the owning cache's, under its lock.
#ifndef KVCACHE_SERVER_CORE_LOWER_COPIES_H_
#define KVCACHE_SERVER_CORE_LOWER_COPIES_H_

#include <cstddef>
#include <cstdint>

#include "server/core/stored_copy.h"

namespace kvcache {

// Levels a cache may have below host memory (the SSD and a remote store).
inline constexpr size_t kMaxLowerLevels = 2;

class LowerCopies {
 public:
  // No level: what top() answers for a block with no lower copy.
  static constexpr int kNone = -1;

  const StoredRef& at(size_t level) const { return copies_[level]; }
  StoredRef& at(size_t level) { return copies_[level]; }

  // The fastest level holding a copy, or kNone.
  int top() const {
    for (size_t i = 0; i < kMaxLowerLevels; ++i) {
      if (copies_[i] != nullptr) return static_cast<int>(i);
    }
    return kNone;
  }
  // The first level after `level` holding a copy, or kNone.
  int below(size_t level) const {
    for (size_t i = level + 1; i < kMaxLowerLevels; ++i) {
      if (copies_[i] != nullptr) return static_cast<int>(i);
    }
    return kNone;
  }
  bool any() const { return top() != kNone; }
  // Copies held, and the sum of their sizes.
  size_t count() const {
    size_t n = 0;
    for (const StoredRef& c : copies_) n += c != nullptr ? 1 : 0;
    return n;
  }
  uint64_t bytes() const {
    uint64_t n = 0;
    for (const StoredRef& c : copies_) n += c != nullptr ? c->seal().size : 0;
    return n;
  }
  // Whether any copy is pinned for `why`.
  bool pinned_for(PinReason why) const {
    for (const StoredRef& c : copies_) {
      if (c != nullptr && c->pins().of(why) != 0) return true;
    }
    return false;
  }
  // The top copy (null when there is none).
  const StoredRef& top_copy() const {
    const int t = top();
    return t == kNone ? kNoCopy : copies_[static_cast<size_t>(t)];
  }

 private:
  static inline const StoredRef kNoCopy;
  StoredRef copies_[kMaxLowerLevels];
};

}  // namespace kvcache

#endif  // KVCACHE_SERVER_CORE_LOWER_COPIES_H_
