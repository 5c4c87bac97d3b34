// TouchBuffer: the uses of cached blocks that readers make while they share
// the cache's lock, kept for the next holder of the exclusive lock to apply.
//
// A hit (a lookup or a fetch of cached blocks) changes nothing in the index
// but the blocks' recency: their place in the eviction policy, their last
// access and their use count. Applying that needs the policy, which is one
// for the whole cache, so a hit that applied it itself would need the lock
// exclusively and every hit of every model would queue behind every other.
// Instead a hit holds the lock shared, records its blocks here, and the
// cache applies the recorded touches, in order, whenever a thread takes the
// lock exclusively, before it does anything else. A block is removed from
// the index only under the exclusive lock, so a recorded block is still in
// the index when its touch is applied. This is Caffeine's read buffer, but
// it never drops a touch: a reader that finds no room applies its touches
// itself under the exclusive lock (Record returns false).
//
// Recording is striped: each thread records into one of kStripes stripes
// (threads are spread over them round-robin), so readers on different cores
// rarely write the same cache line. Within a stripe, touches are applied in
// the order recorded; across stripes the order is the stripes' (two readers
// on different stripes are concurrent, so either order is one they could
// have had). A reader records a path leaf first, so a parent is never
// applied as colder than its child.
//
// Thread-safety: Record under the owner's lock held shared (any number of
// threads at once); Drain and empty() under it held exclusively.
#ifndef KVCACHE_SERVER_CORE_TOUCH_BUFFER_H_
#define KVCACHE_SERVER_CORE_TOUCH_BUFFER_H_

#include <array>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>

#include "absl/functional/function_ref.h"
#include "absl/time/time.h"

namespace kvcache {

struct IndexNode;

class TouchBuffer {
 public:
  static constexpr size_t kStripes = 8;
  // Touches a stripe holds (16 bytes each; 1 MiB for the eight): a
  // 128K-token prompt of 16-token blocks, or 256 hits of 32 blocks, between
  // two exclusive sections. Fewer make the exclusive sections that apply
  // them more frequent, and each costs every reader a wait: 2,048 gave 0.62
  // of a cache per model with 4 threads on 2 cores, 8,192 gave 0.92
  // (cache_scaling_benchmark).
  static constexpr size_t kStripeCapacity = 8192;

  TouchBuffer();
  TouchBuffer(const TouchBuffer&) = delete;
  TouchBuffer& operator=(const TouchBuffer&) = delete;

  // Records a use at `at` of each block of `path` (a path from the first
  // block down), leaf first, on the calling thread's stripe. False, and
  // nothing recorded, when the stripe has no room for all of them.
  bool Record(std::span<IndexNode* const> path, absl::Time at);

  // Calls `apply` for every recorded touch (see the file comment for the
  // order) and empties the buffer.
  void Drain(absl::FunctionRef<void(IndexNode*, absl::Time)> apply);

  // Whether nothing is recorded.
  bool empty() const;

 private:
  struct Touch {
    IndexNode* node;
    int64_t at_unix_nanos;
  };
  struct alignas(64) Stripe {
    std::atomic<size_t> used{0};
    std::unique_ptr<Touch[]> touches;
  };
  static size_t StripeOfThisThread();
  static constexpr size_t kPrefetchAhead = 8;

  std::array<Stripe, kStripes> stripes_;
};

}  // namespace kvcache

#endif  // KVCACHE_SERVER_CORE_TOUCH_BUFFER_H_
