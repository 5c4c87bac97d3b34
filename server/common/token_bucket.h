// TokenBucket: a rate limit in bytes (or any unit) per second, holding at
// most one second of it (a burst of `rate`).
//
//   TokenBucket bucket(256 << 20);              // 256 MiB/s; 0: no limit
//   if (bucket.TryTake(size, clock->Now())) ... // admission: take or refuse
//   absl::SleepFor(bucket.Take(size, now));     // pacing: how long to wait
//
// Take() always takes (the balance may go below zero) and returns how long
// the caller must wait for the balance to be back at zero: a writer that
// sleeps that long after each piece runs at `rate` on average, however large
// its pieces. A bucket starts full.
//
// Not thread-safe: its owner guards it.
#ifndef KVCACHE_SERVER_COMMON_TOKEN_BUCKET_H_
#define KVCACHE_SERVER_COMMON_TOKEN_BUCKET_H_

#include <algorithm>
#include <cstdint>

#include "absl/time/time.h"

namespace kvcache {

class TokenBucket {
 public:
  // `rate` units per second; 0: unlimited (every take succeeds at once).
  explicit TokenBucket(uint64_t rate) : rate_(static_cast<double>(rate)) {}

  bool unlimited() const { return rate_ == 0; }

  // Takes `n` units if the bucket holds them at `now`; false (and nothing
  // taken) if not.
  bool TryTake(uint64_t n, absl::Time now) {
    if (unlimited()) return true;
    Refill(now);
    if (balance_ < static_cast<double>(n)) return false;
    balance_ -= static_cast<double>(n);
    return true;
  }

  // Takes `n` units at `now`, into debt if need be; returns how long until
  // the balance is back at zero (zero when it did not go below).
  absl::Duration Take(uint64_t n, absl::Time now) {
    if (unlimited()) return absl::ZeroDuration();
    Refill(now);
    balance_ -= static_cast<double>(n);
    if (balance_ >= 0) return absl::ZeroDuration();
    return absl::Seconds(-balance_ / rate_);
  }

 private:
  void Refill(absl::Time now) {
    if (filled_at_ == absl::InfinitePast()) {
      balance_ = rate_;  // starts full
    } else if (now > filled_at_) {
      balance_ = std::min(rate_, balance_ + rate_ * absl::ToDoubleSeconds(now - filled_at_));
    }
    filled_at_ = std::max(filled_at_, now);
  }

  const double rate_;
  double balance_ = 0;
  absl::Time filled_at_ = absl::InfinitePast();
};

}  // namespace kvcache

#endif  // KVCACHE_SERVER_COMMON_TOKEN_BUCKET_H_
