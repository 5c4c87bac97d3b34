// Cache::CompactPool: blocks move to fuller spans without a reader waiting,
// every byte read afterwards is exact, and a block that changes during the
// copy is left alone.
#include <vector>

#include "server/core/cache_test_util.h"

namespace kvcache {
namespace cache_test {
namespace {

// 512-byte blocks: 128 per 64 KiB slab.
constexpr uint32_t kPerSlab = 128;

class PoolCompactionTest : public CacheTest {
 protected:
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
  absl::StatusOr<FetchPlan> in_flight = cache_->PrepareFetch(Small().key, Seq({0}));
  ASSERT_TRUE(in_flight.ok());
  ASSERT_EQ(in_flight->blocks.size(), 1u);
  const BlockPayload* old = in_flight->blocks[0].get();

  const PoolCompactionResult r = cache_->CompactPool();
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
  auto again = cache_->PrepareFetch(Small().key, Seq({0}));
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
  for (uint32_t id : kept) EXPECT_EQ(Fetched(Small(), Seq({id})), kBt) << id;
  // Nothing left to move: one partly used span.
  EXPECT_EQ(cache_->CompactPool().planned_blocks, 0u);
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
  const PoolCompactionResult r = cache_->CompactPool(options);
  EXPECT_EQ(r.planned_blocks, kPerSlab / 4);
  EXPECT_EQ(r.changed_blocks, 2u);
  EXPECT_EQ(r.moved_blocks, kPerSlab / 4 - 2);
  EXPECT_EQ(cache_->GetStats().pool_compaction.changed_blocks, 2u);
  EXPECT_EQ(Fetched(Small(), Seq({4})), kBt);
  EXPECT_EQ(Matched(Small(), Seq({8})), 0u);
  for (uint32_t id = 0; id < kPerSlab; id += 4) {
    if (id != 8) EXPECT_EQ(Fetched(Small(), Seq({id})), kBt) << id;
  }
  // No copy of the changed blocks was left behind in the pool.
  const CacheStats s = cache_->GetStats();
  EXPECT_EQ(s.host_pool.allocated_bytes, s.payload_bytes);
}

TEST_F(PoolCompactionTest, ACopyThatFailsItsChecksumIsNotInstalled) {
  FillTwoSparseSpans();
  auto plan = cache_->PrepareFetch(Small().key, Seq({12}));
  ASSERT_TRUE(plan.ok());
  const BlockPayload* stored = plan->blocks[0].get();
  // Memory corruption in pool memory: the stored bytes no longer match.
  const_cast<std::byte*>(stored->data().data())[5] ^= std::byte{1};
  plan = FetchPlan{};
  const PoolCompactionResult r = cache_->CompactPool();
  EXPECT_EQ(r.mismatched_blocks, 1u);
  EXPECT_EQ(r.moved_blocks, kPerSlab / 4 - 1);
  auto after = cache_->PrepareFetch(Small().key, Seq({12}));
  ASSERT_TRUE(after.ok());
  ASSERT_EQ(after->blocks.size(), 1u);
  EXPECT_EQ(after->blocks[0].get(), stored);  // left where it was, for its checksum to catch
  EXPECT_NE(Checksum(after->blocks[0]->data()), after->blocks[0]->checksum());
}

}  // namespace
}  // namespace cache_test
}  // namespace kvcache
