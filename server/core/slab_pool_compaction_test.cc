// SlabPool's compaction (slab_pool.h, PlanCompaction / AllocateMoveTarget):
// plans that drain the sparsest spans and release them, capacity kept exact
// while spans drain, plans bounded by max_bytes and max_span_occupancy, and a
// randomized churn with compaction passes that never changes a live byte.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <iterator>
#include <random>
#include <vector>

#include "server/core/slab_pool.h"
#include "server/core/slab_pool_test_util.h"

namespace kvcache {
namespace {

using namespace slab_pool_test;  // NOLINT: the shared pool helpers

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
