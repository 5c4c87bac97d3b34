#include "kvcache/gpu/arena_allocator.h"

#include <gtest/gtest.h>

#include <map>
#include <random>
#include <set>
#include <thread>
#include <utility>
#include <vector>

namespace kvcache::gpu {
namespace {

constexpr uint64_t kKiB = 1024, kMiB = 1024 * 1024;

// An ArenaSource that hands out ids 1, 2, ... and can be told to fail.
struct FakeSource {
  ArenaId next = 1;
  int calls = 0;
  GpuStatus fail_with;
  std::vector<uint64_t> sizes;

  ArenaSource Get() {
    return [this](uint64_t bytes, ArenaId* id) {
      ++calls;
      if (!fail_with.ok()) return fail_with;
      sizes.push_back(bytes);
      *id = next++;
      return GpuStatus::Ok();
    };
  }
};

ArenaAllocatorOptions SmallOptions() {
  ArenaAllocatorOptions options;
  options.capacity_bytes = 16 * kMiB;
  options.arena_bytes = 4 * kMiB;
  options.slab_bytes = 1 * kMiB;
  options.min_block_bytes = 64 * kKiB;
  return options;
}

std::unique_ptr<ArenaAllocator> Make(FakeSource* source,
                                     const ArenaAllocatorOptions& options = SmallOptions()) {
  std::unique_ptr<ArenaAllocator> allocator;
  const GpuStatus s = ArenaAllocator::Create(options, source->Get(), &allocator);
  EXPECT_TRUE(s.ok()) << s.ToString();
  return allocator;
}

TEST(ArenaAllocatorOptions, ValidateNamesTheField) {
  EXPECT_TRUE(ArenaAllocatorOptions{}.Validate().ok());
  EXPECT_TRUE(SmallOptions().Validate().ok());
  const std::vector<std::pair<ArenaAllocatorOptions, std::string>> bad = {
      {{16 * kMiB, 4 * kMiB, 1 * kMiB, 100 * kKiB}, "min_block_bytes"},
      {{16 * kMiB, 4 * kMiB, 1 * kMiB, 128}, "min_block_bytes"},
      {{16 * kMiB, 4 * kMiB, 3 * kMiB, 64 * kKiB}, "slab_bytes"},
      {{16 * kMiB, 4 * kMiB, 32 * kKiB, 64 * kKiB}, "slab_bytes"},
      {{16 * kMiB, 5 * kMiB / 2, 1 * kMiB, 64 * kKiB}, "arena_bytes"},
      {{16 * kMiB, 0, 1 * kMiB, 64 * kKiB}, "arena_bytes"},
      {{2 * kMiB, 4 * kMiB, 1 * kMiB, 64 * kKiB}, "capacity_bytes"},
  };
  for (const auto& [options, field] : bad) {
    const GpuStatus s = options.Validate();
    EXPECT_EQ(s.code, GpuCode::kInvalidArgument) << field;
    EXPECT_NE(s.message.find(field), std::string::npos) << s.message;
  }
  FakeSource source;
  std::unique_ptr<ArenaAllocator> allocator;
  EXPECT_EQ(ArenaAllocator::Create(bad[0].first, source.Get(), &allocator).code,
            GpuCode::kInvalidArgument);
  EXPECT_EQ(ArenaAllocator::Create(SmallOptions(), nullptr, &allocator).code,
            GpuCode::kInvalidArgument);
}

TEST(ArenaAllocator, ClassesArePowersOfTwoAndTheirQuarterSteps) {
  FakeSource source;
  auto allocator = Make(&source);
  EXPECT_EQ(allocator->ClassBytes(0), 0u);
  EXPECT_EQ(allocator->ClassBytes(1), 64 * kKiB);
  EXPECT_EQ(allocator->ClassBytes(64 * kKiB), 64 * kKiB);
  EXPECT_EQ(allocator->ClassBytes(64 * kKiB + 1), 80 * kKiB);
  EXPECT_EQ(allocator->ClassBytes(100 * kKiB), 112 * kKiB);
  EXPECT_EQ(allocator->ClassBytes(300 * kKiB), 320 * kKiB);
  EXPECT_EQ(allocator->ClassBytes(900 * kKiB), 1 * kMiB);
  EXPECT_EQ(allocator->ClassBytes(1 * kMiB), 1 * kMiB);
  EXPECT_EQ(allocator->ClassBytes(1 * kMiB + 1), 0u);
  // Every request gets the smallest class that holds it, wasting at most a
  // fifth of its slot; every class is a multiple of 256 bytes.
  for (uint64_t bytes = 64 * kKiB + 1; bytes <= 1 * kMiB; bytes += 4093) {
    const uint64_t cls = allocator->ClassBytes(bytes);
    ASSERT_GE(cls, bytes);
    EXPECT_LT(cls - bytes, cls / 5 + 1) << bytes;
    EXPECT_EQ(cls % 256, 0u) << bytes;
    // No smaller class holds it: everything from `bytes` up to the class gets the class.
    if (cls - 256 >= bytes) {
      EXPECT_EQ(allocator->ClassBytes(cls - 256), cls) << bytes;
    }
  }
  // Below 1 KiB a quarter step would not be 256-byte aligned: powers of two only.
  ArenaAllocatorOptions tiny = SmallOptions();
  tiny.min_block_bytes = 256;
  auto small = Make(&source, tiny);
  EXPECT_EQ(small->ClassBytes(257), 512u);
  EXPECT_EQ(small->ClassBytes(513), 1024u);
  EXPECT_EQ(small->ClassBytes(1025), 1280u);
}

TEST(ArenaAllocator, ASlabsTailPastItsLastSlotIsNotASlot) {
  FakeSource source;
  auto allocator = Make(&source);
  BlockSlot slot;
  ASSERT_TRUE(allocator->Allocate(400 * kKiB, &slot).ok());
  ASSERT_EQ(slot.bytes, 448 * kKiB);  // two slots per 1 MiB slab, 128 KiB of tail
  const uint64_t slab_start = slot.offset - slot.offset % kMiB;
  EXPECT_EQ(allocator->Free({slot.arena, slab_start + 2 * slot.bytes, slot.bytes}).code,
            GpuCode::kInvalidArgument);
  EXPECT_EQ(allocator->Stats().live_blocks, 1u);
  ASSERT_TRUE(allocator->Free(slot).ok());
}

TEST(ArenaAllocator, BlocksJustOverAPowerOfTwoFillMostOfTheirSlots) {
  // 80 KiB blocks (1.25 x 64 KiB): a power-of-two class would be 128 KiB
  // (62% used); the quarter step takes 80 KiB slots, 12 to a 1 MiB slab.
  FakeSource source;
  auto allocator = Make(&source);
  std::vector<BlockSlot> slots;
  for (;;) {
    BlockSlot slot;
    if (!allocator->Allocate(80 * kKiB, &slot).ok()) break;
    slots.push_back(slot);
  }
  EXPECT_EQ(slots.size(), 16u * 12u);
  EXPECT_GT(allocator->Stats().utilization(), 0.93);
  for (const BlockSlot& slot : slots) ASSERT_TRUE(allocator->Free(slot).ok());
}

TEST(ArenaAllocator, GrowsLazilyAndCarvesSlotsAtClassOffsets) {
  FakeSource source;
  auto allocator = Make(&source);
  EXPECT_EQ(source.calls, 0);
  EXPECT_EQ(allocator->Stats().reserved_bytes, 0u);
  BlockSlot a, b, c;
  ASSERT_TRUE(allocator->Allocate(100 * kKiB, &a).ok());
  ASSERT_TRUE(allocator->Allocate(100 * kKiB, &b).ok());
  ASSERT_TRUE(allocator->Allocate(10, &c).ok());
  EXPECT_EQ(source.calls, 1);
  EXPECT_EQ(source.sizes, std::vector<uint64_t>{4 * kMiB});
  EXPECT_EQ(a.arena, 1u);
  EXPECT_EQ(a.bytes, 112 * kKiB);
  EXPECT_EQ(a.offset % kMiB % (112 * kKiB), 0u);
  EXPECT_NE(a.offset, b.offset);
  EXPECT_EQ(a.offset / kMiB, b.offset / kMiB);  // same slab
  EXPECT_NE(c.offset / kMiB, a.offset / kMiB);  // another class, another slab
  EXPECT_EQ(c.bytes, 64 * kKiB);
  const ArenaAllocatorStats stats = allocator->Stats();
  EXPECT_EQ(stats.capacity_bytes, 16 * kMiB);
  EXPECT_EQ(stats.reserved_bytes, 4 * kMiB);
  EXPECT_EQ(stats.allocated_bytes, 288 * kKiB);
  EXPECT_EQ(stats.requested_bytes, 200 * kKiB + 10);
  EXPECT_EQ(stats.live_blocks, 3u);
  EXPECT_EQ(stats.arenas, 1u);
  EXPECT_EQ(stats.free_slabs, 2u);
  EXPECT_DOUBLE_EQ(stats.utilization(), (200.0 * kKiB + 10) / (4.0 * kMiB));
  EXPECT_EQ(allocator->Arenas(), std::vector<ArenaId>{1});
}

TEST(ArenaAllocator, SlotsNeverOverlapAndStayInsideTheirArena) {
  FakeSource source;
  auto allocator = Make(&source);
  std::mt19937_64 rng(42);
  std::map<std::pair<ArenaId, uint64_t>, uint64_t> live;  // (arena, offset) -> bytes
  for (int i = 0; i < 2000; ++i) {
    if (!live.empty() && rng() % 3 == 0) {
      auto it = live.begin();
      std::advance(it, rng() % live.size());
      ASSERT_TRUE(allocator->Free({it->first.first, it->first.second, it->second}).ok());
      live.erase(it);
      continue;
    }
    const uint64_t bytes = 1 + rng() % (1 * kMiB);
    BlockSlot slot;
    const GpuStatus s = allocator->Allocate(bytes, &slot);
    if (s.code == GpuCode::kResourceExhausted) continue;
    ASSERT_TRUE(s.ok()) << s.ToString();
    ASSERT_GE(slot.bytes, bytes);
    ASSERT_LE(slot.offset + slot.bytes, 4 * kMiB);
    auto next = live.lower_bound({slot.arena, slot.offset});
    if (next != live.end() && next->first.first == slot.arena) {
      ASSERT_GE(next->first.second, slot.offset + slot.bytes);
    }
    if (next != live.begin()) {
      auto prev = std::prev(next);
      if (prev->first.first == slot.arena) {
        ASSERT_LE(prev->first.second + prev->second, slot.offset);
      }
    }
    live[{slot.arena, slot.offset}] = slot.bytes;
  }
  EXPECT_EQ(allocator->Stats().live_blocks, live.size());
  for (const auto& [key, bytes] : live) {
    ASSERT_TRUE(allocator->Free({key.first, key.second, bytes}).ok());
  }
  const ArenaAllocatorStats stats = allocator->Stats();
  EXPECT_EQ(stats.live_blocks, 0u);
  EXPECT_EQ(stats.allocated_bytes, 0u);
  EXPECT_EQ(stats.requested_bytes, 0u);
  EXPECT_EQ(stats.free_slabs, stats.arenas * 4);
}

TEST(ArenaAllocator, FullTierIsResourceExhaustedUntilSomethingIsFreed) {
  FakeSource source;
  auto allocator = Make(&source);
  std::vector<BlockSlot> slots(16);
  for (BlockSlot& slot : slots) ASSERT_TRUE(allocator->Allocate(1 * kMiB, &slot).ok());
  EXPECT_EQ(source.calls, 4);
  BlockSlot extra;
  GpuStatus s = allocator->Allocate(1 * kMiB, &extra);
  EXPECT_EQ(s.code, GpuCode::kResourceExhausted);
  EXPECT_NE(s.message.find("capacity_bytes"), std::string::npos) << s.message;
  EXPECT_EQ(allocator->Allocate(1, &extra).code, GpuCode::kResourceExhausted);
  EXPECT_EQ(source.calls, 4);  // no arena past capacity is asked for
  EXPECT_EQ(allocator->Stats().failed_allocations, 2u);
  EXPECT_DOUBLE_EQ(allocator->Stats().utilization(), 1.0);
  // A freed slab serves any class.
  ASSERT_TRUE(allocator->Free(slots[5]).ok());
  ASSERT_TRUE(allocator->Allocate(64 * kKiB, &extra).ok());
  EXPECT_EQ(extra.arena, slots[5].arena);
  EXPECT_EQ(extra.offset / kMiB, slots[5].offset / kMiB);
  BlockSlot more;
  for (int i = 0; i < 15; ++i) ASSERT_TRUE(allocator->Allocate(64 * kKiB, &more).ok());
  EXPECT_EQ(allocator->Allocate(64 * kKiB, &more).code, GpuCode::kResourceExhausted);
}

TEST(ArenaAllocator, SourceFailuresPropagate) {
  FakeSource source;
  source.fail_with = GpuStatus::Error(GpuCode::kResourceExhausted, "cudaMalloc: out of memory");
  auto allocator = Make(&source);
  BlockSlot slot;
  GpuStatus s = allocator->Allocate(1000, &slot);
  EXPECT_EQ(s.code, GpuCode::kResourceExhausted);
  EXPECT_NE(s.message.find("cudaMalloc"), std::string::npos) << s.message;
  EXPECT_EQ(allocator->Stats().failed_allocations, 1u);
  source.fail_with = GpuStatus::Error(GpuCode::kInternal, "cudaErrorLaunchFailure");
  EXPECT_EQ(allocator->Allocate(1000, &slot).code, GpuCode::kInternal);
  source.fail_with = GpuStatus::Ok();
  EXPECT_TRUE(allocator->Allocate(1000, &slot).ok());
  EXPECT_EQ(allocator->Stats().arenas, 1u);
}

TEST(ArenaAllocator, BadRequestsAndFreesAreRejected) {
  FakeSource source;
  auto allocator = Make(&source);
  BlockSlot slot;
  EXPECT_EQ(allocator->Allocate(0, &slot).code, GpuCode::kInvalidArgument);
  EXPECT_EQ(allocator->Allocate(1 * kMiB + 1, &slot).code, GpuCode::kInvalidArgument);
  ASSERT_TRUE(allocator->Allocate(200 * kKiB, &slot).ok());
  EXPECT_EQ(allocator->Free({99, slot.offset, slot.bytes}).code, GpuCode::kNotFound);
  EXPECT_EQ(allocator->Free({slot.arena, slot.offset, 128 * kKiB}).code,
            GpuCode::kInvalidArgument);  // wrong class
  EXPECT_EQ(allocator->Free({slot.arena, slot.offset + 4096, slot.bytes}).code,
            GpuCode::kInvalidArgument);  // not a slot start
  EXPECT_EQ(allocator->Free({slot.arena, slot.offset + slot.bytes, slot.bytes}).code,
            GpuCode::kInvalidArgument);  // a free slot
  EXPECT_EQ(allocator->Free({slot.arena, 3 * kMiB, slot.bytes}).code,
            GpuCode::kInvalidArgument);  // a free slab
  EXPECT_EQ(allocator->Free({slot.arena, 4 * kMiB, slot.bytes}).code,
            GpuCode::kInvalidArgument);  // past the arena
  ASSERT_TRUE(allocator->Free(slot).ok());
  EXPECT_EQ(allocator->Free(slot).code, GpuCode::kInvalidArgument);  // double free
}

TEST(ArenaAllocator, SourceMustGiveUniqueIds) {
  std::unique_ptr<ArenaAllocator> allocator;
  ASSERT_TRUE(ArenaAllocator::Create(
                  SmallOptions(),
                  [](uint64_t, ArenaId* id) {
                    *id = 7;
                    return GpuStatus::Ok();
                  },
                  &allocator)
                  .ok());
  BlockSlot slot;
  for (int i = 0; i < 4; ++i) ASSERT_TRUE(allocator->Allocate(1 * kMiB, &slot).ok());
  EXPECT_EQ(allocator->Allocate(1 * kMiB, &slot).code, GpuCode::kInternal);
}

TEST(ArenaAllocator, ConcurrentAllocateAndFree) {
  FakeSource source;
  ArenaAllocatorOptions options = SmallOptions();
  options.capacity_bytes = 64 * kMiB;
  auto allocator = Make(&source, options);
  std::vector<std::thread> threads;
  std::vector<std::vector<BlockSlot>> held(4);
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      std::mt19937_64 rng(t);
      for (int i = 0; i < 5000; ++i) {
        if (!held[t].empty() && rng() % 2 == 0) {
          EXPECT_TRUE(allocator->Free(held[t].back()).ok());
          held[t].pop_back();
        } else {
          BlockSlot slot;
          const GpuStatus s = allocator->Allocate(1 + rng() % (256 * kKiB), &slot);
          if (s.ok())
            held[t].push_back(slot);
          else
            EXPECT_EQ(s.code, GpuCode::kResourceExhausted);
        }
      }
    });
  }
  for (std::thread& t : threads) t.join();
  std::set<std::pair<ArenaId, uint64_t>> unique;
  size_t total = 0;
  for (const auto& slots : held) {
    for (const BlockSlot& slot : slots) unique.insert({slot.arena, slot.offset});
    total += slots.size();
  }
  EXPECT_EQ(unique.size(), total);
  EXPECT_EQ(allocator->Stats().live_blocks, total);
}

}  // namespace
}  // namespace kvcache::gpu
