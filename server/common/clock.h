// Clock: where the core reads time, so tests can move it by hand.
#ifndef KVCACHE_SERVER_COMMON_CLOCK_H_
#define KVCACHE_SERVER_COMMON_CLOCK_H_

#include "absl/base/thread_annotations.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "server/common/mutex.h"

namespace kvcache {

// Thread-safe.
class Clock {
 public:
  virtual ~Clock() = default;
  virtual absl::Time Now() const = 0;
};

class SystemClock final : public Clock {
 public:
  absl::Time Now() const override { return absl::Now(); }
  // A process-wide instance; it has no state.
  static Clock* Get() {
    static SystemClock clock;
    return &clock;
  }
};

// A clock that only moves when told to.
class ManualClock final : public Clock {
 public:
  explicit ManualClock(absl::Time start = absl::UnixEpoch() + absl::Hours(24 * 365 * 50))
      : now_(start) {}
  absl::Time Now() const override {
    MutexLock lock(&mu_);
    return now_;
  }
  void Advance(absl::Duration d) {
    MutexLock lock(&mu_);
    now_ += d;
  }

 private:
  mutable Mutex mu_;
  absl::Time now_ ABSL_GUARDED_BY(mu_);
};

}  // namespace kvcache

#endif  // KVCACHE_SERVER_COMMON_CLOCK_H_
