// TouchBuffer: the uses of cached blocks that readers make while they share
// the cache's lock, kept to be applied in batches.
//
// A hit (a lookup or a fetch of cached blocks) changes nothing in the index
// but the blocks' recency: their place in their model's eviction policy,
// their last access and their use count. Applying that needs the policy,
// which is one per model, so a hit that applied it at will would race the
// other hits of its model. Instead a hit holds the cache's lock shared and
// hands its blocks, with its model's turn (a mutex per model), to Use():
//   - when no other reader is applying touches of that model (its turn is
//     free), it applies them at once, while its nodes are in this core's
//     caches;
//   - else it records them on this thread's stripe and goes on;
//   - when that stripe is full, it waits for the model's turn and applies
//     its blocks then (still holding the lock shared: the others go on).
// And whenever a thread takes the lock exclusively, it applies every stripe
// before it does anything else (Drain), so no eviction reads an order with
// touches still pending. Readers holding a model's turn (Use, InTurn) are
// the only readers that change that model's policy, one at a time; readers
// of different models apply side by side; a writer holds the lock
// exclusively and so never runs beside them. A block is removed from the
// index only under the exclusive lock, which begins with a Drain, so a
// recorded block is still in the index when its touch is applied. This is
// Caffeine's read buffer, but it never drops a touch.
//
// Recording is striped: each thread records into one of kStripes stripes
// (threads are spread over them round-robin), each with its own small lock,
// so readers on different cores rarely write the same cache line. A stripe
// holds touches of any model, so only an exclusive section applies it:
// touches are applied in the order recorded within a stripe, the stripes
// one after the other, and a thread's recorded touches may be applied after
// its later ones that found the turn free (recency a little off, never an
// order the policies forbid). A reader records and applies a path leaf
// first, so a parent is never applied as colder than its child.
//
// Thread-safety: Use and InTurn under the owner's lock held shared, by any
// number of threads; Drain and (exactly) empty() under it held
// exclusively. The owner keeps the rules above that keep the recorded
// nodes alive; the caller passes the turn of the path's model.
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
  // block down, of the model whose turn is `turn`), applied leaf first
  // through `apply` or recorded, as the file comment says. False, with
  // nothing applied or recorded, when the path is longer than a stripe (the
  // caller applies it under its exclusive lock).
  bool Use(std::span<IndexNode* const> path, absl::Time at, Mutex& turn, Apply apply);

  // Records `path` (leaf first) on the calling thread's stripe without
  // trying to apply it (what Use does when the turn is taken); false, and
  // nothing recorded, when the stripe has no room for all of it.
  bool Record(std::span<IndexNode* const> path, absl::Time at);

  // Waits for `turn` (a model's) and runs `change` holding it: for a reader
  // that must change the model's policy itself beside other readers (an
  // append's commit adding its new blocks to it, then touching its path).
  static void InTurn(Mutex& turn, absl::FunctionRef<void()> change);

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
  // Applies `path` leaf first. REQUIRES: its model's turn held.
  static void ApplyPath(std::span<IndexNode* const> path, absl::Time at, Apply apply);
  static constexpr size_t kPrefetchAhead = 8;

  std::array<Stripe, kStripes> stripes_;
};

}  // namespace kvcache

#endif  // KVCACHE_SERVER_CORE_TOUCH_BUFFER_H_
