// ThisThreadIndex: a small number for the calling thread, handed out in the
// order threads first ask (0, 1, 2, ...) and fixed for the thread's life.
// Striped structures spread threads over their stripes with it
// (`ThisThreadIndex() % kStripes`): threads that start one after another
// land on different stripes.
#ifndef KVCACHE_SERVER_COMMON_THREAD_INDEX_H_
#define KVCACHE_SERVER_COMMON_THREAD_INDEX_H_

#include <atomic>
#include <cstddef>

namespace kvcache {

inline size_t ThisThreadIndex() {
  static std::atomic<size_t> next{0};
  thread_local const size_t index = next.fetch_add(1, std::memory_order_relaxed);
  return index;
}

}  // namespace kvcache

#endif  // KVCACHE_SERVER_COMMON_THREAD_INDEX_H_
