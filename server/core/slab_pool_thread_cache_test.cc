// SlabPool's per-thread caches (slab_pool.h, "Per-thread caches"): chunks
// parked in one thread's stripe still serve every other thread before the
// pool says RESOURCE_EXHAUSTED, the stats count chunks handed out, compaction
// sees every free chunk, and chunks freed on other threads than the one that
// allocated them are never handed out twice.
#include <gtest/gtest.h>
#include <sched.h>

#include <atomic>
#include <cstring>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <random>
#include <set>
#include <thread>
#include <utility>
#include <vector>

#include "server/core/slab_pool.h"

namespace kvcache {
namespace {

constexpr uint64_t kKiB = 1024;
constexpr uint64_t kSlab = 64 * kKiB;

std::unique_ptr<SlabPool> MakePool(uint64_t capacity,
                                   std::shared_ptr<HostMemoryRegistrar> registrar = nullptr) {
  SlabPoolOptions options;  // per-thread caches on, as by default
  options.capacity_bytes = capacity;
  options.slab_bytes = kSlab;
  options.min_class_bytes = 64;
  auto pool = SlabPool::Create(options, std::move(registrar));
  EXPECT_TRUE(pool.ok()) << pool.status();
  return pool.ok() ? std::move(*pool) : nullptr;
}

// The CPUs this process may run on.
std::vector<int> AllowedCpus() {
  cpu_set_t set;
  CPU_ZERO(&set);
  std::vector<int> cpus;
  if (sched_getaffinity(0, sizeof(set), &set) == 0) {
    for (int cpu = 0; cpu < CPU_SETSIZE; ++cpu) {
      if (CPU_ISSET(cpu, &set)) cpus.push_back(cpu);
    }
  }
  return cpus;
}

// Runs `fn` on a new thread pinned to the `nth` allowed CPU (modulo their
// number), so that with several CPUs the nth and the (n+1)th use different
// stripes (one per CPU), and waits.
void OnNewThread(int nth, const std::function<void()>& fn) {
  std::thread([&] {
    const std::vector<int> cpus = AllowedCpus();
    if (!cpus.empty()) {
      cpu_set_t set;
      CPU_ZERO(&set);
      CPU_SET(cpus[static_cast<size_t>(nth) % cpus.size()], &set);
      sched_setaffinity(0, sizeof(set), &set);  // best effort: the test holds either way
    }
    fn();
  }).join();
}

uintptr_t SlabOf(const Allocation& a) { return reinterpret_cast<uintptr_t>(a.data) / kSlab; }

void WriteToken(const Allocation& a, uint64_t token) {
  for (uint64_t off = 0; off + 8 <= a.bytes; off += 64) std::memcpy(a.data + off, &token, 8);
}

bool TokenIntact(const Allocation& a, uint64_t token) {
  for (uint64_t off = 0; off + 8 <= a.bytes; off += 64) {
    uint64_t v;
    std::memcpy(&v, a.data + off, 8);
    if (v != token) return false;
  }
  return true;
}

// Thread A fills the pool and frees everything; chunks stay parked in A's
// stripe. Thread B (on another CPU where there are several, so another
// stripe) then gets the whole capacity, in A's class and in another
// class whose spans A's cached chunks keep reserved, before any
// RESOURCE_EXHAUSTED.
TEST(SlabPoolThreadCacheTest, ExhaustionServesChunksParkedInAnotherThreadsStripe) {
  auto pool = MakePool(4 * kSlab);
  const uint64_t per_pool = 4 * kSlab / kKiB;  // 256 chunks of 1 KiB
  OnNewThread(0, [&] {
    std::vector<Allocation> all;
    for (uint64_t i = 0; i < per_pool; ++i) {
      auto a = pool->Allocate(kKiB);
      ASSERT_TRUE(a.ok()) << i << ": " << a.status();
      all.push_back(*a);
    }
    EXPECT_EQ(pool->Allocate(kKiB).status().code(), absl::StatusCode::kResourceExhausted);
    for (const Allocation& a : all) pool->Free(a);
  });
  SlabPoolStats stats = pool->GetStats();
  ASSERT_GT(stats.cached_bytes, 0u) << "A's stripe should hold chunks";
  ASSERT_GT(stats.reserved_bytes, 0u) << "its chunks keep their spans";
  EXPECT_EQ(stats.allocated_bytes, 0u);
  EXPECT_EQ(stats.failed_allocations, 1u);

  OnNewThread(1, [&] {
    std::vector<Allocation> all;
    for (uint64_t i = 0; i < per_pool; ++i) {
      auto a = pool->Allocate(kKiB);
      ASSERT_TRUE(a.ok()) << "B, chunk " << i << ": " << a.status();
      all.push_back(*a);
    }
    EXPECT_EQ(pool->Allocate(kKiB).status().code(), absl::StatusCode::kResourceExhausted);
    EXPECT_EQ(pool->GetStats().allocated_bytes, per_pool * kKiB);
    EXPECT_EQ(pool->GetStats().cached_bytes, 0u);
    for (const Allocation& a : all) pool->Free(a);
  });
  ASSERT_GT(pool->GetStats().cached_bytes, 0u);

  // Another class: the spans B's parked 1 KiB chunks keep are needed whole.
  OnNewThread(2, [&] {
    std::vector<Allocation> all;
    for (int i = 0; i < 4; ++i) {
      auto a = pool->Allocate(kSlab);
      ASSERT_TRUE(a.ok()) << "slab " << i << ": " << a.status();
      all.push_back(*a);
    }
    EXPECT_EQ(pool->GetStats().reserved_bytes, 4 * kSlab);
    for (const Allocation& a : all) pool->Free(a);
  });
  EXPECT_EQ(pool->GetStats().failed_allocations, 2u);
  pool->FlushThreadCaches();
  EXPECT_EQ(pool->GetStats().reserved_bytes, 0u);
}

// allocated_bytes, live_allocations and each class's live_chunks count what
// is handed out, whichever stripes hold freed chunks; cached_bytes what they
// hold.
TEST(SlabPoolThreadCacheTest, StatsAreExactWithChunksCached) {
  auto pool = MakePool(256 * kSlab);
  const uint64_t sizes[] = {64, 1000, 4 * kKiB, 20 * kKiB, 64 * kKiB, 3 * kSlab};
  std::vector<Allocation> all;
  for (int round = 0; round < 40; ++round) {
    for (uint64_t bytes : sizes) {
      auto a = pool->Allocate(bytes);
      ASSERT_TRUE(a.ok()) << a.status();
      all.push_back(*a);
    }
  }
  // Three threads free every other allocation; the rest stays live.
  std::vector<Allocation> live;
  std::vector<std::vector<Allocation>> to_free(3);
  for (size_t i = 0; i < all.size(); ++i) {
    if (i % 2 == 0) {
      live.push_back(all[i]);
    } else {
      to_free[i % 3].push_back(all[i]);
    }
  }
  std::vector<std::thread> threads;
  for (auto& batch : to_free) {
    threads.emplace_back([&pool, &batch] {
      for (const Allocation& a : batch) pool->Free(a);
    });
  }
  for (std::thread& t : threads) t.join();

  uint64_t live_bytes = 0;
  std::map<uint64_t, uint64_t> live_per_class;
  for (const Allocation& a : live) {
    live_bytes += a.bytes;
    if (a.bytes <= kSlab) ++live_per_class[a.bytes];
  }
  auto expect_exact = [&] {
    const SlabPoolStats stats = pool->GetStats();
    EXPECT_EQ(stats.allocated_bytes, live_bytes);
    EXPECT_EQ(stats.live_allocations, live.size());
    for (const SlabClassStats& c : pool->GetClassStats()) {
      EXPECT_EQ(c.live_chunks, live_per_class[c.chunk_bytes]) << c.chunk_bytes;
    }
    return stats;
  };
  const SlabPoolStats cached = expect_exact();
  EXPECT_GT(cached.cached_bytes, 0u);
  EXPECT_LE(cached.cached_bytes, 3 * SlabPoolOptions{}.thread_cache_bytes);
  pool->FlushThreadCaches();
  const SlabPoolStats flushed = expect_exact();
  EXPECT_EQ(flushed.cached_bytes, 0u);
  EXPECT_LE(flushed.reserved_bytes, cached.reserved_bytes);

  threads.clear();
  for (int t = 0; t < 2; ++t) {
    threads.emplace_back([&, t] {
      for (size_t i = t; i < live.size(); i += 2) pool->Free(live[i]);
    });
  }
  for (std::thread& t : threads) t.join();
  live.clear();
  live_bytes = 0;
  live_per_class.clear();
  expect_exact();
  pool->FlushThreadCaches();
  EXPECT_EQ(pool->GetStats().reserved_bytes, 0u);
  EXPECT_EQ(pool->GetStats().cached_bytes, 0u);
}

// Four one-slab spans of 1 KiB chunks keep 16, 24, 32 and 40 live; the rest
// is freed by four threads, one span each, so the free chunks sit in four
// stripes. The plan is the one the central lists alone would make (the two
// sparsest drain into the others), and neither an allocation during the plan
// nor its batch takes the move targets: all 40 chunks move, on threads other
// than the planner, and both spans are released.
TEST(SlabPoolThreadCacheTest, CompactionPlanSeesChunksFreedOnSeveralThreads) {
  auto pool = MakePool(4 * kSlab);
  std::vector<Allocation> all;
  for (int i = 0; i < 256; ++i) all.push_back(*pool->Allocate(kKiB));
  const int keep[] = {16, 24, 32, 40};
  std::vector<Allocation> live;
  std::vector<std::thread> threads;
  for (int s = 0; s < 4; ++s) {
    for (int c = 0; c < keep[s]; ++c) live.push_back(all[s * 64 + c]);
    threads.emplace_back([&, s] {
      for (int c = keep[s]; c < 64; ++c) pool->Free(all[s * 64 + c]);
    });
  }
  for (std::thread& t : threads) t.join();
  ASSERT_GT(pool->GetStats().cached_bytes, 0u);
  for (size_t i = 0; i < live.size(); ++i) WriteToken(live[i], i);
  const std::set<uintptr_t> draining = {SlabOf(all[0]), SlabOf(all[64])};

  absl::StatusOr<CompactionPlan> plan = pool->PlanCompaction({.max_span_occupancy = 0.5});
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_EQ(plan->spans, 2u);
  EXPECT_EQ(plan->moves.size(), 40u);
  EXPECT_EQ(pool->GetStats().cached_bytes, 0u);
  for (const Allocation& m : plan->moves) EXPECT_EQ(draining.count(SlabOf(m)), 1u);
  OnNewThread(3, [&] {
    auto extra = pool->Allocate(kKiB);
    ASSERT_TRUE(extra.ok());
    EXPECT_EQ(draining.count(SlabOf(*extra)), 0u);
    pool->Free(*extra);
  });

  // Two threads move half the chunks each: target, copy, free the source.
  std::atomic<int> moved{0};
  threads.clear();
  for (int t = 0; t < 2; ++t) {
    threads.emplace_back([&, t] {
      for (size_t i = t; i < live.size(); i += 2) {
        if (!plan->Contains(live[i].data)) continue;
        absl::StatusOr<Allocation> target = pool->AllocateMoveTarget(live[i]);
        ASSERT_TRUE(target.ok()) << target.status();
        EXPECT_EQ(draining.count(SlabOf(*target)), 0u);
        std::memcpy(target->data, live[i].data, live[i].bytes);
        pool->Free(live[i]);
        live[i] = *target;
        ++moved;
      }
    });
  }
  for (std::thread& t : threads) t.join();
  EXPECT_EQ(moved.load(), 40);
  const SlabPoolStats stats = pool->GetStats();
  EXPECT_EQ(stats.drained_spans, 2u);
  EXPECT_EQ(stats.draining_spans, 0u);
  EXPECT_EQ(stats.reserved_bytes, 2 * kSlab);
  EXPECT_EQ(stats.live_allocations, live.size());
  for (size_t i = 0; i < live.size(); ++i) EXPECT_TRUE(TokenIntact(live[i], i)) << i;
  for (const Allocation& a : live) pool->Free(a);
  pool->FlushThreadCaches();
  EXPECT_EQ(pool->GetStats().reserved_bytes, 0u);
}

// Eight threads allocate mixed sizes (cached classes, larger classes, runs),
// write a token, and hand half of their allocations to the next thread to
// verify and free. A shared map of live ranges catches a chunk handed out
// twice (or overlapping another); capacity is small enough to run out.
TEST(SlabPoolThreadCacheTest, CrossThreadFreesNeverHandOutAChunkTwice) {
  constexpr int kThreads = 8;
  constexpr int kOps = 3000;
  const uint64_t capacity = 48 * kSlab;
  auto pool = MakePool(capacity);
  struct Owned {
    Allocation a;
    uint64_t token;
  };
  std::mutex mu;
  std::map<uintptr_t, uintptr_t> ranges;  // live: begin -> end
  std::vector<std::vector<Owned>> inbox(kThreads);
  std::atomic<bool> duplicate{false}, corrupt{false};
  std::atomic<uint64_t> failures{0};

  auto claim = [&](const Allocation& a) {
    const uintptr_t begin = reinterpret_cast<uintptr_t>(a.data);
    std::lock_guard<std::mutex> lock(mu);
    auto next = ranges.lower_bound(begin);
    if ((next != ranges.end() && next->first < begin + a.bytes) ||
        (next != ranges.begin() && std::prev(next)->second > begin)) {
      duplicate = true;
    }
    ranges.emplace(begin, begin + a.bytes);
  };
  auto release = [&](const Owned& o) {
    if (!TokenIntact(o.a, o.token)) corrupt = true;
    {
      std::lock_guard<std::mutex> lock(mu);
      ranges.erase(reinterpret_cast<uintptr_t>(o.a.data));
    }
    pool->Free(o.a);
  };
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      std::mt19937_64 rng(1000 + t);
      std::vector<Owned> mine;
      for (int op = 0; op < kOps; ++op) {
        const uint64_t r = rng() % 64;
        const uint64_t bytes = r == 0   ? kSlab + rng() % kSlab  // a run
                               : r < 8  ? 16 * kKiB + rng() % (48 * kKiB)
                               : r < 12 ? 65 * kKiB                // not cached
                                        : 1 + rng() % (4 * kKiB);  // small classes
        absl::StatusOr<Allocation> a = pool->Allocate(bytes);
        if (a.ok()) {
          claim(*a);
          const uint64_t token = (uint64_t{static_cast<uint32_t>(t)} << 32) | op;
          WriteToken(*a, token);
          mine.push_back({*a, token});
        } else {
          if (a.status().code() != absl::StatusCode::kResourceExhausted) corrupt = true;
          ++failures;
        }
        if (mine.size() >= 24 || !a.ok()) {
          // Half to the next thread's inbox, half freed here.
          std::vector<Owned> give(mine.begin(), mine.begin() + mine.size() / 2);
          for (size_t i = mine.size() / 2; i < mine.size(); ++i) release(mine[i]);
          mine.clear();
          std::lock_guard<std::mutex> lock(mu);
          auto& next = inbox[(t + 1) % kThreads];
          next.insert(next.end(), give.begin(), give.end());
        }
        if (op % 8 == 0) {
          std::vector<Owned> received;
          {
            std::lock_guard<std::mutex> lock(mu);
            received.swap(inbox[t]);
          }
          for (const Owned& o : received) release(o);
        }
      }
      for (const Owned& o : mine) release(o);
    });
  }
  for (std::thread& t : threads) t.join();
  for (auto& box : inbox) {
    for (const Owned& o : box) release(o);
  }
  EXPECT_GT(failures.load(), 0u) << "the run never reached capacity";
  EXPECT_FALSE(duplicate) << "a chunk was handed out while live";
  EXPECT_FALSE(corrupt);
  EXPECT_TRUE(ranges.empty());
  SlabPoolStats stats = pool->GetStats();
  EXPECT_EQ(stats.allocated_bytes, 0u);
  EXPECT_EQ(stats.live_allocations, 0u);
  EXPECT_EQ(stats.failed_allocations, failures.load());
  EXPECT_LE(stats.reserved_bytes, capacity);
  pool->FlushThreadCaches();
  stats = pool->GetStats();
  EXPECT_EQ(stats.reserved_bytes, 0u);
  EXPECT_EQ(stats.cached_bytes, 0u);
}

// Counts what is registered and unregistered.
class CountingRegistrar : public HostMemoryRegistrar {
 public:
  absl::Status Register(std::byte*, uint64_t bytes) override {
    registered_ += bytes;
    return absl::OkStatus();
  }
  void Unregister(std::byte*, uint64_t bytes) override { unregistered_ += bytes; }
  uint64_t registered_ = 0;  // under the pool's lock
  uint64_t unregistered_ = 0;
};

// A pool destroyed with chunks parked in several stripes unmaps (and
// unregisters) everything it mapped.
TEST(SlabPoolThreadCacheTest, DestroyedWithChunksInTheStripes) {
  auto registrar = std::make_shared<CountingRegistrar>();
  {
    auto pool = MakePool(128 * kSlab, registrar);
    std::vector<std::thread> threads;
    for (int t = 0; t < 4; ++t) {
      threads.emplace_back([&pool] {
        std::vector<Allocation> held;
        for (int i = 0; i < 50; ++i) {
          absl::StatusOr<Allocation> a = pool->Allocate(64 + 512 * i);
          ASSERT_TRUE(a.ok()) << a.status();
          held.push_back(*a);
        }
        for (const Allocation& a : held) pool->Free(a);
      });
    }
    for (std::thread& t : threads) t.join();
    ASSERT_GT(pool->GetStats().cached_bytes, 0u);
    EXPECT_EQ(pool->GetStats().pinned_bytes, registrar->registered_ - registrar->unregistered_);
  }
  EXPECT_GT(registrar->registered_, 0u);
  EXPECT_EQ(registrar->registered_, registrar->unregistered_);
}

}  // namespace
}  // namespace kvcache
