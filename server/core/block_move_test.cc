// BlockMove: a claim finds its block again only while the block holds the
// claimed copies (or, for RefindSealed, the claimed bytes), never after the
// block or its model is gone; and the claim keeps its source readable.
#include "server/core/block_move.h"

#include <gtest/gtest.h>

#include <cstring>
#include <memory>
#include <vector>

#include "server/core/block_test_util.h"
#include "server/core/memory_tier.h"

namespace kvcache {
namespace {

constexpr uint32_t kBt = 4;
const ModelKey kModel{"default", "m"};

std::vector<Token> Block(uint32_t id) { return {id, id + 1, id + 2, id + 3}; }

// A sealed heap payload of 64 bytes, every byte `fill`.
BlockRef Payload(uint8_t fill) {
  const std::vector<std::byte> bytes(64, std::byte{fill});
  return SealedHeapBlock(bytes);
}

class BlockMoveTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto state = std::make_unique<ModelState>(kModel, ModelLayout{1, 1, 8, DType::kFp16, kBt},
                                              ImportancePolicy{}, 16);
    auto added = models_.Add(std::move(state));
    ASSERT_TRUE(added.ok()) << added.status();
    model_ = *added;
    node_ = model_->index.AddChild(nullptr, Block(1), Payload(1));
    ASSERT_NE(node_, nullptr);
  }
  PrefixIndex& index() { return model_->index; }

  ModelRegistry models_{8};
  ModelState* model_ = nullptr;
  IndexNode* node_ = nullptr;
  std::shared_ptr<MemoryTier> ssd_ = MemoryTier::Create(1 << 20);
};

TEST_F(BlockMoveTest, AnUnchangedBlockIsFoundAgain) {
  const BlockMove move = BlockMove::Claim(*node_);
  EXPECT_TRUE(move.claimed());
  EXPECT_EQ(move.Refind(models_), node_);
  EXPECT_EQ(move.RefindSealed(models_), node_);
  EXPECT_EQ(move.key(), node_->key);
  EXPECT_EQ(move.seal().checksum, node_->payload->checksum());
  EXPECT_FALSE(BlockMove().claimed());
  EXPECT_EQ(BlockMove().Refind(models_), nullptr);
}

TEST_F(BlockMoveTest, TheClaimHoldsTheSourceAndMarksItClaimed) {
  const BlockPayload* source = node_->payload.get();
  BlockMove move = BlockMove::Claim(*node_);
  EXPECT_EQ(node_->payload.use_count(), 2);  // what the pickers read as "claimed"
  index().RemoveSubtree(node_, [](IndexNode*) {});
  // The block is gone; its bytes are still there to read.
  EXPECT_EQ(move.host().get(), source);
  EXPECT_EQ(Checksum(move.host()->data()), move.seal().checksum);
  EXPECT_EQ(move.Refind(models_), nullptr);
  EXPECT_EQ(move.RefindSealed(models_), nullptr);
  move.Release();
  EXPECT_FALSE(move.claimed());
}

TEST_F(BlockMoveTest, ABlockWhoseBytesWereReplacedIsNotFound) {
  const BlockMove move = BlockMove::Claim(*node_);
  node_->payload = Payload(2);  // e.g. re-encoded, or made exact by an append
  EXPECT_EQ(move.Refind(models_), nullptr);
  EXPECT_EQ(move.RefindSealed(models_), nullptr);  // other bytes, other seal
}

TEST_F(BlockMoveTest, AnEqualCopyInPlaceOfTheClaimedOneIsNotTheSameCopy) {
  // Pool compaction installed another copy of the same bytes meanwhile:
  // a move of the old copy must not commit (its chunk is no longer the
  // block's), while a move that only adds a copy of the bytes still may.
  const BlockMove move = BlockMove::Claim(*node_);
  node_->payload = Payload(1);
  EXPECT_EQ(move.Refind(models_), nullptr);
  EXPECT_EQ(move.RefindSealed(models_), node_);
}

TEST_F(BlockMoveTest, ABlockRemovedAndStoredAgainIsNotFound) {
  const BlockMove move = BlockMove::Claim(*node_);
  index().RemoveSubtree(node_, [](IndexNode*) {});
  IndexNode* again = index().AddChild(nullptr, Block(1), Payload(1));
  ASSERT_NE(again, nullptr);
  EXPECT_EQ(move.Refind(models_), nullptr);
  EXPECT_EQ(move.RefindSealed(models_), again);  // the same bytes, cached again
}

TEST_F(BlockMoveTest, ABlockOfAnUnregisteredModelIsNotFound) {
  const BlockMove move = BlockMove::Claim(*node_);
  std::unique_ptr<ModelState> removed = models_.Remove(kModel);
  ASSERT_NE(removed, nullptr);
  EXPECT_EQ(move.Refind(models_), nullptr);
  EXPECT_EQ(move.RefindSealed(models_), nullptr);
  removed.reset();  // the index is destroyed; the claim never reads it again
  EXPECT_EQ(move.Refind(models_), nullptr);
}

TEST_F(BlockMoveTest, ALowerOnlyClaimNeedsTheSameLowerCopyAndNoHostCopy) {
  absl::StatusOr<StoredRef> lower = ssd_->Write(node_->key, *node_->payload);
  ASSERT_TRUE(lower.ok()) << lower.status();
  node_->lower.at(0) = *lower;
  BlockRef host = std::move(node_->payload);  // demoted: lower-only now
  const BlockMove move = BlockMove::Claim(*node_);
  EXPECT_EQ(move.host(), nullptr);
  EXPECT_EQ(move.lower(), node_->lower.at(0));
  EXPECT_EQ(move.Refind(models_), node_);

  node_->payload = host;  // promoted by another reader meanwhile
  EXPECT_EQ(move.Refind(models_), nullptr);
  EXPECT_EQ(move.RefindSealed(models_), node_);

  node_->payload = nullptr;  // and demoted again, to a new lower copy
  absl::StatusOr<StoredRef> rewritten = ssd_->Write(node_->key, *host);
  ASSERT_TRUE(rewritten.ok());
  node_->lower.at(0) = *rewritten;
  EXPECT_EQ(move.Refind(models_), nullptr);
  EXPECT_EQ(move.RefindSealed(models_), node_);
}

TEST_F(BlockMoveTest, AReadersBlockClaimsTheCopyTheReaderHolds) {
  TieredBlock taken = TieredBlock::Of(*node_, PinReason::kFetch);
  const BlockMove move = BlockMove::Claim(&index(), taken);
  EXPECT_EQ(move.host(), taken.host);
  EXPECT_EQ(move.Refind(models_), node_);
  node_->payload = Payload(1);
  EXPECT_EQ(move.Refind(models_), nullptr);
}

}  // namespace
}  // namespace kvcache
