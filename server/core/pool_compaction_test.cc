// Compactor::CompactPool: blocks move to fuller spans without a reader waiting,
// every byte read afterwards is exact, and a block that changes during the
// copy is left alone.
#include <atomic>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "server/core/cache_test_util.h"
#include "server/core/compactor.h"

namespace kvcache {
namespace cache_test {
namespace {

// 512-byte blocks: 128 per 64 KiB slab.
constexpr uint32_t kPerSlab = 128;

class PoolCompactionTest : public CacheTest {
 protected:
  // The tests expect exact spans (CacheTest::pool_thread_cache_bytes_).
  PoolCompactionTest() { pool_thread_cache_bytes_ = 0; }

  // Stores blocks 0..255 (one per sequence: slab A holds 0..127, slab B
  // 128..255), then evicts all but every fourth block of A and all but the
  // even blocks of B. Returns the ids kept.
  Ids FillTwoSparseSpans() {
    MakeCache(4);
    Register(Small());
    for (uint32_t id = 0; id < 2 * kPerSlab; ++id) {
      auto r = Append(*cache_, Small(), Seq({id}));
      EXPECT_TRUE(r.ok()) << r.status();
    }
    EXPECT_EQ(cache_->GetStats().host_pool.reserved_bytes, 2 * kSlab);
    Ids kept;
    for (uint32_t id = 0; id < 2 * kPerSlab; ++id) {
      const bool keep = id < kPerSlab ? id % 4 == 0 : id % 2 == 0;
      if (keep) {
        kept.push_back(id);
      } else {
        EXPECT_TRUE(cache_->EvictPrefix(Small().key, Seq({id})).ok());
      }
    }
    return kept;  // A: 32 live, B: 64 live
  }
};

TEST_F(PoolCompactionTest, MovesBlocksWhileAFetchHoldsTheOldPayload) {
  const Ids kept = FillTwoSparseSpans();
  // A fetch in flight holds block 0 (in A, the span to drain).
  absl::StatusOr<FetchPlan> in_flight = cache_->PrepareFetch(Small().key, {.tokens = Seq({0})});
  ASSERT_TRUE(in_flight.ok());
  ASSERT_EQ(in_flight->blocks.size(), 1u);
  const BlockPayload* old = in_flight->blocks[0].get();

  const PoolCompactionResult r = Compactor(cache_.get()).CompactPool();
  EXPECT_EQ(r.draining_spans, 1u);
  EXPECT_EQ(r.planned_blocks, kPerSlab / 4);
  EXPECT_EQ(r.moved_blocks, kPerSlab / 4);  // block 0 too: its reader keeps the old copy
  EXPECT_EQ(r.moved_bytes, kPerSlab / 4 * Small().layout.BlockBytes());
  EXPECT_EQ(r.changed_blocks, 0u);
  EXPECT_FALSE(r.out_of_targets);

  // The reader still reads exactly what it planned, from the old chunk,
  // which keeps span A reserved until the reader lets go.
  EXPECT_TRUE(PlanHolds(*in_flight, Small(), Seq({0})));
  EXPECT_EQ(cache_->GetStats().host_pool.reserved_bytes, 2 * kSlab);
  auto again = cache_->PrepareFetch(Small().key, {.tokens = Seq({0})});
  ASSERT_TRUE(again.ok());
  EXPECT_NE(again->blocks[0].get(), old);  // the index holds the copy
  EXPECT_TRUE(PlanHolds(*again, Small(), Seq({0})));
  in_flight = FetchPlan{};
  again = FetchPlan{};

  const CacheStats s = cache_->GetStats();
  EXPECT_EQ(s.host_pool.reserved_bytes, kSlab);  // A released
  EXPECT_EQ(s.host_pool.drained_spans, 1u);
  EXPECT_EQ(s.host_pool.allocated_bytes, kept.size() * 512);
  EXPECT_EQ(s.pool_compaction.passes, 1u);
  EXPECT_EQ(s.pool_compaction.moved_blocks, kPerSlab / 4);
  EXPECT_EQ(s.payload_bytes, kept.size() * 512);
  // Every block, moved or not, fetched afterwards holds exactly its bytes.
  for (uint32_t id : kept) {
    EXPECT_EQ(Fetched(Small(), Seq({id})), kBt) << id;
  }
  // Nothing left to move: one partly used span.
  EXPECT_EQ(Compactor(cache_.get()).CompactPool().planned_blocks, 0u);
}

TEST_F(PoolCompactionTest, ABlockChangedDuringTheCopyIsNotSwapped) {
  FillTwoSparseSpans();
  // During the copy, block 4 is evicted and stored again (a new node, maybe
  // at the old one's address, with a new payload) and block 8 is evicted.
  PoolCompactionOptions options;
  options.on_copied = [&] {
    ASSERT_TRUE(cache_->EvictPrefix(Small().key, Seq({4})).ok());
    ASSERT_TRUE(Append(*cache_, Small(), Seq({4})).ok());
    ASSERT_TRUE(cache_->EvictPrefix(Small().key, Seq({8})).ok());
  };
  const PoolCompactionResult r = Compactor(cache_.get()).CompactPool(options);
  EXPECT_EQ(r.planned_blocks, kPerSlab / 4);
  EXPECT_EQ(r.changed_blocks, 2u);
  EXPECT_EQ(r.moved_blocks, kPerSlab / 4 - 2);
  EXPECT_EQ(cache_->GetStats().pool_compaction.changed_blocks, 2u);
  EXPECT_EQ(Fetched(Small(), Seq({4})), kBt);
  EXPECT_EQ(Matched(Small(), Seq({8})), 0u);
  for (uint32_t id = 0; id < kPerSlab; id += 4) {
    if (id != 8) {
      EXPECT_EQ(Fetched(Small(), Seq({id})), kBt) << id;
    }
  }
  // No copy of the changed blocks was left behind in the pool.
  const CacheStats s = cache_->GetStats();
  EXPECT_EQ(s.host_pool.allocated_bytes, s.payload_bytes);
}

TEST_F(PoolCompactionTest, ABlockThatFailsItsChecksumIsDroppedNotMoved) {
  FillTwoSparseSpans();
  auto plan = cache_->PrepareFetch(Small().key, {.tokens = Seq({12})});
  ASSERT_TRUE(plan.ok());
  const BlockPayload* stored = plan->blocks[0].get();
  // Memory corruption in pool memory: the stored bytes no longer match.
  const_cast<std::byte*>(stored->data().data())[5] ^= std::byte{1};
  plan = FetchPlan{};
  const PoolCompactionResult r = Compactor(cache_.get()).CompactPool();
  EXPECT_EQ(r.mismatched_blocks, 1u);
  EXPECT_EQ(r.moved_blocks, kPerSlab / 4 - 1);
  // Never served again: the block left the cache, counted as corrupt.
  EXPECT_EQ(Matched(Small(), Seq({12})), 0u);
  EXPECT_EQ(StatsOf(Small()).corrupt_blocks, 1u);
  for (uint32_t id = 0; id < kPerSlab; id += 4) {
    if (id != 12) {
      EXPECT_EQ(Fetched(Small(), Seq({id})), kBt) << id;
    }
  }
}

// Threads append, fetch (verifying every byte) and evict blocks of three
// sizes while another runs compaction passes; nothing leaks and no fetch
// ever reads a wrong byte.
TEST_F(PoolCompactionTest, ConcurrentWithAppendsFetchesAndEvictions) {
  MakeCache(16);
  const TestModel models[] = {Small(), Mid(), Big()};
  for (const TestModel& m : models) Register(m);
  std::atomic<uint64_t> failures{0}, fetched{0};
  std::atomic<bool> done{false};
  auto fail = [&](const std::string& what) {
    ADD_FAILURE() << what;
    ++failures;
  };
  auto worker = [&](uint64_t seed) {
    std::mt19937_64 rng(seed);
    for (int op = 0; op < 3000; ++op) {
      const TestModel& m = models[rng() % std::size(models)];
      Ids ids;
      for (uint64_t n = 1 + rng() % 3; n > 0; --n) ids.push_back(rng() % 64);
      const std::vector<Token> tokens = Seq(ids);
      const uint64_t kind = rng() % 10;
      if (kind < 4) {
        auto r = Append(*cache_, m, tokens);
        // RESOURCE_EXHAUSTED: all pinned by fetches; ABORTED: a cached block
        // of the sequence was evicted while the append streamed.
        if (!r.ok() && r.status().code() != kResourceExhausted && r.status().code() != kAborted) {
          fail(r.status().ToString());
        }
      } else if (kind < 8) {
        auto plan = cache_->PrepareFetch(m.key, {.tokens = tokens});
        if (!plan.ok()) return fail(plan.status().ToString());
        if (auto held = PlanHolds(*plan, m, tokens); !held) fail(held.message());
        fetched += plan->blocks.size();
      } else {
        auto evicted = cache_->EvictPrefix(m.key, Seq({ids[0]}));
        if (!evicted.ok()) fail(evicted.status().ToString());
      }
    }
  };
  std::thread compactor([&] {
    while (!done.load())
      Compactor(cache_.get()).CompactPool({.plan = {.max_span_occupancy = 0.75}});
  });
  std::vector<std::thread> threads;
  for (uint64_t t = 0; t < 4; ++t) threads.emplace_back(worker, 77 + t);
  for (auto& t : threads) t.join();
  done = true;
  compactor.join();

  EXPECT_EQ(failures.load(), 0u);
  EXPECT_GT(fetched.load(), 0u);
  const CacheStats stats = cache_->GetStats();
  EXPECT_GT(stats.pool_compaction.passes, 0u);
  RecordProperty("moved_blocks", static_cast<int>(stats.pool_compaction.moved_blocks));
  // Nothing leaked: what the pool holds is exactly what the index holds.
  EXPECT_EQ(stats.host_pool.allocated_bytes, stats.payload_bytes);
  EXPECT_EQ(stats.host_pool.live_allocations, stats.blocks);
  EXPECT_LE(stats.host_pool.reserved_bytes, stats.host_pool.capacity_bytes);
  for (const TestModel& m : models) {
    for (uint32_t id = 0; id < 64; ++id) {
      auto plan = cache_->PrepareFetch(m.key, {.tokens = Seq({id})});
      ASSERT_TRUE(plan.ok());
      EXPECT_TRUE(PlanHolds(*plan, m, Seq({id})));
    }
  }
}

}  // namespace
}  // namespace cache_test
}  // namespace kvcache
