// SharedMutex: a reader-writer lock whose readers do not contend with each
// other and whose writers are not starved, with Clang thread-safety
// annotations, and its scoped holders.
//
// Readers hold it shared (ReaderMutexLock), writers exclusively
// (WriterMutexLock). Built for many short readers (cache hits) and writers
// that come often too (appends):
//   - a reader counts itself in one of kReaderSlots counters, each on its own
//     cache line (threads are spread over them), so readers on different
//     cores write no common line: a lock shared by every hit would otherwise
//     bounce between the cores on every acquisition;
//   - a writer takes a std::mutex, raises a flag that turns new readers
//     away, and waits for the counted readers to leave. A reader turned away
//     waits on the same std::mutex, so a stream of readers cannot keep a
//     writer waiting, and a writer that lets go may take it again at once
//     (glibc's writer-preferring pthread_rwlock instead hands the lock to the
//     next waiting writer, a context switch per append: appends from two
//     threads ran at a tenth of one thread's rate).
// A thread must never take it shared twice (a writer arriving between the
// two would deadlock it), nor shared then exclusively.
//
// ThreadSanitizer sees it through std::mutex and the atomics it is made of.
#ifndef KVCACHE_SERVER_COMMON_SHARED_MUTEX_H_
#define KVCACHE_SERVER_COMMON_SHARED_MUTEX_H_

#include <array>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <mutex>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "server/common/mutex.h"
#include "server/common/thread_index.h"

namespace kvcache {

class ABSL_LOCKABLE SharedMutex {
 public:
  static constexpr size_t kReaderSlots = 16;

  SharedMutex() = default;
  SharedMutex(const SharedMutex&) = delete;
  SharedMutex& operator=(const SharedMutex&) = delete;

  void Lock() ABSL_EXCLUSIVE_LOCK_FUNCTION() {
    writers_.lock();
    writing_.store(true, std::memory_order_seq_cst);
    for (const ReaderSlot& slot : readers_) {
      while (slot.count.load(std::memory_order_seq_cst) != 0) std::this_thread::yield();
    }
    SetOwner();
  }
  void Unlock() ABSL_UNLOCK_FUNCTION() {
    ClearOwner();
    writing_.store(false, std::memory_order_release);
    writers_.unlock();
  }
  void ReaderLock() ABSL_SHARED_LOCK_FUNCTION() {
    std::atomic<uint32_t>& count = readers_[SlotOfThisThread()].count;
    for (;;) {
      // Counted, then the flag read: a writer raises the flag, then reads
      // the counts (both sequentially consistent), so one of the two sees
      // the other.
      count.fetch_add(1, std::memory_order_seq_cst);
      if (!writing_.load(std::memory_order_seq_cst)) return;
      count.fetch_sub(1, std::memory_order_release);
      std::lock_guard<std::mutex> wait_for_the_writer(writers_);
    }
  }
  void ReaderUnlock() ABSL_UNLOCK_FUNCTION() {
    readers_[SlotOfThisThread()].count.fetch_sub(1, std::memory_order_release);
  }
  // Takes it shared if that needs no wait: false while a writer holds it or
  // waits for readers to leave.
  bool TryReaderLock() ABSL_SHARED_TRYLOCK_FUNCTION(true) {
    std::atomic<uint32_t>& count = readers_[SlotOfThisThread()].count;
    count.fetch_add(1, std::memory_order_seq_cst);
    if (!writing_.load(std::memory_order_seq_cst)) return true;
    count.fetch_sub(1, std::memory_order_release);
    return false;
  }

  // Tells the analysis that the caller holds the lock exclusively where it
  // cannot see so (a lambda called under it); debug builds check it.
  void AssertHeld() const ABSL_ASSERT_EXCLUSIVE_LOCK() {
    owner_.Check("SharedMutex::AssertHeld: the calling thread does not hold it");
  }
  // The same for a caller holding it at least shared (not checked: readers
  // are counted, not named).
  void AssertReaderHeld() const ABSL_ASSERT_SHARED_LOCK() {}

 private:
  struct alignas(64) ReaderSlot {
    std::atomic<uint32_t> count{0};
  };
  static size_t SlotOfThisThread() { return ThisThreadIndex() % kReaderSlots; }
  void SetOwner() { owner_.Set(); }
  void ClearOwner() { owner_.Clear(); }
  LockOwner owner_;
  std::array<ReaderSlot, kReaderSlots> readers_;
  alignas(64) std::atomic<bool> writing_{false};
  std::mutex writers_;  // held by the writer; readers turned away wait on it
};

// Holds `mu` exclusively for its scope.
class ABSL_SCOPED_LOCKABLE WriterMutexLock {
 public:
  explicit WriterMutexLock(SharedMutex* mu) ABSL_EXCLUSIVE_LOCK_FUNCTION(mu) : mu_(mu) {
    mu_->Lock();
  }
  ~WriterMutexLock() ABSL_UNLOCK_FUNCTION() { mu_->Unlock(); }
  WriterMutexLock(const WriterMutexLock&) = delete;
  WriterMutexLock& operator=(const WriterMutexLock&) = delete;

 private:
  SharedMutex* const mu_;
};

// Holds `mu` shared for its scope.
class ABSL_SCOPED_LOCKABLE ReaderMutexLock {
 public:
  explicit ReaderMutexLock(SharedMutex* mu) ABSL_SHARED_LOCK_FUNCTION(mu) : mu_(mu) {
    mu_->ReaderLock();
  }
  ~ReaderMutexLock() ABSL_UNLOCK_FUNCTION() { mu_->ReaderUnlock(); }
  ReaderMutexLock(const ReaderMutexLock&) = delete;
  ReaderMutexLock& operator=(const ReaderMutexLock&) = delete;

 private:
  SharedMutex* const mu_;
};

}  // namespace kvcache

#endif  // KVCACHE_SERVER_COMMON_SHARED_MUTEX_H_
