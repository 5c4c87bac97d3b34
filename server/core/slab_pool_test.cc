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

std::unique_ptr<SlabPool> MakePool(uint64_t capacity, uint64_t slab, uint64_t min_class) {
  SlabPoolOptions options;
  options.capacity_bytes = capacity;
  options.slab_bytes = slab;
  options.min_class_bytes = min_class;
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

// A 2 MiB block compressed to 0.58 of its size takes a 1.25 MiB chunk, three
// to a 4 MiB slab, instead of a whole 2 MiB chunk.
TEST(SlabPoolTest, SteppedClassesFitCompressedBlocks) {
  auto pool = MakePool(64 * kMiB, 4 * kMiB, 4 * kKiB);
  const uint64_t compressed = 2 * kMiB * 58 / 100;
  std::vector<Allocation> live;
  for (int i = 0; i < 4; ++i) {
    auto a = pool->Allocate(compressed);
    ASSERT_TRUE(a.ok()) << a.status();
    EXPECT_EQ(a->bytes, kMiB + kMiB / 4);
    EXPECT_EQ(reinterpret_cast<uintptr_t>(a->data) % 64, 0u);
    live.push_back(*a);
    EXPECT_EQ(pool->GetStats().reserved_bytes, (i < 3 ? 1 : 2) * 4 * kMiB) << i;
  }
  for (const Allocation& a : live) pool->Free(a);
  EXPECT_EQ(pool->GetStats().reserved_bytes, 0u);
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
  stats = pool->GetStats();
  EXPECT_EQ(stats.reserved_bytes, 0u);
  EXPECT_EQ(stats.allocated_bytes, 0u);
  EXPECT_EQ(stats.live_allocations, 0u);
}

TEST(SlabPoolTest, CapacityIsAHardLimit) {
  const uint64_t slab = 64 * kKiB;
  auto pool = MakePool(4 * slab + slab / 2, slab, 4 * kKiB);  // room for 4 whole slabs
  std::vector<Allocation> live;
  absl::StatusOr<Allocation> a;
  while ((a = pool->Allocate(13 * kKiB)).ok()) {  // the 14 KiB class: 4 chunks a slab
    live.push_back(*a);
    ASSERT_LE(pool->GetStats().reserved_bytes, 4 * slab + slab / 2);
  }
  EXPECT_EQ(a.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(std::string(a.status().message()), HasSubstr("capacity_bytes"));
  EXPECT_EQ(live.size(), 4u * (slab / (14 * kKiB)));
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
  EXPECT_EQ(pool->GetStats().reserved_bytes, 0u);
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
  EXPECT_EQ(pool->GetStats().reserved_bytes, 0u);
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
  EXPECT_EQ(pool->GetStats().reserved_bytes, 0u);
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

// The contract, modelled exactly: class slabs are slab-aligned (so a chunk's
// slab is its address rounded down), a class allocation must succeed iff a
// slab of its class has a free chunk or one more slab fits, and a run must
// succeed iff its slabs fit.
class ReferenceModel {
 public:
  ReferenceModel(uint64_t capacity, uint64_t slab) : capacity_(capacity), slab_(slab) {}

  bool MustSucceed(uint64_t rounded) const {
    if (rounded > slab_) return reserved_ + rounded <= capacity_;
    for (const auto& [base, s] : slabs_) {
      if (s.chunk_bytes == rounded && s.live < slab_ / rounded) return true;
    }
    return reserved_ + slab_ <= capacity_;
  }

  void OnAllocate(const Allocation& a) {
    allocated_ += a.bytes;
    ++live_;
    if (a.bytes > slab_) {
      reserved_ += a.bytes;
      return;
    }
    const uintptr_t addr = reinterpret_cast<uintptr_t>(a.data);
    ASSERT_LE(addr % slab_ + a.bytes, slab_) << "chunk crosses its slab";
    auto [it, inserted] = slabs_.try_emplace(addr & ~(slab_ - 1), RefSlab{a.bytes, 0});
    if (inserted) reserved_ += slab_;
    ASSERT_EQ(it->second.chunk_bytes, a.bytes) << "slab serves two classes at once";
    ASSERT_LT(it->second.live, slab_ / a.bytes);
    ++it->second.live;
  }

  void OnFree(const Allocation& a) {
    allocated_ -= a.bytes;
    --live_;
    if (a.bytes > slab_) {
      reserved_ -= a.bytes;
      return;
    }
    auto it = slabs_.find(reinterpret_cast<uintptr_t>(a.data) & ~(slab_ - 1));
    ASSERT_NE(it, slabs_.end());
    if (--it->second.live == 0) {
      slabs_.erase(it);
      reserved_ -= slab_;
    }
  }

  void ExpectMatches(const SlabPoolStats& stats, uint64_t failed) const {
    ASSERT_EQ(stats.reserved_bytes, reserved_);
    ASSERT_LE(stats.reserved_bytes, capacity_);
    ASSERT_EQ(stats.allocated_bytes, allocated_);
    ASSERT_EQ(stats.live_allocations, live_);
    ASSERT_EQ(stats.failed_allocations, failed);
  }

 private:
  struct RefSlab {
    uint64_t chunk_bytes;
    uint64_t live;
  };
  const uint64_t capacity_;
  const uint64_t slab_;
  uint64_t reserved_ = 0;
  uint64_t allocated_ = 0;
  uint64_t live_ = 0;
  std::map<uintptr_t, RefSlab> slabs_;
};

void RunRandomized(uint64_t capacity, uint64_t slab, uint64_t min_class, uint64_t seed) {
  auto pool = MakePool(capacity, slab, min_class);
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
        WriteTokens(*a, token);
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
      ASSERT_TRUE(TokensIntact(v.a, v.token)) << "op " << op;
      ranges.erase(reinterpret_cast<uintptr_t>(v.a.data));
      pool->Free(v.a);
      ASSERT_NO_FATAL_FAILURE(ref.OnFree(v.a));
    }
    ASSERT_NO_FATAL_FAILURE(ref.ExpectMatches(pool->GetStats(), failed)) << "op " << op;
  }
  EXPECT_GT(failed, 0u) << "the run never reached capacity";
  for (const Live& v : live) {
    ASSERT_TRUE(TokensIntact(v.a, v.token));
    pool->Free(v.a);
  }
  EXPECT_EQ(pool->GetStats().reserved_bytes, 0u);
}

TEST(SlabPoolTest, RandomizedAgainstReferenceModel) {
  RunRandomized(/*capacity=*/16 * 64 * kKiB + 40 * kKiB, /*slab=*/64 * kKiB, /*min_class=*/64,
                /*seed=*/1);
}

TEST(SlabPoolTest, RandomizedAgainstReferenceModelLargerClasses) {
  RunRandomized(/*capacity=*/4 * kMiB, /*slab=*/256 * kKiB, /*min_class=*/4 * kKiB, /*seed=*/2);
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
  SlabPoolStats stats = pool->GetStats();
  EXPECT_EQ(stats.reserved_bytes, 0u);
  EXPECT_EQ(stats.allocated_bytes, 0u);
  EXPECT_EQ(stats.live_allocations, 0u);
  EXPECT_EQ(stats.failed_allocations, failures.load());
}

}  // namespace
}  // namespace kvcache
