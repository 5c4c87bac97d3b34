// kvcache-eval: a minimal parallel for-loop over independent work items.
//
// ParallelFor(n, threads, fn) calls fn(i) exactly once for every i in
// [0, n), on up to `threads` threads (1 or less: inline, in order). Items are
// handed out dynamically. fn must be safe to run concurrently for different
// i (each item writes only its own outputs).
#ifndef KVCACHE_TESTS_EVAL_PARALLEL_H_
#define KVCACHE_TESTS_EVAL_PARALLEL_H_

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <thread>
#include <vector>

namespace kvcache::eval {

template <typename Fn>
void ParallelFor(int64_t n, int threads, Fn&& fn) {
  if (threads <= 1 || n <= 1) {
    for (int64_t i = 0; i < n; ++i) fn(i);
    return;
  }
  std::atomic<int64_t> next{0};
  auto worker = [&] {
    for (int64_t i = next.fetch_add(1); i < n; i = next.fetch_add(1)) fn(i);
  };
  std::vector<std::thread> pool;
  const int64_t count = std::min<int64_t>(threads, n);
  for (int64_t t = 1; t < count; ++t) pool.emplace_back(worker);
  worker();
  for (std::thread& t : pool) t.join();
}

}  // namespace kvcache::eval

#endif  // KVCACHE_TESTS_EVAL_PARALLEL_H_
