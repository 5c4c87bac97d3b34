// Mutex and MutexLock: the lock the cache core uses.
//
// A std::mutex with Clang thread-safety annotations, so ABSL_GUARDED_BY and
// friends are checked under -Wthread-safety. It is used instead of
// absl::Mutex because the distribution's Abseil is built without
// ThreadSanitizer annotations (TSan cannot see absl::Mutex and reports false
// races) and with deadlock detection on (a large constant cost per lock);
// TSan understands std::mutex natively.
#ifndef KVCACHE_SERVER_COMMON_MUTEX_H_
#define KVCACHE_SERVER_COMMON_MUTEX_H_

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <thread>

#include "absl/base/thread_annotations.h"

namespace kvcache {

// The thread holding an exclusive lock, tracked in debug builds only, for
// the locks' AssertHeld (Mutex, SharedMutex).
class LockOwner {
 public:
#ifndef NDEBUG
  void Set() { owner_.store(std::this_thread::get_id(), std::memory_order_relaxed); }
  void Clear() { owner_.store(std::thread::id(), std::memory_order_relaxed); }
  // Aborts with `message` unless the calling thread is the owner.
  void Check(const char* message) const {
    if (owner_.load(std::memory_order_relaxed) != std::this_thread::get_id()) {
      std::fprintf(stderr, "%s\n", message);
      std::abort();
    }
  }

 private:
  std::atomic<std::thread::id> owner_{};
#else
  void Set() {}
  void Clear() {}
  void Check(const char*) const {}
#endif
};

class ABSL_LOCKABLE Mutex {
 public:
  Mutex() = default;
  Mutex(const Mutex&) = delete;
  Mutex& operator=(const Mutex&) = delete;

  void Lock() ABSL_EXCLUSIVE_LOCK_FUNCTION() {
    mu_.lock();
    SetOwner();
  }
  void Unlock() ABSL_UNLOCK_FUNCTION() {
    ClearOwner();
    mu_.unlock();
  }
  // BasicLockable, for std::unique_lock<Mutex> and std::condition_variable_any.
  void lock() ABSL_EXCLUSIVE_LOCK_FUNCTION() { Lock(); }
  void unlock() ABSL_UNLOCK_FUNCTION() { Unlock(); }
  // Takes it if it is free; false (not taken) otherwise.
  bool TryLock() ABSL_EXCLUSIVE_TRYLOCK_FUNCTION(true) {
    if (!mu_.try_lock()) return false;
    SetOwner();
    return true;
  }

  // Tells the thread-safety analysis that the caller holds this mutex where
  // it cannot see so (a lambda called under the lock). In debug builds it
  // also checks that the calling thread holds it, and aborts if not.
  void AssertHeld() const ABSL_ASSERT_EXCLUSIVE_LOCK() {
    owner_.Check("Mutex::AssertHeld: the calling thread does not hold the mutex");
  }

 private:
  void SetOwner() { owner_.Set(); }
  void ClearOwner() { owner_.Clear(); }
  LockOwner owner_;
  std::mutex mu_;
};

// Holds `mu` for its scope.
class ABSL_SCOPED_LOCKABLE MutexLock {
 public:
  explicit MutexLock(Mutex* mu) ABSL_EXCLUSIVE_LOCK_FUNCTION(mu) : mu_(mu) { mu_->Lock(); }
  ~MutexLock() ABSL_UNLOCK_FUNCTION() { mu_->Unlock(); }
  MutexLock(const MutexLock&) = delete;
  MutexLock& operator=(const MutexLock&) = delete;

 private:
  Mutex* const mu_;
};

}  // namespace kvcache

#endif  // KVCACHE_SERVER_COMMON_MUTEX_H_
