#include "server/core/touch_buffer.h"

#include "server/common/thread_index.h"

namespace kvcache {

TouchBuffer::TouchBuffer() {
  for (Stripe& s : stripes_) {
    MutexLock lock(&s.mu);
    s.touches = std::make_unique<Touch[]>(kStripeCapacity);
  }
}

size_t TouchBuffer::StripeOfThisThread() { return ThisThreadIndex() % kStripes; }

bool TouchBuffer::Record(std::span<IndexNode* const> path, absl::Time at) {
  if (path.empty()) return true;
  Stripe& s = stripes_[StripeOfThisThread()];
  const int64_t nanos = absl::ToUnixNanos(at);
  MutexLock lock(&s.mu);
  const size_t used = s.used.load(std::memory_order_relaxed);
  if (path.size() > kStripeCapacity - used) return false;
  Touch* out = s.touches.get() + used;
  for (auto it = path.rbegin(); it != path.rend(); ++it) *out++ = {*it, nanos};
  s.used.store(used + path.size(), std::memory_order_relaxed);
  return true;
}

bool TouchBuffer::Use(std::span<IndexNode* const> path, absl::Time at, Mutex& turn, Apply apply) {
  if (path.empty()) return true;  // a miss touches nothing
  if (path.size() > kStripeCapacity) return false;
  if (turn.TryLock()) {
    ApplyPath(path, at, apply);
    turn.Unlock();
    return true;
  }
  if (Record(path, at)) return true;
  MutexLock my_turn(&turn);  // the stripe is full: wait for the turn
  ApplyPath(path, at, apply);
  return true;
}

void TouchBuffer::InTurn(Mutex& turn, absl::FunctionRef<void()> change) {
  MutexLock my_turn(&turn);
  change();
}

void TouchBuffer::ApplyPath(std::span<IndexNode* const> path, absl::Time at, Apply apply) {
  for (auto it = path.rbegin(); it != path.rend(); ++it) apply(*it, at);
}

void TouchBuffer::DrainLocked(Stripe& s, Apply apply) {
  const size_t used = s.used.load(std::memory_order_relaxed);
  for (size_t i = 0; i < used; ++i) {
    // The nodes were last read by the readers, long enough ago to have
    // left this core's caches: ask for them ahead of their turn.
    if (i + kPrefetchAhead < used) __builtin_prefetch(s.touches[i + kPrefetchAhead].node, 1);
    apply(s.touches[i].node, absl::FromUnixNanos(s.touches[i].at_unix_nanos));
  }
  s.used.store(0, std::memory_order_relaxed);
}

void TouchBuffer::Drain(Apply apply) {
  for (Stripe& s : stripes_) {
    MutexLock lock(&s.mu);
    DrainLocked(s, apply);
  }
}

bool TouchBuffer::empty() const {
  for (const Stripe& s : stripes_) {
    if (s.used.load(std::memory_order_relaxed) != 0) return false;
  }
  return true;
}

}  // namespace kvcache
