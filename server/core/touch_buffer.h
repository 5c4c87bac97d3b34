// TouchBuffer: the uses of cached blocks that readers make while they share
// the cache's lock, kept to be applied in batches.
//
// A hit (a lookup or a fetch of cached blocks) changes nothing in the index
// but the blocks' recency: their place in the eviction policy, their last
// access and their use count. Applying that needs the policy, which is one
// for the whole cache, so a hit that applied it itself would need the lock
// exclusively and every hit of every model would queue behind every other.
// Instead a hit holds the lock shared and hands its blocks to Use():
//   - when no other reader is applying touches (the buffer's turn is free),
//     it applies them at once, while its nodes are in this core's caches
//     (after this thread's recorded touches, to keep its order);
//   - else it records them on this thread's stripe and goes on;
//   - when that stripe is full, it waits for the turn and applies the
//     stripe and then its blocks (still holding the lock shared: the others
//     go on).
// And whenever a thread takes the lock exclusively, it applies every stripe
// before it does anything else (Drain), so no eviction reads an order with
// touches still pending. Readers holding the turn (Use, InTurn) are the
// only readers that change the policy, one at a time; a writer holds the lock exclusively and
// so never runs beside them. A block is removed from the index only under
// the exclusive lock, which begins with a Drain, so a recorded block is
// still in the index when its touch is applied. This is Caffeine's read
// buffer, but it never drops a touch.
//
// Recording is striped: each thread records into one of kStripes stripes
// (threads are spread over them round-robin), each with its own small lock,
// so readers on different cores rarely write the same cache line. Within a
// stripe, touches are applied in the order recorded; across stripes the
// order is the stripes' (two readers on different stripes are concurrent,
// so either order is one they could have had). A reader records a path leaf
// first, so a parent is never applied as colder than its child.
//
// Thread-safety: Use under the owner's lock held shared, by any number of
// threads; Drain and (exactly) empty() under it held exclusively. The owner
// keeps the rules above that keep the recorded nodes alive; the buffer
// keeps the turns.
#ifndef KVCACHE_SERVER_CORE_TOUCH_BUFFER_H_
#define KVCACHE_SERVER_CORE_TOUCH_BUFFER_H_

#include <array>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>

#include "absl/base/thread_annotations.h"
#include "absl/functional/function_ref.h"
#include "absl/time/time.h"
#include "server/common/mutex.h"

namespace kvcache {

struct IndexNode;

class TouchBuffer {
 public:
  static constexpr size_t kStripes = 8;
  // Touches a stripe holds (16 bytes each; 1 MiB for the eight): a
  // 128K-token prompt of 16-token blocks, or 256 hits of 32 blocks.
  static constexpr size_t kStripeCapacity = 8192;

  using Apply = absl::FunctionRef<void(IndexNode*, absl::Time)>;

  TouchBuffer();
  TouchBuffer(const TouchBuffer&) = delete;
  TouchBuffer& operator=(const TouchBuffer&) = delete;

  // A reader's use at `at` of each block of `path` (a path from the first
  // block down), applied leaf first through `apply` or recorded, as the file
  // comment says. False, with nothing applied or recorded, when the path is
  // longer than a stripe (the caller applies it under its exclusive lock).
  bool Use(std::span<IndexNode* const> path, absl::Time at, Apply apply);

  // Records `path` (leaf first) on the calling thread's stripe without
  // trying to apply it (what Use does when the turn is taken); false, and
  // nothing recorded, when the stripe has no room for all of it.
  bool Record(std::span<IndexNode* const> path, absl::Time at);

  // Waits for the turn, applies this thread's recorded touches through
  // `apply`, then runs `change` holding the turn: for a reader that must
  // change the policy itself beside other readers (an append's commit
  // adding its new blocks to it, then touching its path).
  void InTurn(Apply apply, absl::FunctionRef<void()> change);

  // Calls `apply` for every recorded touch (see the file comment for the
  // order) and empties the buffer.
  void Drain(Apply apply);

  // Whether nothing is recorded. Exact when no thread records or drains
  // meanwhile (the owner's exclusive lock); a hint otherwise.
  bool empty() const;

 private:
  struct Touch {
    IndexNode* node;
    int64_t at_unix_nanos;
  };
  struct alignas(64) Stripe {
    Mutex mu;
    // Written under mu; read without it by empty().
    std::atomic<size_t> used{0};
    std::unique_ptr<Touch[]> touches ABSL_GUARDED_BY(mu);
  };
  static size_t StripeOfThisThread();
  static void DrainLocked(Stripe& s, Apply apply) ABSL_EXCLUSIVE_LOCKS_REQUIRED(s.mu);
  // Applies the calling thread's stripe. REQUIRES: the turn held.
  void DrainStripeOfThisThread(Apply apply) ABSL_EXCLUSIVE_LOCKS_REQUIRED(turn_);
  // Applies the calling thread's stripe, then `path` leaf first.
  void ApplyInTurn(std::span<IndexNode* const> path, absl::Time at, Apply apply)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(turn_);
  static constexpr size_t kPrefetchAhead = 8;

  std::array<Stripe, kStripes> stripes_;
  Mutex turn_;  // held by the one reader applying touches
};

}  // namespace kvcache

#endif  // KVCACHE_SERVER_CORE_TOUCH_BUFFER_H_
