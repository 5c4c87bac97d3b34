// Shared helpers of the SlabPool unit tests (slab_pool_test.cc,
// slab_pool_model_test.cc, slab_pool_compaction_test.cc): a pool of a given
// shape, byte patterns written into allocations and checked, the check that
// every span went back, and the span length the header promises for a class.
// Test-only.
#ifndef KVCACHE_SERVER_CORE_SLAB_POOL_TEST_UTIL_H_
#define KVCACHE_SERVER_CORE_SLAB_POOL_TEST_UTIL_H_

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <memory>
#include <utility>

#include "server/core/slab_pool.h"

namespace kvcache::slab_pool_test {

inline constexpr uint64_t kKiB = 1024;
inline constexpr uint64_t kMiB = 1024 * kKiB;

inline std::unique_ptr<SlabPool> MakePool(
    uint64_t capacity, uint64_t slab, uint64_t min_class,
    uint64_t thread_cache = SlabPoolOptions{}.thread_cache_bytes) {
  SlabPoolOptions options;
  options.capacity_bytes = capacity;
  options.slab_bytes = slab;
  options.min_class_bytes = min_class;
  options.thread_cache_bytes = thread_cache;
  auto pool = SlabPool::Create(options);
  EXPECT_TRUE(pool.ok()) << pool.status();
  return pool.ok() ? std::move(*pool) : nullptr;
}

// Writes `token` at the start of every 64-byte line and into the last 8 bytes.
// Allocations are 64-byte aligned, so two overlapping ones share a line.
inline void WriteTokens(const Allocation& a, uint64_t token) {
  for (uint64_t off = 0; off < a.bytes; off += 64) std::memcpy(a.data + off, &token, 8);
  std::memcpy(a.data + a.bytes - 8, &token, 8);
}

inline bool TokensIntact(const Allocation& a, uint64_t token) {
  uint64_t v;
  for (uint64_t off = 0; off < a.bytes; off += 64) {
    std::memcpy(&v, a.data + off, 8);
    if (v != token) return false;
  }
  std::memcpy(&v, a.data + a.bytes - 8, 8);
  return v == token;
}

// With nothing live: nothing counts as allocated while chunks sit in the
// per-thread caches, and once they are flushed every span is released.
inline void ExpectAllReleased(SlabPool& pool) {
  SlabPoolStats stats = pool.GetStats();
  EXPECT_EQ(stats.allocated_bytes, 0u);
  EXPECT_EQ(stats.live_allocations, 0u);
  pool.FlushThreadCaches();
  stats = pool.GetStats();
  EXPECT_EQ(stats.reserved_bytes, 0u);
  EXPECT_EQ(stats.cached_bytes, 0u);
  EXPECT_EQ(stats.allocated_bytes, 0u);
}

// Fills every 8-byte word of `a` (usable sizes are multiples of 64) with a
// value derived from `token` and the word's index.
inline void FillWords(const Allocation& a, uint64_t token) {
  for (uint64_t i = 0; i < a.bytes / 8; ++i) {
    const uint64_t v = token ^ (i * 0x9e3779b97f4a7c15ULL);
    std::memcpy(a.data + 8 * i, &v, 8);
  }
}

inline bool WordsIntact(const Allocation& a, uint64_t token) {
  for (uint64_t i = 0; i < a.bytes / 8; ++i) {
    uint64_t v;
    std::memcpy(&v, a.data + 8 * i, 8);
    if (v != (token ^ (i * 0x9e3779b97f4a7c15ULL))) return false;
  }
  return true;
}

// The span length the header promises for a class: the fewest slabs (<= 8
// and <= capacity / slab) whose tail is under 1/256 of the span, else the
// one with the smallest tail fraction.
inline uint64_t ExpectedSpanSlabs(uint64_t chunk, uint64_t slab, uint64_t capacity) {
  const uint64_t max_slabs = std::min<uint64_t>(8, capacity / slab);
  uint64_t best = 1;
  for (uint64_t k = 1; k <= max_slabs; ++k) {
    if ((k * slab % chunk) * 256 < k * slab) return k;
    // tail(k) / k < tail(best) / best, in integers
    if ((k * slab % chunk) * best < (best * slab % chunk) * k) best = k;
  }
  return best;
}

}  // namespace kvcache::slab_pool_test

#endif  // KVCACHE_SERVER_CORE_SLAB_POOL_TEST_UTIL_H_
