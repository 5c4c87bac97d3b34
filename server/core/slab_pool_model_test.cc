// SlabPool (slab_pool.h) against a reference model of its contract: long
// randomized runs of allocations and frees (with and without per-thread
// caches) whose every result, layout and count the model predicts exactly,
// and threads allocating and freeing at once with every byte checked.
#include <gtest/gtest.h>

#include <atomic>
#include <bit>
#include <iterator>
#include <map>
#include <random>
#include <thread>
#include <utility>
#include <vector>

#include "server/core/slab_pool.h"
#include "server/core/slab_pool_test_util.h"

namespace kvcache {
namespace {

using namespace slab_pool_test;  // NOLINT: the shared pool helpers

// The contract, modelled exactly: a class's span is slab-aligned and
// ExpectedSpanSlabs long, a chunk lies inside one span, a span serves one
// class at a time, a class allocation must succeed iff a span of its class
// has a free chunk or one more span fits, and a run must succeed iff its
// slabs fit. A span's first chunk is at its base (spans carve from 0).
class ReferenceModel {
 public:
  ReferenceModel(uint64_t capacity, uint64_t slab) : capacity_(capacity), slab_(slab) {}

  uint64_t SpanBytes(uint64_t chunk) const {
    return ExpectedSpanSlabs(chunk, slab_, capacity_) * slab_;
  }

  bool MustSucceed(uint64_t rounded) const {
    if (rounded > slab_) return reserved_ + rounded <= capacity_;
    for (const auto& [base, s] : spans_) {
      if (s.chunk_bytes == rounded && s.live < SpanBytes(rounded) / rounded) return true;
    }
    return reserved_ + SpanBytes(rounded) <= capacity_;
  }

  void OnAllocate(const Allocation& a) {
    allocated_ += a.bytes;
    ++live_;
    if (a.bytes > slab_) {
      reserved_ += a.bytes;
      run_bytes_ += a.bytes;
      return;
    }
    const uintptr_t addr = reinterpret_cast<uintptr_t>(a.data);
    const uint64_t span_bytes = SpanBytes(a.bytes);
    auto it = spans_.upper_bound(addr);
    if (it != spans_.begin() && addr < std::prev(it)->first + std::prev(it)->second.span_bytes) {
      --it;
    } else {  // the first chunk of a span newly taken
      ASSERT_EQ(addr % slab_, 0u) << "a span's first chunk is not at a slab boundary";
      it = spans_.emplace(addr, RefSpan{a.bytes, span_bytes, 0}).first;
      reserved_ += span_bytes;
    }
    ASSERT_EQ(it->second.chunk_bytes, a.bytes) << "span serves two classes at once";
    const uint64_t offset = addr - it->first;
    ASSERT_EQ(offset % a.bytes, 0u);
    ASSERT_LE(offset + a.bytes, it->second.span_bytes) << "chunk crosses its span";
    ASSERT_LT(it->second.live, span_bytes / a.bytes);
    ++it->second.live;
  }

  void OnFree(const Allocation& a) {
    allocated_ -= a.bytes;
    --live_;
    if (a.bytes > slab_) {
      reserved_ -= a.bytes;
      run_bytes_ -= a.bytes;
      return;
    }
    auto it = spans_.upper_bound(reinterpret_cast<uintptr_t>(a.data));
    ASSERT_NE(it, spans_.begin());
    --it;
    if (--it->second.live == 0) {
      reserved_ -= it->second.span_bytes;
      spans_.erase(it);
    }
  }

  // The counts of chunks handed out, exact while chunks sit in per-thread
  // caches too.
  void ExpectCounts(const SlabPool& pool, uint64_t failed) const {
    const SlabPoolStats stats = pool.GetStats();
    ASSERT_EQ(stats.allocated_bytes, allocated_);
    ASSERT_EQ(stats.live_allocations, live_);
    ASSERT_EQ(stats.failed_allocations, failed);
    uint64_t class_allocated = 0;
    for (const SlabClassStats& c : pool.GetClassStats()) {
      class_allocated += c.live_chunks * c.chunk_bytes;
    }
    ASSERT_EQ(class_allocated + run_bytes_, allocated_);
  }

  void ExpectMatches(const SlabPool& pool, uint64_t failed) const {
    const SlabPoolStats stats = pool.GetStats();
    ASSERT_EQ(stats.reserved_bytes, reserved_);
    ASSERT_LE(stats.reserved_bytes, capacity_);
    ASSERT_EQ(stats.allocated_bytes, allocated_);
    ASSERT_EQ(stats.live_allocations, live_);
    ASSERT_EQ(stats.failed_allocations, failed);
    uint64_t class_reserved = 0, class_allocated = 0;
    for (const SlabClassStats& c : pool.GetClassStats()) {
      ASSERT_EQ(c.span_bytes, SpanBytes(c.chunk_bytes));
      ASSERT_LE(c.live_chunks, c.spans * c.chunks_per_span);
      class_reserved += c.spans * c.span_bytes;
      class_allocated += c.live_chunks * c.chunk_bytes;
    }
    ASSERT_EQ(class_reserved + run_bytes_, reserved_);
    ASSERT_EQ(class_allocated + run_bytes_, allocated_);
  }

 private:
  struct RefSpan {
    uint64_t chunk_bytes;
    uint64_t span_bytes;
    uint64_t live;
  };
  const uint64_t capacity_;
  const uint64_t slab_;
  uint64_t reserved_ = 0;
  uint64_t allocated_ = 0;
  uint64_t run_bytes_ = 0;
  uint64_t live_ = 0;
  std::map<uintptr_t, RefSpan> spans_;  // by base
};

// `span_heavy`: most sizes land in the stepped classes (1.25, 1.5, 1.75 x a
// power) whose spans are several slabs; every live allocation is filled with
// a pattern and verified before it is freed. With per-thread caches
// (`thread_cache` > 0) each operation's batch and parked chunks are counted
// exactly, then flushed, and the pool must match the model as without.
void RunRandomized(uint64_t capacity, uint64_t slab, uint64_t min_class, uint64_t seed,
                   bool span_heavy = false, uint64_t thread_cache = 0) {
  auto pool = MakePool(capacity, slab, min_class, thread_cache);
  ReferenceModel ref(capacity, slab);
  std::mt19937_64 rng(seed);
  struct Live {
    Allocation a;
    uint64_t token;
  };
  std::vector<Live> live;
  std::map<uintptr_t, uintptr_t> ranges;  // begin -> end of live allocations
  uint64_t failed = 0;
  const int slab_log = std::countr_zero(slab);
  for (int op = 0; op < 20000; ++op) {
    const double alloc_bias = (op / 2500) % 2 == 0 ? 0.7 : 0.35;  // fill, then drain
    if (live.empty() || std::uniform_real_distribution<>(0, 1)(rng) < alloc_bias) {
      uint64_t bytes;
      if (rng() % 8 == 0) {
        bytes = slab + 1 + rng() % (4 * slab);
      } else if (span_heavy && rng() % 4 != 0) {
        const uint64_t p = slab >> (1 + rng() % 5);  // slab/2 .. slab/32
        bytes = p + (1 + rng() % 3) * (p / 4) - rng() % 64;
      } else {
        bytes = 1 + rng() % (uint64_t{1} << (rng() % (slab_log + 1)));
      }
      const bool must_succeed = ref.MustSucceed(pool->RoundedSize(bytes));
      auto a = pool->Allocate(bytes);
      ASSERT_EQ(a.ok(), must_succeed) << "op " << op << " bytes " << bytes << ": " << a.status();
      if (a.ok()) {
        ASSERT_EQ(a->bytes, pool->RoundedSize(bytes));
        ASSERT_EQ(reinterpret_cast<uintptr_t>(a->data) % 64, 0u);
        const uintptr_t begin = reinterpret_cast<uintptr_t>(a->data);
        auto next = ranges.lower_bound(begin);
        ASSERT_TRUE(next == ranges.end() || next->first >= begin + a->bytes) << "overlap";
        ASSERT_TRUE(next == ranges.begin() || std::prev(next)->second <= begin) << "overlap";
        ranges.emplace(begin, begin + a->bytes);
        ASSERT_NO_FATAL_FAILURE(ref.OnAllocate(*a));
        const uint64_t token = rng();
        if (span_heavy) {
          FillWords(*a, token);
        } else {
          WriteTokens(*a, token);
        }
        live.push_back({*a, token});
      } else {
        ASSERT_EQ(a.status().code(), absl::StatusCode::kResourceExhausted);
        ++failed;
      }
    } else {
      const size_t victim = rng() % live.size();
      const Live v = live[victim];
      live[victim] = live.back();
      live.pop_back();
      ASSERT_TRUE(span_heavy ? WordsIntact(v.a, v.token) : TokensIntact(v.a, v.token))
          << "op " << op;
      ranges.erase(reinterpret_cast<uintptr_t>(v.a.data));
      pool->Free(v.a);
      ASSERT_NO_FATAL_FAILURE(ref.OnFree(v.a));
    }
    if (thread_cache > 0) {
      ASSERT_NO_FATAL_FAILURE(ref.ExpectCounts(*pool, failed)) << "op " << op;
      pool->FlushThreadCaches();
    }
    ASSERT_NO_FATAL_FAILURE(ref.ExpectMatches(*pool, failed)) << "op " << op;
  }
  EXPECT_GT(failed, 0u) << "the run never reached capacity";
  for (const Live& v : live) {
    ASSERT_TRUE(span_heavy ? WordsIntact(v.a, v.token) : TokensIntact(v.a, v.token));
    pool->Free(v.a);
  }
  ExpectAllReleased(*pool);
}

TEST(SlabPoolTest, RandomizedAgainstReferenceModel) {
  RunRandomized(/*capacity=*/16 * 64 * kKiB + 40 * kKiB, /*slab=*/64 * kKiB, /*min_class=*/64,
                /*seed=*/1);
}

TEST(SlabPoolTest, RandomizedAgainstReferenceModelLargerClasses) {
  RunRandomized(/*capacity=*/4 * kMiB, /*slab=*/256 * kKiB, /*min_class=*/4 * kKiB, /*seed=*/2);
}

TEST(SlabPoolTest, RandomizedAgainstReferenceModelMultiSlabSpans) {
  for (uint64_t seed : {3, 4, 5}) {
    SCOPED_TRACE(seed);
    RunRandomized(/*capacity=*/40 * 64 * kKiB + 24 * kKiB, /*slab=*/64 * kKiB, /*min_class=*/64,
                  seed, /*span_heavy=*/true);
  }
}

// The same models with per-thread caches on (flushed after each operation,
// so the model's layout holds; the counts are checked before the flush).
TEST(SlabPoolTest, RandomizedAgainstReferenceModelWithThreadCaches) {
  RunRandomized(/*capacity=*/16 * 64 * kKiB + 40 * kKiB, /*slab=*/64 * kKiB, /*min_class=*/64,
                /*seed=*/11, /*span_heavy=*/false, /*thread_cache=*/256 * kKiB);
  RunRandomized(/*capacity=*/40 * 64 * kKiB + 24 * kKiB, /*slab=*/64 * kKiB, /*min_class=*/64,
                /*seed=*/12, /*span_heavy=*/true, /*thread_cache=*/256 * kKiB);
}

TEST(SlabPoolTest, ConcurrentAllocFreeKeepsPatterns) {
  const uint64_t slab = 64 * kKiB;
  const uint64_t capacity = 8 * kMiB;
  auto pool = MakePool(capacity, slab, 64);
  constexpr int kThreads = 8;
  constexpr int kOps = 4000;
  std::atomic<uint64_t> failures{0};
  std::atomic<bool> corrupt{false};
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      std::mt19937_64 rng(100 + t);
      std::vector<std::pair<Allocation, uint64_t>> live;
      for (int op = 0; op < kOps; ++op) {
        if (live.size() < 32 && rng() % 2 == 0) {
          const uint64_t bytes =
              rng() % 16 == 0 ? slab + rng() % (2 * slab) : 1 + rng() % (16 * kKiB);
          auto a = pool->Allocate(bytes);
          if (!a.ok()) {
            if (a.status().code() != absl::StatusCode::kResourceExhausted) corrupt = true;
            ++failures;
            continue;
          }
          const uint64_t token = (uint64_t{static_cast<uint32_t>(t)} << 32) | op;
          WriteTokens(*a, token);
          live.emplace_back(*a, token);
        } else if (!live.empty()) {
          const size_t victim = rng() % live.size();
          if (!TokensIntact(live[victim].first, live[victim].second)) corrupt = true;
          pool->Free(live[victim].first);
          live[victim] = live.back();
          live.pop_back();
        }
        if (op % 256 == 0 && pool->GetStats().reserved_bytes > capacity) corrupt = true;
      }
      for (auto& [a, token] : live) {
        if (!TokensIntact(a, token)) corrupt = true;
        pool->Free(a);
      }
    });
  }
  for (std::thread& t : threads) t.join();
  EXPECT_FALSE(corrupt);
  EXPECT_EQ(pool->GetStats().failed_allocations, failures.load());
  ExpectAllReleased(*pool);
}

}  // namespace
}  // namespace kvcache
