// Pins (pin.h): PinnedRef's counting, and the cache pinning exactly what its
// leases, fetches and appends hold, under their reasons.
#include "server/core/pin.h"

#include "server/core/block_test_util.h"
#include "server/core/cache_inspector.h"
#include "server/core/cache_test_util.h"

namespace kvcache {
namespace cache_test {
namespace {

BlockRef HeapBlock() { return SealedHeapBlock(std::vector<std::byte>(64)); }

TEST(PinnedRefTest, CopiesPinMovesTransferAndResetUnpins) {
  BlockRef block = HeapBlock();
  const PinCounts& pins = block->pins();
  EXPECT_FALSE(pins.pinned());
  {
    PinnedBlock a(block, PinReason::kLease);
    EXPECT_EQ(pins.of(PinReason::kLease), 1u);
    PinnedBlock b = a;  // another pin, the same reason
    EXPECT_EQ(pins.of(PinReason::kLease), 2u);
    PinnedBlock c = std::move(b);  // the pin moves with it
    EXPECT_EQ(pins.total(), 2u);
    EXPECT_TRUE(b == nullptr);
    PinnedBlock d(block, PinReason::kFetch);
    EXPECT_EQ(pins.total(), 3u);
    EXPECT_FALSE(pins.only(PinReason::kLease, 2));
    d.reset();
    EXPECT_TRUE(pins.only(PinReason::kLease, 2));
    c = PinnedBlock(block, PinReason::kMove);  // assignment drops c's old pin
    EXPECT_EQ(pins.of(PinReason::kLease), 1u);
    EXPECT_EQ(pins.of(PinReason::kMove), 1u);
    EXPECT_TRUE(c == block);
    BlockRef unpinned = c.Unpin();  // the reference stays, the pin goes
    EXPECT_EQ(unpinned, block);
    EXPECT_TRUE(c == nullptr);
    EXPECT_TRUE(pins.only(PinReason::kLease, 1));
  }
  EXPECT_FALSE(pins.pinned());
  EXPECT_EQ(block.use_count(), 1);
}

TEST(PinnedRefTest, NullHoldsNoPinAndReasonsHaveNames) {
  PinnedBlock none;
  EXPECT_TRUE(none == nullptr);
  none.reset();
  EXPECT_EQ(PinnedBlock(nullptr, PinReason::kMove).get(), nullptr);
  EXPECT_EQ(PinReasonName(PinReason::kLease), "lease");
  EXPECT_EQ(PinReasonName(PinReason::kInspect), "inspect");
}

// The cache pins what a lease and a fetch hold, and neither evicts nor
// re-encodes a pinned block; the pins end with the holders.
TEST_F(CacheTest, LeasesAndFetchesPinTheirBlocksUnderTheirReasons) {
  Register(Small());
  const std::vector<Token> tokens = Seq({1, 2});
  ASSERT_TRUE(Append(*cache_, Small(), tokens).ok());

  auto plan = cache_->PrepareFetch(Small().key, {.tokens = tokens});
  ASSERT_TRUE(plan.ok());
  ASSERT_EQ(plan->blocks.size(), 2u);
  const BlockRef first = plan->blocks[0].ref();  // unpinned: for the checks only
  EXPECT_TRUE(first->pins().only(PinReason::kFetch, 1));

  auto leased = cache_->Lookup(Small().key, tokens, {.acquire = true});
  ASSERT_TRUE(leased.ok());
  ASSERT_NE(leased->lease_id, 0u);
  EXPECT_EQ(first->pins().of(PinReason::kLease), 1u);
  EXPECT_EQ(first->pins().total(), 2u);

  // A fetch under the lease pins for the fetch, not for another lease.
  auto under_lease = cache_->PrepareFetch(Small().key, {.lease_id = leased->lease_id});
  ASSERT_TRUE(under_lease.ok());
  EXPECT_EQ(first->pins().of(PinReason::kFetch), 2u);
  EXPECT_EQ(first->pins().of(PinReason::kLease), 1u);
  under_lease->blocks.clear();
  plan->blocks.clear();
  EXPECT_TRUE(first->pins().only(PinReason::kLease, 1));

  // Pinned: the memory view counts it.
  EXPECT_EQ(CacheInspector(cache_.get()).SnapshotMemory().models.at(0).referenced_blocks, 2u);
  ASSERT_TRUE(cache_->ReleaseLease(leased->lease_id));
  EXPECT_FALSE(first->pins().pinned());
  EXPECT_EQ(CacheInspector(cache_.get()).SnapshotMemory().models.at(0).referenced_blocks, 0u);
}

}  // namespace
}  // namespace cache_test
}  // namespace kvcache
