// kvcache::gpu::Mutex and MutexLock: the lock of the GPU tier library, with
// its own thread-safety annotation macros.
//
// gpu/ builds standalone with CUDA and CMake only (no Abseil), so it cannot
// use server/common/mutex.h or absl/base/thread_annotations.h. This is the same
// wrapper: a std::mutex (which ThreadSanitizer understands natively) whose
// Lock/Unlock/AssertHeld carry Clang's capability attributes, so fields marked
// KVCACHE_GPU_GUARDED_BY(mu_) and helpers marked
// KVCACHE_GPU_EXCLUSIVE_LOCKS_REQUIRED(mu_) are proven under -Wthread-safety
// (tests/thread_safety_check.sh). The macros expand to Clang's attributes, the
// ones ABSL_GUARDED_BY and friends expand to, and to nothing for other
// compilers (GCC, nvcc's host passes).
//
// Thread-safe, as a mutex is. AssertHeld() checks the owner in debug builds.
#ifndef KVCACHE_GPU_MUTEX_H_
#define KVCACHE_GPU_MUTEX_H_

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <thread>

#if defined(__clang__)
#define KVCACHE_GPU_THREAD_ANNOTATION_(x) __attribute__((x))
#else
#define KVCACHE_GPU_THREAD_ANNOTATION_(x)
#endif

#define KVCACHE_GPU_GUARDED_BY(x) KVCACHE_GPU_THREAD_ANNOTATION_(guarded_by(x))
#define KVCACHE_GPU_ACQUIRED_BEFORE(...) \
  KVCACHE_GPU_THREAD_ANNOTATION_(acquired_before(__VA_ARGS__))
#define KVCACHE_GPU_EXCLUSIVE_LOCKS_REQUIRED(...) \
  KVCACHE_GPU_THREAD_ANNOTATION_(exclusive_locks_required(__VA_ARGS__))
#define KVCACHE_GPU_LOCKS_EXCLUDED(...) KVCACHE_GPU_THREAD_ANNOTATION_(locks_excluded(__VA_ARGS__))
#define KVCACHE_GPU_LOCKABLE KVCACHE_GPU_THREAD_ANNOTATION_(lockable)
#define KVCACHE_GPU_SCOPED_LOCKABLE KVCACHE_GPU_THREAD_ANNOTATION_(scoped_lockable)
#define KVCACHE_GPU_EXCLUSIVE_LOCK_FUNCTION(...) \
  KVCACHE_GPU_THREAD_ANNOTATION_(exclusive_lock_function(__VA_ARGS__))
#define KVCACHE_GPU_UNLOCK_FUNCTION(...) \
  KVCACHE_GPU_THREAD_ANNOTATION_(unlock_function(__VA_ARGS__))
#define KVCACHE_GPU_ASSERT_EXCLUSIVE_LOCK(...) \
  KVCACHE_GPU_THREAD_ANNOTATION_(assert_exclusive_lock(__VA_ARGS__))

namespace kvcache::gpu {

class KVCACHE_GPU_LOCKABLE Mutex {
 public:
  Mutex() = default;
  Mutex(const Mutex&) = delete;
  Mutex& operator=(const Mutex&) = delete;

  void Lock() KVCACHE_GPU_EXCLUSIVE_LOCK_FUNCTION() {
    mu_.lock();
    SetOwner();
  }
  void Unlock() KVCACHE_GPU_UNLOCK_FUNCTION() {
    ClearOwner();
    mu_.unlock();
  }
  // BasicLockable, for std::unique_lock<Mutex> and std::condition_variable_any.
  void lock() KVCACHE_GPU_EXCLUSIVE_LOCK_FUNCTION() { Lock(); }
  void unlock() KVCACHE_GPU_UNLOCK_FUNCTION() { Unlock(); }

  // Tells the analysis that the caller holds this mutex where it cannot see
  // so; in debug builds it also checks that the calling thread holds it.
  void AssertHeld() const KVCACHE_GPU_ASSERT_EXCLUSIVE_LOCK() {
#ifndef NDEBUG
    if (owner_.load(std::memory_order_relaxed) != std::this_thread::get_id()) {
      std::fprintf(stderr, "gpu::Mutex::AssertHeld: the calling thread does not hold the mutex\n");
      std::abort();
    }
#endif
  }

 private:
#ifndef NDEBUG
  void SetOwner() { owner_.store(std::this_thread::get_id(), std::memory_order_relaxed); }
  void ClearOwner() { owner_.store(std::thread::id(), std::memory_order_relaxed); }
  std::atomic<std::thread::id> owner_{};
#else
  void SetOwner() {}
  void ClearOwner() {}
#endif
  std::mutex mu_;
};

// Holds `mu` for its scope.
class KVCACHE_GPU_SCOPED_LOCKABLE MutexLock {
 public:
  explicit MutexLock(Mutex* mu) KVCACHE_GPU_EXCLUSIVE_LOCK_FUNCTION(mu) : mu_(mu) { mu_->Lock(); }
  ~MutexLock() KVCACHE_GPU_UNLOCK_FUNCTION() { mu_->Unlock(); }
  MutexLock(const MutexLock&) = delete;
  MutexLock& operator=(const MutexLock&) = delete;

 private:
  Mutex* const mu_;
};

}  // namespace kvcache::gpu

#endif  // KVCACHE_GPU_MUTEX_H_
