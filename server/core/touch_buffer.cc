#include "server/core/touch_buffer.h"

namespace kvcache {

TouchBuffer::TouchBuffer() {
  for (Stripe& s : stripes_) s.touches = std::make_unique<Touch[]>(kStripeCapacity);
}

size_t TouchBuffer::StripeOfThisThread() {
  static std::atomic<size_t> next{0};
  thread_local const size_t stripe = next.fetch_add(1, std::memory_order_relaxed) % kStripes;
  return stripe;
}

bool TouchBuffer::Record(std::span<IndexNode* const> path, absl::Time at) {
  if (path.empty()) return true;
  Stripe& s = stripes_[StripeOfThisThread()];
  // Reserve path.size() slots; readers sharing the stripe reserve apart.
  size_t start = s.used.load(std::memory_order_relaxed);
  do {
    if (path.size() > kStripeCapacity - start) return false;
  } while (!s.used.compare_exchange_weak(start, start + path.size(), std::memory_order_relaxed));
  // The slots are written before the reader lets go of the shared lock,
  // which orders them before a drainer's exclusive section.
  const int64_t nanos = absl::ToUnixNanos(at);
  Touch* out = s.touches.get() + start;
  for (auto it = path.rbegin(); it != path.rend(); ++it) *out++ = {*it, nanos};
  return true;
}

void TouchBuffer::Drain(absl::FunctionRef<void(IndexNode*, absl::Time)> apply) {
  for (Stripe& s : stripes_) {
    const size_t used = s.used.load(std::memory_order_relaxed);
    for (size_t i = 0; i < used; ++i) {
      // The nodes were last read by the readers, long enough ago to have
      // left this core's caches: ask for them ahead of their turn.
      if (i + kPrefetchAhead < used) __builtin_prefetch(s.touches[i + kPrefetchAhead].node, 1);
      apply(s.touches[i].node, absl::FromUnixNanos(s.touches[i].at_unix_nanos));
    }
    s.used.store(0, std::memory_order_relaxed);
  }
}

bool TouchBuffer::empty() const {
  for (const Stripe& s : stripes_) {
    if (s.used.load(std::memory_order_relaxed) != 0) return false;
  }
  return true;
}

}  // namespace kvcache
