// Mutex and MutexLock: the lock the cache core uses.
//
// A std::mutex with Clang thread-safety annotations, so ABSL_GUARDED_BY and
// friends are checked under -Wthread-safety. It is used instead of
// absl::Mutex because the distribution's Abseil is built without
// ThreadSanitizer annotations (TSan cannot see absl::Mutex and reports false
// races) and with deadlock detection on (a large constant cost per lock);
// TSan understands std::mutex natively.
#ifndef KVCACHE_SERVER_CORE_MUTEX_H_
#define KVCACHE_SERVER_CORE_MUTEX_H_

#include <mutex>

#include "absl/base/thread_annotations.h"

namespace kvcache {

class ABSL_LOCKABLE Mutex {
 public:
  Mutex() = default;
  Mutex(const Mutex&) = delete;
  Mutex& operator=(const Mutex&) = delete;

  void Lock() ABSL_EXCLUSIVE_LOCK_FUNCTION() { mu_.lock(); }
  void Unlock() ABSL_UNLOCK_FUNCTION() { mu_.unlock(); }
  // BasicLockable, for std::unique_lock<Mutex> and std::condition_variable_any.
  void lock() ABSL_EXCLUSIVE_LOCK_FUNCTION() { mu_.lock(); }
  void unlock() ABSL_UNLOCK_FUNCTION() { mu_.unlock(); }
  // Tells the thread-safety analysis that the caller holds this mutex where
  // it cannot see so (a lambda called under the lock). Checks nothing.
  void AssertHeld() const ABSL_ASSERT_EXCLUSIVE_LOCK() {}

 private:
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

#endif  // KVCACHE_SERVER_CORE_MUTEX_H_
