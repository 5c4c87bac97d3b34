// SlabPool (slab_pool.h): its options' validation, and allocation and free
// one case at a time: rounding and size classes, alignment, capacity as a
// hard limit, large runs, span lengths and how spans fill and go back, and
// freed chunks poisoned under ASan. The randomized and concurrent runs are in
// slab_pool_model_test.cc, compaction in slab_pool_compaction_test.cc.
#include "server/core/slab_pool.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cstddef>
#include <map>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "absl/base/config.h"
#include "server/core/slab_pool_test_util.h"

namespace kvcache {
namespace {

using namespace slab_pool_test;  // NOLINT: the shared pool helpers

using ::testing::HasSubstr;

void ExpectInvalid(const SlabPoolOptions& options, const char* field) {
  absl::Status s = options.Validate();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << field;
  EXPECT_THAT(std::string(s.message()), HasSubstr(field));
  EXPECT_EQ(SlabPool::Create(options).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(SlabPoolOptionsTest, DefaultsAreValid) { EXPECT_TRUE(SlabPoolOptions{}.Validate().ok()); }

TEST(SlabPoolOptionsTest, RejectsBadSlabBytes) {
  for (uint64_t slab : {uint64_t{0}, 32 * kKiB, 3 * kMiB, uint64_t{2} << 30}) {
    SlabPoolOptions options;
    options.slab_bytes = slab;
    options.capacity_bytes = uint64_t{8} << 30;
    ExpectInvalid(options, "slab_bytes");
  }
}

TEST(SlabPoolOptionsTest, RejectsBadMinClassBytes) {
  for (uint64_t min_class : {uint64_t{0}, uint64_t{32}, uint64_t{96}, 8 * kMiB}) {
    SlabPoolOptions options;
    options.min_class_bytes = min_class;
    ExpectInvalid(options, "min_class_bytes");
  }
  SlabPoolOptions options;
  options.min_class_bytes = options.slab_bytes;  // a single class is fine
  EXPECT_TRUE(options.Validate().ok());
}

TEST(SlabPoolOptionsTest, RejectsThreadCacheBytesPast16MiB) {
  SlabPoolOptions options;
  options.thread_cache_bytes = 16 * kMiB + 1;
  ExpectInvalid(options, "thread_cache_bytes");
  options.thread_cache_bytes = 0;  // no per-thread caches
  EXPECT_TRUE(options.Validate().ok());
}

TEST(SlabPoolOptionsTest, RejectsCapacityBelowOneSlab) {
  SlabPoolOptions options;
  options.capacity_bytes = options.slab_bytes - 1;
  ExpectInvalid(options, "capacity_bytes");
  options.capacity_bytes = options.slab_bytes;
  EXPECT_TRUE(options.Validate().ok());
}

TEST(SlabPoolTest, RoundedSize) {
  auto pool = MakePool(64 * kMiB, 4 * kMiB, 4 * kKiB);
  EXPECT_EQ(pool->RoundedSize(1), 4 * kKiB);  // small: the smallest class
  EXPECT_EQ(pool->RoundedSize(4 * kKiB - 1), 4 * kKiB);
  EXPECT_EQ(pool->RoundedSize(4 * kKiB), 4 * kKiB);  // exact classes
  EXPECT_EQ(pool->RoundedSize(64 * kKiB), 64 * kKiB);
  EXPECT_EQ(pool->RoundedSize(4 * kKiB + 1), 5 * kKiB);  // quarter steps between powers
  EXPECT_EQ(pool->RoundedSize(5 * kKiB + 1), 6 * kKiB);
  EXPECT_EQ(pool->RoundedSize(7 * kKiB + 1), 8 * kKiB);
  EXPECT_EQ(pool->RoundedSize(3 * kMiB), 3 * kMiB);
  EXPECT_EQ(pool->RoundedSize(2 * kMiB + 1), 2 * kMiB + 512 * kKiB);
  EXPECT_EQ(pool->RoundedSize(4 * kMiB), 4 * kMiB);      // slab-sized
  EXPECT_EQ(pool->RoundedSize(4 * kMiB + 1), 8 * kMiB);  // large runs: whole slabs
  EXPECT_EQ(pool->RoundedSize(12 * kMiB), 12 * kMiB);
  EXPECT_EQ(pool->RoundedSize(12 * kMiB + 7), 16 * kMiB);
}

// A 2 MiB block compressed to 0.58 of its size takes a 1.25 MiB chunk instead
// of a whole 2 MiB chunk; the class takes spans of 5 slabs (16 chunks, no
// tail) where one 4 MiB slab would hold 3 and leave 0.25 MiB unused.
TEST(SlabPoolTest, SteppedClassesFitCompressedBlocks) {
  auto pool = MakePool(64 * kMiB, 4 * kMiB, 4 * kKiB);
  const uint64_t compressed = 2 * kMiB * 58 / 100;
  std::vector<Allocation> live;
  for (int i = 0; i < 17; ++i) {
    auto a = pool->Allocate(compressed);
    ASSERT_TRUE(a.ok()) << a.status();
    EXPECT_EQ(a->bytes, kMiB + kMiB / 4);
    EXPECT_EQ(reinterpret_cast<uintptr_t>(a->data) % 64, 0u);
    live.push_back(*a);
    EXPECT_EQ(pool->GetStats().reserved_bytes, (i < 16 ? 1 : 2) * 20 * kMiB) << i;
  }
  for (const Allocation& a : live) pool->Free(a);
  ExpectAllReleased(*pool);
}

TEST(SlabPoolTest, AllocateRejectsZeroAndMoreThanCapacity) {
  auto pool = MakePool(8 * kMiB, 4 * kMiB, 4 * kKiB);
  EXPECT_EQ(pool->Allocate(0).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(pool->Allocate(8 * kMiB + 1).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(pool->GetStats().failed_allocations, 0u);
}

TEST(SlabPoolTest, AllocationsAreAlignedAndSized) {
  auto pool = MakePool(64 * kMiB, 64 * kKiB, 64);
  std::vector<Allocation> live;
  for (uint64_t bytes :
       {uint64_t{1}, uint64_t{64}, uint64_t{100}, 4 * kKiB, 64 * kKiB, 64 * kKiB + 1, 200 * kKiB}) {
    auto a = pool->Allocate(bytes);
    ASSERT_TRUE(a.ok()) << a.status();
    EXPECT_EQ(a->bytes, pool->RoundedSize(bytes));
    EXPECT_EQ(reinterpret_cast<uintptr_t>(a->data) % 64, 0u) << bytes;
    live.push_back(*a);
  }
  SlabPoolStats stats = pool->GetStats();
  EXPECT_EQ(stats.live_allocations, live.size());
  EXPECT_EQ(stats.allocated_bytes, 64 + 64 + 128 + 4 * kKiB + 64 * kKiB + 128 * kKiB + 256 * kKiB);
  // Four classes (64, 128, 4 KiB, 64 KiB) each reserved one slab, plus runs of 2 and 4 slabs.
  EXPECT_EQ(stats.reserved_bytes, 4 * 64 * kKiB + 128 * kKiB + 256 * kKiB);
  for (const Allocation& a : live) pool->Free(a);
  ExpectAllReleased(*pool);
}

TEST(SlabPoolTest, CapacityIsAHardLimit) {
  const uint64_t slab = 64 * kKiB;
  auto pool = MakePool(4 * slab + slab / 2, slab, 4 * kKiB);  // room for 4 whole slabs
  std::vector<Allocation> live;
  absl::StatusOr<Allocation> a;
  // The 14 KiB class: one slab would leave 8 KiB unused, two (the longest span
  // with the least tail that fits 4 slabs of capacity) leave 2 KiB: 9 chunks.
  while ((a = pool->Allocate(13 * kKiB)).ok()) {
    live.push_back(*a);
    ASSERT_LE(pool->GetStats().reserved_bytes, 4 * slab + slab / 2);
  }
  EXPECT_EQ(a.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(std::string(a.status().message()), HasSubstr("capacity_bytes"));
  EXPECT_EQ(live.size(), 2u * (2 * slab / (14 * kKiB)));
  SlabPoolStats stats = pool->GetStats();
  EXPECT_EQ(stats.reserved_bytes, 4 * slab);
  EXPECT_EQ(stats.failed_allocations, 1u);
  // Another class cannot get a slab either, nor can a run.
  EXPECT_EQ(pool->Allocate(64 * kKiB).status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(pool->Allocate(slab + 1).status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(pool->GetStats().failed_allocations, 3u);

  pool->Free(live.back());
  live.pop_back();
  a = pool->Allocate(14 * kKiB);
  ASSERT_TRUE(a.ok()) << a.status();
  live.push_back(*a);
  EXPECT_EQ(pool->GetStats().reserved_bytes, 4 * slab);
  for (const Allocation& x : live) pool->Free(x);
}

TEST(SlabPoolTest, FullyFreedSlabServesAnotherClass) {
  const uint64_t slab = 64 * kKiB;
  auto pool = MakePool(slab, slab, 64);  // exactly one slab
  auto a = pool->Allocate(64);
  auto b = pool->Allocate(64);
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_EQ(pool->GetStats().reserved_bytes, slab);
  EXPECT_EQ(pool->Allocate(4 * kKiB).status().code(), absl::StatusCode::kResourceExhausted);
  pool->Free(*a);  // the slab is still partly used by the 64-byte class
  EXPECT_EQ(pool->Allocate(4 * kKiB).status().code(), absl::StatusCode::kResourceExhausted);
  pool->Free(*b);
  // Both 64-byte chunks may sit in this thread's cache, keeping the slab;
  // the 4 KiB request takes them back to their span, which is then free.
  EXPECT_EQ(pool->GetStats().reserved_bytes, slab);
  EXPECT_EQ(pool->GetStats().allocated_bytes, 0u);
  auto c = pool->Allocate(4 * kKiB);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(reinterpret_cast<uintptr_t>(c->data) & ~(slab - 1),
            reinterpret_cast<uintptr_t>(a->data) & ~(slab - 1));  // the same slab, reused
  EXPECT_EQ(pool->GetStats().reserved_bytes, slab);
  pool->Free(*c);
}

TEST(SlabPoolTest, LargeRunsCountAgainstCapacity) {
  const uint64_t slab = 64 * kKiB;
  auto pool = MakePool(4 * slab, slab, 4 * kKiB);
  auto run = pool->Allocate(2 * slab + 1);  // three slabs
  ASSERT_TRUE(run.ok()) << run.status();
  EXPECT_EQ(run->bytes, 3 * slab);
  EXPECT_EQ(pool->GetStats().reserved_bytes, 3 * slab);
  auto small = pool->Allocate(4 * kKiB);  // the fourth slab
  ASSERT_TRUE(small.ok()) << small.status();
  EXPECT_EQ(pool->Allocate(8 * kKiB).status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(pool->Allocate(slab + 1).status().code(), absl::StatusCode::kResourceExhausted);
  pool->Free(*run);
  EXPECT_EQ(pool->GetStats().reserved_bytes, slab);
  run = pool->Allocate(3 * slab);
  ASSERT_TRUE(run.ok()) << run.status();
  EXPECT_EQ(pool->GetStats().reserved_bytes, 4 * slab);
  pool->Free(*run);
  pool->Free(*small);
  ExpectAllReleased(*pool);
}

TEST(SlabPoolTest, CachedFreeSlabsDoNotBlockARun) {
  const uint64_t slab = 64 * kKiB;
  auto pool = MakePool(4 * slab, slab, 4 * kKiB);
  std::vector<Allocation> live;
  for (int i = 0; i < 4; ++i) live.push_back(*pool->Allocate(slab));
  for (const Allocation& a : live) pool->Free(a);  // four free slabs stay cached
  auto run = pool->Allocate(4 * slab);
  ASSERT_TRUE(run.ok()) << run.status();
  WriteTokens(*run, 42);
  EXPECT_TRUE(TokensIntact(*run, 42));
  pool->Free(*run);
  auto again = pool->Allocate(slab);  // slabs are mapped again on demand
  ASSERT_TRUE(again.ok()) << again.status();
  pool->Free(*again);
}

TEST(SlabPoolTest, FreedRunsAreReusedAndGiveWayToOtherSizes) {
  const uint64_t slab = 64 * kKiB;
  auto pool = MakePool(4 * slab, slab, 4 * kKiB);
  auto first = pool->Allocate(2 * slab);
  ASSERT_TRUE(first.ok()) << first.status();
  std::byte* const address = first->data;
  pool->Free(*first);
  EXPECT_EQ(pool->GetStats().reserved_bytes, 0u);
  auto reused = pool->Allocate(2 * slab);  // the cached run comes back
  ASSERT_TRUE(reused.ok()) << reused.status();
  EXPECT_EQ(reused->data, address);
  WriteTokens(*reused, 7);
  EXPECT_TRUE(TokensIntact(*reused, 7));
  pool->Free(*reused);
  // A run of another size, then class slabs, still get the whole capacity:
  // cached runs are unmapped to make room.
  auto whole = pool->Allocate(4 * slab);
  ASSERT_TRUE(whole.ok()) << whole.status();
  pool->Free(*whole);
  std::vector<Allocation> slabs;
  for (int i = 0; i < 4; ++i) {
    auto a = pool->Allocate(slab);
    ASSERT_TRUE(a.ok()) << "slab " << i << ": " << a.status();
    slabs.push_back(*a);
  }
  EXPECT_EQ(pool->GetStats().reserved_bytes, 4 * slab);
  for (const Allocation& a : slabs) pool->Free(a);
}

TEST(SlabPoolTest, MemoryIsWritableAndDisjoint) {
  const uint64_t slab = 64 * kKiB;
  auto pool = MakePool(32 * kMiB, slab, 64);
  std::mt19937_64 rng(7);
  std::vector<std::pair<Allocation, uint64_t>> live;
  for (uint64_t i = 0; i < 3000; ++i) {
    const uint64_t bytes = (i % 50 == 0) ? slab + rng() % (3 * slab) : 1 + rng() % (8 * kKiB);
    auto a = pool->Allocate(bytes);
    ASSERT_TRUE(a.ok()) << a.status();
    FillWords(*a, i);  // the whole usable size, not just what was asked for
    live.emplace_back(*a, i);
    if (i % 3 == 2) {  // free some so chunks and slabs are recycled
      const size_t victim = rng() % live.size();
      ASSERT_TRUE(WordsIntact(live[victim].first, live[victim].second));
      pool->Free(live[victim].first);
      live.erase(live.begin() + victim);
    }
  }
  std::vector<std::pair<uintptr_t, uintptr_t>> ranges;
  for (const auto& [a, token] : live) {
    const uintptr_t begin = reinterpret_cast<uintptr_t>(a.data);
    ranges.emplace_back(begin, begin + a.bytes);
  }
  std::sort(ranges.begin(), ranges.end());
  for (size_t i = 1; i < ranges.size(); ++i) ASSERT_LE(ranges[i - 1].second, ranges[i].first);
  for (const auto& [a, token] : live) {
    EXPECT_TRUE(WordsIntact(a, token)) << token;
    pool->Free(a);
  }
  ExpectAllReleased(*pool);
}

#ifdef ABSL_HAVE_ADDRESS_SANITIZER
TEST(SlabPoolDeathTest, FreedChunksArePoisonedUnderAsan) {
  auto pool = MakePool(4 * kMiB, 64 * kKiB, 64);
  auto a = pool->Allocate(4 * kKiB);
  ASSERT_TRUE(a.ok());
  pool->Free(*a);
  volatile std::byte* stale = a->data + 100;
  EXPECT_DEATH((void)*stale, "use-after-poison");
}
#endif

TEST(SlabPoolTest, SpanLengthsPerClass) {
  auto pool = MakePool(uint64_t{1} << 30, 4 * kMiB, 64);
  std::map<uint64_t, SlabClassStats> by_chunk;
  for (const SlabClassStats& c : pool->GetClassStats()) by_chunk[c.chunk_bytes] = c;
  EXPECT_EQ(by_chunk.size(), 2 + 14 * 4 + 1u);  // 64 and 128, 256 .. 2 MiB x4, 4 MiB
  const std::pair<uint64_t, uint64_t> expected[] = {
      // 80 KiB: one to four slabs leave exactly 1/256 unused, five none.
      {64, 1},          {320, 1},
      {80 * kKiB, 5},   {64 * kKiB, 1},
      {320 * kKiB, 5},  {384 * kKiB, 3},
      {640 * kKiB, 5},  {768 * kKiB, 3},
      {896 * kKiB, 7},  {1280 * kKiB, 5},
      {1536 * kKiB, 3}, {1792 * kKiB, 7},
      {3 * kMiB, 3},    {3 * kMiB + kMiB / 2, 7},
      {4 * kMiB, 1}};
  for (const auto& [chunk, slabs] : expected) {
    ASSERT_TRUE(by_chunk.contains(chunk)) << chunk;
    EXPECT_EQ(by_chunk[chunk].span_bytes, slabs * 4 * kMiB) << chunk;
    EXPECT_EQ(by_chunk[chunk].chunks_per_span, slabs * 4 * kMiB / chunk) << chunk;
  }
  for (const auto& [chunk, c] : by_chunk) {
    EXPECT_EQ(c.span_bytes, ExpectedSpanSlabs(chunk, 4 * kMiB, uint64_t{1} << 30) * 4 * kMiB)
        << chunk;
    EXPECT_EQ(c.spans, 0u);
  }
  // A span never needs more than the capacity: with room for 2 slabs the
  // 320 KiB class takes 2 (6.25% tail beats nothing fitting at all).
  auto small = MakePool(8 * kMiB, 4 * kMiB, 64);
  for (const SlabClassStats& c : small->GetClassStats()) {
    EXPECT_LE(c.span_bytes, 8 * kMiB) << c.chunk_bytes;
  }
  auto a = small->Allocate(320 * kKiB);
  ASSERT_TRUE(a.ok()) << a.status();
  EXPECT_EQ(small->GetStats().reserved_bytes, 8 * kMiB);
  small->Free(*a);
}

// 320 KiB chunks fill a 5-slab span exactly, never cross it, and the span's
// memory returns when its last chunk is freed, then serves one-slab classes.
TEST(SlabPoolTest, SpanFillsExactlyAndReturnsWhole) {
  const uint64_t slab = 4 * kMiB;
  auto pool = MakePool(5 * slab, slab, 64);
  std::vector<Allocation> live;
  for (int i = 0; i < 64; ++i) {
    auto a = pool->Allocate(300 * kKiB);
    ASSERT_TRUE(a.ok()) << i << ": " << a.status();
    EXPECT_EQ(a->bytes, 320 * kKiB);
    EXPECT_EQ(reinterpret_cast<uintptr_t>(a->data) % 64, 0u);
    FillWords(*a, i);
    live.push_back(*a);
    EXPECT_EQ(pool->GetStats().reserved_bytes, 5 * slab) << i;
  }
  EXPECT_EQ(pool->Allocate(300 * kKiB).status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(pool->Allocate(64).status().code(), absl::StatusCode::kResourceExhausted);
  auto [lo, hi] = std::minmax_element(live.begin(), live.end(),
                                      [](const auto& x, const auto& y) { return x.data < y.data; });
  const std::byte* base = lo->data;
  EXPECT_EQ(reinterpret_cast<uintptr_t>(base) % slab, 0u);
  EXPECT_EQ(hi->data + hi->bytes, base + 5 * slab);  // no tail, nothing past the span
  SlabPoolStats stats = pool->GetStats();
  EXPECT_EQ(stats.allocated_bytes, 64 * 320 * kKiB);
  EXPECT_EQ(stats.allocated_bytes, stats.reserved_bytes);
  for (int i = 0; i < 63; ++i) {
    ASSERT_TRUE(WordsIntact(live[i], i)) << i;
    pool->Free(live[i]);
    EXPECT_EQ(pool->GetStats().reserved_bytes, 5 * slab) << i;
  }
  ASSERT_TRUE(WordsIntact(live[63], 63));
  pool->Free(live[63]);
  EXPECT_EQ(pool->GetStats().reserved_bytes, 0u);
  // The freed span serves five one-slab classes: split, not mapped anew.
  std::vector<Allocation> slabs;
  for (uint64_t bytes : {uint64_t{64}, 4 * kKiB, 64 * kKiB, 2 * kMiB, 4 * kMiB}) {
    auto a = pool->Allocate(bytes);
    ASSERT_TRUE(a.ok()) << bytes << ": " << a.status();
    EXPECT_GE(a->data, base) << bytes;
    EXPECT_LE(a->data + a->bytes, base + 5 * slab) << bytes;
    slabs.push_back(*a);
  }
  EXPECT_EQ(pool->GetStats().reserved_bytes, 5 * slab);
  for (const Allocation& a : slabs) pool->Free(a);
  ExpectAllReleased(*pool);
}

// Only scattered single slabs free: a span still gets exactly the capacity
// left, because each span is its own mapping (cached slabs are unmapped).
TEST(SlabPoolTest, ScatteredFreeSlabsDoNotBlockASpan) {
  const uint64_t slab = 64 * kKiB;
  auto pool = MakePool(8 * slab, slab, 64);
  std::vector<Allocation> singles;
  for (int i = 0; i < 8; ++i) {
    auto a = pool->Allocate(slab);
    ASSERT_TRUE(a.ok()) << a.status();
    singles.push_back(*a);
  }
  for (int i = 0; i < 8; i += 2) pool->Free(singles[i]);  // every other slab free
  pool->FlushThreadCaches();  // (a 64 KiB chunk may sit in this thread's cache)
  EXPECT_EQ(pool->GetStats().reserved_bytes, 4 * slab);
  // The 40 KiB class takes spans of 5 slabs (8 chunks): 4 + 5 > 8 slabs.
  EXPECT_EQ(pool->Allocate(40 * kKiB).status().code(), absl::StatusCode::kResourceExhausted);
  pool->Free(singles[1]);
  auto span_chunk = pool->Allocate(40 * kKiB);  // 3 + 5 = 8 slabs: exactly fits
  ASSERT_TRUE(span_chunk.ok()) << span_chunk.status();
  EXPECT_EQ(pool->GetStats().reserved_bytes, 8 * slab);
  FillWords(*span_chunk, 99);
  EXPECT_EQ(pool->Allocate(64).status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_TRUE(WordsIntact(*span_chunk, 99));
  pool->Free(*span_chunk);
  for (int i = 3; i < 8; i += 2) pool->Free(singles[i]);
  ExpectAllReleased(*pool);
}

// A new chunk comes from the fullest partly used slab of its class, so a
// sparse slab drains and is released. (The central lists' choice: with
// per-thread caches a thread gets back the chunk it freed last.)
TEST(SlabPoolTest, AllocatesFromTheFullestSlab) {
  const uint64_t slab = 64 * kKiB;
  auto pool = MakePool(16 * slab, slab, 64, /*thread_cache=*/0);
  std::vector<Allocation> live;
  for (int i = 0; i < 8; ++i) live.push_back(*pool->Allocate(16 * kKiB));  // 2 slabs of 4
  auto slab_of = [&](const Allocation& a) { return reinterpret_cast<uintptr_t>(a.data) / slab; };
  ASSERT_NE(slab_of(live[0]), slab_of(live[4]));
  // The second slab turns partly used first (3 live), then the first (1 live):
  // the most recently partly used slab is not the one to fill.
  pool->Free(live[4]);
  for (int i = 0; i < 3; ++i) pool->Free(live[i]);
  for (int round = 0; round < 3; ++round) {
    auto a = pool->Allocate(16 * kKiB);
    ASSERT_TRUE(a.ok());
    EXPECT_EQ(slab_of(*a), slab_of(live[5])) << round;  // the fuller one
    pool->Free(*a);
  }
  pool->Free(live[3]);  // the sparse slab drained: released
  EXPECT_EQ(pool->GetStats().reserved_bytes, slab);
  for (int i = 5; i < 8; ++i) pool->Free(live[i]);
  EXPECT_EQ(pool->GetStats().reserved_bytes, 0u);
}

}  // namespace
}  // namespace kvcache
