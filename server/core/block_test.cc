// StagingBlock and BlockPayload: a block's memory is written while staged,
// becomes a sealed payload without a copy, goes back to its pool when
// dropped unsealed, and can never be sealed with another size.
#include "server/core/block.h"

#include <gtest/gtest.h>

#include <cstring>
#include <memory>
#include <utility>

namespace kvcache {
namespace {

std::unique_ptr<SlabPool> Pool() {
  auto pool =
      SlabPool::Create({.capacity_bytes = 1 << 20, .slab_bytes = 64 << 10, .min_class_bytes = 64});
  EXPECT_TRUE(pool.ok()) << pool.status();
  return pool.ok() ? *std::move(pool) : nullptr;
}

TEST(StagingBlockTest, SealingMakesThePayloadOfTheSameMemoryWithItsSeal) {
  std::unique_ptr<SlabPool> pool = Pool();
  auto a = pool->Allocate(1000);
  ASSERT_TRUE(a.ok());
  StagingBlock staged(pool.get(), *a, 1000);
  std::memset(staged.data().data(), 0x5a, 1000);
  const std::byte* memory = staged.data().data();
  const uint64_t checksum = Checksum(staged.data());
  BlockRef payload = std::move(staged).Seal(42, BlockSeal::Raw(1000, checksum));
  EXPECT_TRUE(staged.empty());  // NOLINT(bugprone-use-after-move): sealing empties it
  EXPECT_EQ(payload->data().data(), memory);
  EXPECT_EQ(payload->size(), 1000u);
  EXPECT_EQ(payload->key(), 42u);
  EXPECT_EQ(payload->checksum(), checksum);
  EXPECT_EQ(payload->decoded_checksum(), checksum);
  EXPECT_EQ(payload->footprint(), a->bytes);
  EXPECT_EQ(payload->in_place_bytes()->data(), memory);
  EXPECT_EQ(pool->GetStats().live_allocations, 1u);
  payload.reset();
  EXPECT_EQ(pool->GetStats().live_allocations, 0u);
}

TEST(StagingBlockTest, AnUnsealedBlockGoesBackToItsPool) {
  std::unique_ptr<SlabPool> pool = Pool();
  {
    auto a = pool->Allocate(4096);
    ASSERT_TRUE(a.ok());
    StagingBlock staged(pool.get(), *a, 4096);
    StagingBlock moved = std::move(staged);
    EXPECT_FALSE(moved.empty());
    StagingBlock assigned;
    assigned = std::move(moved);
    EXPECT_EQ(pool->GetStats().live_allocations, 1u);
  }
  EXPECT_EQ(pool->GetStats().live_allocations, 0u);
}

TEST(StagingBlockDeathTest, ASealOfAnotherSizeAborts) {
  EXPECT_DEATH(
      {
        StagingBlock staged = StagingBlock::OnHeap(64);
        BlockRef payload = std::move(staged).Seal(0, BlockSeal::Raw(128, 0));
      },
      "a seal of 128 bytes for a block of 64");
}

}  // namespace
}  // namespace kvcache
