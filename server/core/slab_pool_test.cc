#include "server/core/slab_pool.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <bit>
#include <cstring>
#include <iterator>
#include <map>
#include <random>
#include <thread>
#include <vector>

#include "absl/base/config.h"

namespace kvcache {
namespace {

using ::testing::HasSubstr;

constexpr uint64_t kKiB = 1024;
constexpr uint64_t kMiB = 1024 * kKiB;

std::unique_ptr<SlabPool> MakePool(uint64_t capacity, uint64_t slab, uint64_t min_class,
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
void WriteTokens(const Allocation& a, uint64_t token) {
  for (uint64_t off = 0; off < a.bytes; off += 64) std::memcpy(a.data + off, &token, 8);
  std::memcpy(a.data + a.bytes - 8, &token, 8);
}

bool TokensIntact(const Allocation& a, uint64_t token) {
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
void ExpectAllReleased(SlabPool& pool) {
  SlabPoolStats stats = pool.GetStats();
  EXPECT_EQ(stats.allocated_bytes, 0u);
  EXPECT_EQ(stats.live_allocations, 0u);
  pool.FlushThreadCaches();
  stats = pool.GetStats();
  EXPECT_EQ(stats.reserved_bytes, 0u);
  EXPECT_EQ(stats.cached_bytes, 0u);
  EXPECT_EQ(stats.allocated_bytes, 0u);
}

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

// Fills every 8-byte word of `a` (usable sizes are multiples of 64) with a
// value derived from `token` and the word's index.
void FillWords(const Allocation& a, uint64_t token) {
  for (uint64_t i = 0; i < a.bytes / 8; ++i) {
    const uint64_t v = token ^ (i * 0x9e3779b97f4a7c15ULL);
    std::memcpy(a.data + 8 * i, &v, 8);
  }
}

bool WordsIntact(const Allocation& a, uint64_t token) {
  for (uint64_t i = 0; i < a.bytes / 8; ++i) {
    uint64_t v;
    std::memcpy(&v, a.data + 8 * i, 8);
    if (v != (token ^ (i * 0x9e3779b97f4a7c15ULL))) return false;
  }
  return true;
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

// The span length the header promises for a class: the fewest slabs (<= 8
// and <= capacity / slab) whose tail is under 1/256 of the span, else the
// one with the smallest tail fraction.
uint64_t ExpectedSpanSlabs(uint64_t chunk, uint64_t slab, uint64_t capacity) {
  const uint64_t max_slabs = std::min<uint64_t>(8, capacity / slab);
  uint64_t best = 1;
  for (uint64_t k = 1; k <= max_slabs; ++k) {
    if ((k * slab % chunk) * 256 < k * slab) return k;
    // tail(k) / k < tail(best) / best, in integers
    if ((k * slab % chunk) * best < (best * slab % chunk) * k) best = k;
  }
  return best;
}

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

// ---- Compaction -------------------------------------------------------------

// `slab`-aligned one-slab spans: the span a chunk is in.
uintptr_t SlabOf(const Allocation& a, uint64_t slab) {
  return reinterpret_cast<uintptr_t>(a.data) / slab;
}

// Moves every allocation of `live` (token i at index i) the plan names, as
// the cache does: target, copy, free the source. Returns the moves.
size_t MoveAll(SlabPool& pool, const CompactionPlan& plan, std::vector<Allocation>& live,
               uint64_t slab) {
  size_t moved = 0;
  for (size_t i = 0; i < live.size(); ++i) {
    if (!plan.Contains(live[i].data)) continue;
    absl::StatusOr<Allocation> target = pool.AllocateMoveTarget(live[i]);
    EXPECT_TRUE(target.ok()) << target.status();
    if (!target.ok()) break;
    EXPECT_EQ(target->bytes, live[i].bytes);
    EXPECT_FALSE(plan.Contains(target->data));
    EXPECT_NE(SlabOf(*target, slab), SlabOf(live[i], slab));
    // Taking a target never frees the source: its bytes are still there.
    EXPECT_TRUE(TokensIntact(live[i], i));
    std::memcpy(target->data, live[i].data, live[i].bytes);
    pool.Free(live[i]);
    live[i] = *target;
    ++moved;
  }
  return moved;
}

TEST(SlabPoolCompactionTest, DrainsTheSparsestSpansAndReleasesThem) {
  const uint64_t slab = 64 * kKiB;
  auto pool = MakePool(4 * slab, slab, 64);
  std::vector<Allocation> all;
  for (int i = 0; i < 256; ++i) all.push_back(*pool->Allocate(kKiB));  // 4 slabs of 64
  ASSERT_EQ(pool->GetStats().reserved_bytes, 4 * slab);
  // Keep 16, 24, 32 and 40 chunks of the four slabs (in allocation order).
  std::vector<Allocation> live;
  const int keep[] = {16, 24, 32, 40};
  for (int s = 0; s < 4; ++s) {
    for (int c = 0; c < 64; ++c) {
      const Allocation& a = all[s * 64 + c];
      if (c < keep[s]) {
        live.push_back(a);
      } else {
        pool->Free(a);
      }
    }
  }
  for (size_t i = 0; i < live.size(); ++i) WriteTokens(live[i], i);
  const std::vector<uint64_t> slabs = {SlabOf(all[0], slab), SlabOf(all[64], slab),
                                       SlabOf(all[128], slab), SlabOf(all[192], slab)};

  // Free chunks: 48 + 40 + 32 + 24 = 144. Draining the 16-live slab leaves 96
  // for its 16; the 24-live one then leaves 56 for 40; the 32-live one would
  // leave 24 for 72: stop.
  absl::StatusOr<CompactionPlan> plan = pool->PlanCompaction({.max_span_occupancy = 0.5});
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_EQ(plan->spans, 2u);
  EXPECT_EQ(plan->moves.size(), 40u);
  EXPECT_EQ(plan->bytes, 40 * kKiB);
  EXPECT_TRUE(
      std::is_sorted(plan->moves.begin(), plan->moves.end(),
                     [](const Allocation& a, const Allocation& b) { return a.data < b.data; }));
  for (const Allocation& m : plan->moves) {
    EXPECT_TRUE(SlabOf(m, slab) == slabs[0] || SlabOf(m, slab) == slabs[1]);
  }
  EXPECT_EQ(pool->GetStats().draining_spans, 2u);
  // A new allocation never lands in a draining span either.
  Allocation extra = *pool->Allocate(kKiB);
  EXPECT_FALSE(SlabOf(extra, slab) == slabs[0] || SlabOf(extra, slab) == slabs[1]);
  pool->Free(extra);

  EXPECT_EQ(MoveAll(*pool, *plan, live, slab), 40u);
  const SlabPoolStats stats = pool->GetStats();
  EXPECT_EQ(stats.reserved_bytes, 2 * slab);  // both drained spans released
  EXPECT_EQ(stats.drained_spans, 2u);
  EXPECT_EQ(stats.draining_spans, 0u);
  EXPECT_EQ(stats.move_targets, 40u);
  EXPECT_EQ(stats.live_allocations, live.size());
  EXPECT_EQ(stats.allocated_bytes, live.size() * kKiB);
  for (size_t i = 0; i < live.size(); ++i) EXPECT_TRUE(TokensIntact(live[i], i)) << i;
  // The released slabs serve another class.
  auto big = pool->Allocate(64 * kKiB);
  ASSERT_TRUE(big.ok());
  auto big2 = pool->Allocate(64 * kKiB);
  ASSERT_TRUE(big2.ok());
  EXPECT_EQ(pool->Allocate(64 * kKiB).status().code(), absl::StatusCode::kResourceExhausted);
  pool->Free(*big);
  pool->Free(*big2);
  for (const Allocation& a : live) pool->Free(a);
  ExpectAllReleased(*pool);
}

TEST(SlabPoolCompactionTest, CapacityStaysExactWhileSpansDrain) {
  const uint64_t slab = 64 * kKiB;
  auto pool = MakePool(2 * slab, slab, 64);
  std::vector<Allocation> all;
  for (int i = 0; i < 128; ++i) all.push_back(*pool->Allocate(kKiB));
  std::vector<Allocation> live;
  for (int c = 0; c < 64; ++c) {  // slab A keeps 4, slab B 54
    if (c < 4)
      live.push_back(all[c]);
    else
      pool->Free(all[c]);
    if (c < 54)
      live.push_back(all[64 + c]);
    else
      pool->Free(all[64 + c]);
  }
  absl::StatusOr<CompactionPlan> plan = pool->PlanCompaction({.max_span_occupancy = 0.5});
  ASSERT_TRUE(plan.ok());
  ASSERT_EQ(plan->spans, 1u);  // A: B's 10 free chunks hold its 4
  ASSERT_EQ(plan->moves.size(), 4u);
  const uintptr_t a_slab = SlabOf(all[0], slab);
  // B's 10 free chunks go first, to appends and move targets alike.
  for (int i = 0; i < 10; ++i) {
    auto a = pool->Allocate(kKiB);
    ASSERT_TRUE(a.ok());
    EXPECT_NE(SlabOf(*a, slab), a_slab);
    live.push_back(*a);
  }
  // No free chunk outside the draining span: no target, and no span reserved.
  EXPECT_EQ(pool->AllocateMoveTarget(plan->moves[0]).status().code(),
            absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(pool->GetStats().reserved_bytes, 2 * slab);
  // Another class fails exactly as without a plan ...
  EXPECT_EQ(pool->Allocate(8 * kKiB).status().code(), absl::StatusCode::kResourceExhausted);
  // ... and this class is still served from the draining span's free chunks,
  // which then stops draining: a plan never fails an allocation.
  auto a = pool->Allocate(kKiB);
  ASSERT_TRUE(a.ok()) << a.status();
  EXPECT_EQ(SlabOf(*a, slab), a_slab);
  EXPECT_EQ(pool->GetStats().draining_spans, 0u);
  live.push_back(*a);
  for (const Allocation& l : live) pool->Free(l);
  ExpectAllReleased(*pool);
  EXPECT_EQ(pool->GetStats().drained_spans, 0u);
}

TEST(SlabPoolCompactionTest, PlansOnlyWhatFitsAndEndsThePreviousPlan) {
  const uint64_t slab = 64 * kKiB;
  auto pool = MakePool(8 * slab, slab, 64);
  EXPECT_EQ(pool->PlanCompaction({.max_span_occupancy = 1.5}).status().code(),
            absl::StatusCode::kInvalidArgument);
  auto run = pool->Allocate(2 * slab);
  ASSERT_TRUE(run.ok());
  EXPECT_EQ(pool->AllocateMoveTarget(*run).status().code(), absl::StatusCode::kInvalidArgument);
  pool->Free(*run);

  std::vector<Allocation> all;
  for (int i = 0; i < 128; ++i) all.push_back(*pool->Allocate(kKiB));
  // One partly used span of the class: nothing to move it to.
  for (int c = 0; c < 64; ++c) pool->Free(all[64 + c]);
  for (int c = 8; c < 64; ++c) pool->Free(all[c]);
  auto plan = pool->PlanCompaction({});
  ASSERT_TRUE(plan.ok());
  EXPECT_TRUE(plan->moves.empty());
  // Two sparse spans (8 and 30 live): the sparser one drains into the other,
  // but not past max_bytes nor max_span_occupancy.
  std::vector<Allocation> live(all.begin(), all.begin() + 8);
  for (int i = 8; i < 64; ++i) live.push_back(*pool->Allocate(kKiB));  // refills span A
  ASSERT_EQ(pool->GetStats().reserved_bytes, slab);
  for (int i = 0; i < 30; ++i) live.push_back(*pool->Allocate(kKiB));  // span B: 30 live
  ASSERT_EQ(pool->GetStats().reserved_bytes, 2 * slab);
  // Free A down to 8 live (the 8 first allocated).
  for (int i = 8; i < 64; ++i) pool->Free(live[i]);
  live.erase(live.begin() + 8, live.begin() + 64);
  ASSERT_EQ(live.size(), 38u);
  EXPECT_TRUE(pool->PlanCompaction({.max_span_occupancy = 0.1})->moves.empty());  // 8/64 > 0.1
  EXPECT_TRUE(pool->PlanCompaction({.max_bytes = 7 * kKiB})->moves.empty());
  plan = pool->PlanCompaction({});
  ASSERT_TRUE(plan.ok());
  EXPECT_EQ(plan->moves.size(), 8u);
  EXPECT_EQ(pool->GetStats().draining_spans, 1u);
  // A new plan that drains nothing ends the previous one.
  EXPECT_TRUE(pool->PlanCompaction({.max_span_occupancy = 0})->moves.empty());
  EXPECT_EQ(pool->GetStats().draining_spans, 0u);
  for (const Allocation& a : live) pool->Free(a);
  ExpectAllReleased(*pool);
}

// A churn of mixed sizes with a compaction pass every 100 operations: no byte
// of a live allocation changes, accounting stays exact, capacity holds.
TEST(SlabPoolCompactionTest, RandomizedChurnWithCompactionKeepsEveryByte) {
  const uint64_t slab = 64 * kKiB;
  const uint64_t capacity = 32 * slab;
  auto pool = MakePool(capacity, slab, 64);
  std::mt19937_64 rng(7);
  const uint64_t sizes[] = {200, 700, 1000, 3000, 5000, 9000, 20000, 40000};
  std::vector<Allocation> live;
  std::vector<uint64_t> tokens;
  uint64_t next_token = 1, moved = 0;
  for (int op = 0; op < 20000; ++op) {
    const uint64_t size = sizes[rng() % std::size(sizes)];
    absl::StatusOr<Allocation> a = pool->Allocate(size);
    while (!a.ok()) {
      ASSERT_EQ(a.status().code(), absl::StatusCode::kResourceExhausted);
      ASSERT_FALSE(live.empty());
      const size_t victim = rng() % live.size();
      pool->Free(live[victim]);
      live.erase(live.begin() + static_cast<ptrdiff_t>(victim));
      tokens.erase(tokens.begin() + static_cast<ptrdiff_t>(victim));
      a = pool->Allocate(size);
    }
    WriteTokens(*a, next_token);
    live.push_back(*a);
    tokens.push_back(next_token++);
    if (op % 100 == 99) {
      auto plan = pool->PlanCompaction({.max_span_occupancy = 0.75});
      ASSERT_TRUE(plan.ok());
      for (size_t i = 0; i < live.size(); ++i) {
        if (!plan->Contains(live[i].data)) continue;
        auto target = pool->AllocateMoveTarget(live[i]);
        if (!target.ok()) break;
        ASSERT_FALSE(plan->Contains(target->data));
        std::memcpy(target->data, live[i].data, live[i].bytes);
        pool->Free(live[i]);
        live[i] = *target;
        ++moved;
      }
      uint64_t bytes = 0;
      for (size_t i = 0; i < live.size(); ++i) {
        ASSERT_TRUE(TokensIntact(live[i], tokens[i])) << "op " << op;
        bytes += live[i].bytes;
      }
      const SlabPoolStats s = pool->GetStats();
      ASSERT_EQ(s.allocated_bytes, bytes);
      ASSERT_EQ(s.live_allocations, live.size());
      ASSERT_LE(s.reserved_bytes, capacity);
    }
  }
  EXPECT_GT(moved, 0u);
  EXPECT_GT(pool->GetStats().drained_spans, 0u);
  for (const Allocation& a : live) pool->Free(a);
  ExpectAllReleased(*pool);
}

}  // namespace
}  // namespace kvcache
