// ChunkStripes: the per-thread caches of free chunks in front of a
// SlabPool's central lists (see "Per-thread caches" in slab_pool.h).
//
// One stripe per CPU (at least 16), each a lock (StripeLock, below) and,
// per cached size class, a bin of free chunk addresses (most recently freed
// last). A thread uses the stripe of the CPU it runs on (sched_getcpu()
// modulo the stripe count), so threads running at the same time use
// different stripes however many threads there are; two threads meet on a
// stripe only when one is preempted or migrated while it holds it (the
// lock keeps that correct). Threads that run on a CPU one after another
// share its chunks.
//
// A stripe only stores addresses: it never maps, unmaps, poisons or checks
// memory, and knows nothing of spans. The pool decides what to cache, fills
// bins from its central lists and takes chunks back; the stripe keeps the
// bounds: a bin holds at most its class's `bin_chunks`, and a stripe at most
// `stripe_bytes` of chunks over all its bins. Each stripe's bins live in one
// cache-line-aligned block of their own, so stripes share no cache line.
//
// Locking: a stripe's contents are guarded by its lock. A thread holds at
// most one stripe's lock at a time, except through AllStripesLock, which
// takes them all in index order; the pool's mutex is only ever taken after
// a stripe's lock (never the other way round).
#ifndef KVCACHE_SERVER_CORE_SLAB_STRIPES_H_
#define KVCACHE_SERVER_CORE_SLAB_STRIPES_H_

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <thread>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "server/common/mutex.h"

namespace kvcache {

// A stripe's lock, a spin lock: taking it is one atomic exchange and giving
// it back a release store, where std::mutex pays two atomic
// read-modify-writes (per Allocate or Free, 8 to 10 ns more with threads on
// the benchmark machine). A waiter spins a little, then yields its CPU
// until the lock is free: it never sleeps in the kernel. That suits a lock
// held for a few dozen instructions by whichever thread runs on its CPU;
// it is held longer only while a refill, spill or flush goes through the
// pool's mutex (a refill may map and pin a new span meanwhile), or while
// GetStats or PlanCompaction hold every stripe.
// TSan sees its acquire and release; AssertHeld checks the owner in debug
// builds.
class ABSL_LOCKABLE StripeLock {
 public:
  void Lock() ABSL_EXCLUSIVE_LOCK_FUNCTION() {
    while (held_.exchange(true, std::memory_order_acquire)) WaitUntilFree();
    owner_.Set();
  }
  void Unlock() ABSL_UNLOCK_FUNCTION() {
    owner_.Clear();
    held_.store(false, std::memory_order_release);
  }
  void AssertHeld() const ABSL_ASSERT_EXCLUSIVE_LOCK() {
    owner_.Check("StripeLock::AssertHeld: the calling thread does not hold the lock");
  }

 private:
  void WaitUntilFree() const {
    for (int spins = 0; held_.load(std::memory_order_relaxed); ++spins) {
      if (spins < 128) {
#if defined(__x86_64__) || defined(__i386__)
        __builtin_ia32_pause();
#endif
      } else {
        std::this_thread::yield();
      }
    }
  }

  std::atomic<bool> held_{false};
  LockOwner owner_;
};

// Holds a StripeLock for its scope.
class ABSL_SCOPED_LOCKABLE StripeLockHolder {
 public:
  explicit StripeLockHolder(StripeLock* lock) ABSL_EXCLUSIVE_LOCK_FUNCTION(lock) : lock_(lock) {
    lock_->Lock();
  }
  ~StripeLockHolder() ABSL_UNLOCK_FUNCTION() { lock_->Unlock(); }
  StripeLockHolder(const StripeLockHolder&) = delete;
  StripeLockHolder& operator=(const StripeLockHolder&) = delete;

 private:
  StripeLock* const lock_;
};

// How one size class is cached: chunk_bytes, and the most chunks one bin of
// it holds (0: the class is not cached). A bin's refill and spill move half
// of bin_chunks (at least one) at once.
struct CachedClass {
  uint64_t chunk_bytes = 0;
  uint32_t bin_chunks = 0;

  uint32_t Batch() const { return bin_chunks > 1 ? bin_chunks / 2 : 1; }
};

// One stripe. Not thread-safe by itself: every method REQUIRES mu held.
class alignas(64) ChunkStripe {
 public:
  // `classes` (by class index) must outlive the stripe.
  ChunkStripe(const std::vector<CachedClass>* classes, uint64_t stripe_bytes);

  mutable StripeLock mu;

  // The most recently cached chunk of `class_index`, taken out of the bin;
  // nullptr when the bin is empty.
  std::byte* Pop(int class_index) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu);
  // How many more chunks of `class_index` fit: in its bin, with the
  // stripe's bytes within stripe_bytes.
  uint64_t Room(int class_index) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu);
  // Room(class_index) > 0, without a division.
  bool HasRoom(int class_index) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu);
  // REQUIRES: HasRoom(class_index).
  void Push(int class_index, std::byte* chunk) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu);
  // Takes the `n` (at most) least recently cached chunks of `class_index` out
  // of its bin and appends them to `out`.
  void TakeOldest(int class_index, uint32_t n, std::vector<std::byte*>* out)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu);
  // Empties every bin, appending (class_index, chunk) pairs to `out`.
  void TakeAll(std::vector<std::pair<int, std::byte*>>* out) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu);

  uint64_t cached_bytes() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) { return bytes_; }
  uint64_t cached_chunks() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
    return chunks_.load(std::memory_order_relaxed);
  }
  // Whether the stripe held no chunk when last looked at, read without its
  // lock: a flush skips such stripes instead of locking every one (a full
  // pool's every failed Allocate flushes). A chunk parked at the same time
  // may be missed, as it would be by a flush that took the lock just before.
  bool SeemsEmpty() const { return chunks_.load(std::memory_order_relaxed) == 0; }
  uint64_t cached_chunks(int class_index) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
    return bins_[class_index].count;
  }

 private:
  // A class's bin: slots_[first, first + bin_chunks), the `count` oldest first.
  struct Bin {
    uint32_t first = 0;
    uint32_t count = 0;
  };
  struct AlignedDelete {
    void operator()(void* p) const;
  };

  const std::vector<CachedClass>& classes_;
  const uint64_t stripe_bytes_;
  // One cache-line-aligned block per stripe holding the bins (by class
  // index) and then their slots, so no two stripes write one cache line.
  std::unique_ptr<std::byte, AlignedDelete> storage_;
  Bin* const bins_;
  std::byte** const slots_;
  uint64_t bytes_ ABSL_GUARDED_BY(mu) = 0;
  // Written under mu only (SetChunks); atomic so that SeemsEmpty may read it
  // without the lock.
  std::atomic<uint64_t> chunks_{0};
  void SetChunks(uint64_t n) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
    chunks_.store(n, std::memory_order_relaxed);
  }
};

class ChunkStripes {
 public:
  // The fewest stripes (more where the machine has more CPUs).
  static constexpr size_t kMinStripes = 16;

  // `classes` by the pool's class index (bin_chunks 0 for classes not
  // cached, and for indices that are no class).
  ChunkStripes(std::vector<CachedClass> classes, uint64_t stripe_bytes);
  ChunkStripes(const ChunkStripes&) = delete;  // the stripes point at classes_
  ChunkStripes& operator=(const ChunkStripes&) = delete;

  bool Caches(int class_index) const { return classes_[class_index].bin_chunks > 0; }
  const CachedClass& Class(int class_index) const { return classes_[class_index]; }

  size_t count() const { return stripes_.size(); }
  // The stripe of the CPU the calling thread runs on.
  ChunkStripe& Mine();
  ChunkStripe& Stripe(size_t i) { return *stripes_[i]; }
  const ChunkStripe& Stripe(size_t i) const { return *stripes_[i]; }

 private:
  const std::vector<CachedClass> classes_;
  std::vector<std::unique_ptr<ChunkStripe>> stripes_;
};

// Holds every stripe's mutex, taken in index order, for its scope: a
// consistent view of all stripes (the pool's exact stats, compaction).
// Code reading a stripe under it calls stripe.mu.AssertHeld() first.
class AllStripesLock {
 public:
  explicit AllStripesLock(const ChunkStripes& stripes) ABSL_NO_THREAD_SAFETY_ANALYSIS;
  ~AllStripesLock() ABSL_NO_THREAD_SAFETY_ANALYSIS;
  AllStripesLock(const AllStripesLock&) = delete;
  AllStripesLock& operator=(const AllStripesLock&) = delete;

 private:
  const ChunkStripes& stripes_;
};

}  // namespace kvcache

#endif  // KVCACHE_SERVER_CORE_SLAB_STRIPES_H_
