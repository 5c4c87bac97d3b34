// The Cache over three levels: host memory and two lower levels in order
// (MemoryTiers named "near" and "far", standing in for the SSD and a remote
// store). Blocks sink level by level and come back whole from whichever
// level holds their top copy; each level's moves, reads and failures are its
// own; a full level makes room by demoting to the next, not by evicting.
#include "server/core/cache_inspector.h"
#include "server/core/cache_test_util.h"
#include "server/core/memory_tier.h"

namespace kvcache {
namespace cache_test {
namespace {

// Every test runs with each eviction policy ranking every level.
class TierLevelsTest : public CacheTest, public ::testing::WithParamInterface<std::string> {
 protected:
  void SetUp() override {}

  // A host of `slabs` 64 KiB slabs (8 blocks of Big each) over a near level
  // of `near_blocks` Big blocks and a far level of `far_bytes`.
  void MakeLevels(uint64_t slabs, uint64_t near_blocks, uint64_t far_bytes) {
    cache_.reset();
    auto pool = SlabPool::Create(
        {.capacity_bytes = slabs * kSlab, .slab_bytes = kSlab, .min_class_bytes = 64});
    ASSERT_TRUE(pool.ok()) << pool.status();
    near_ = MemoryTier::Create(near_blocks * 8192, "near");
    far_ = MemoryTier::Create(far_bytes, "far");
    CacheOptions options;
    options.tiers.host_high_watermark = 0.9;
    options.tiers.host_low_watermark = 0.8;
    std::vector<Cache::LowerLevel> levels;
    levels.push_back({near_, NewPolicy()});
    levels.push_back({far_, NewPolicy()});
    cache_ =
        std::make_unique<Cache>(options, *std::move(pool), NewPolicy(), &clock_, std::move(levels));
  }
  std::unique_ptr<EvictionPolicy> NewPolicy() {
    return GetParam() == "lru_k" ? NewLruKPolicy(LruKOptions{}, &clock_) : NewLruPolicy();
  }

  // Appends sequences first..first+n-1 of 4 blocks each, migrating after
  // each as the daemon's migrator would.
  void AppendSequences(uint32_t first, uint32_t n) {
    for (uint32_t s = first; s < first + n; ++s) {
      auto r = Append(*cache_, Big(), SequenceOf(s));
      ASSERT_TRUE(r.ok()) << "sequence " << s << ": " << r.status();
      Settle();
    }
  }
  void Settle() {
    for (int i = 0; i < 100 && cache_->tiers().NeedsMigration(); ++i) cache_->tiers().Migrate();
  }
  static std::vector<Token> SequenceOf(uint32_t s) {
    return Seq({s * 100 + 1, s * 100 + 2, s * 100 + 3, s * 100 + 4});
  }
  LowerLevelCounters Level(size_t level) const { return cache_->GetStats().tiers.lower[level]; }
  // Moves of the log from `from` to `to`.
  static int64_t Count(const std::vector<MoveRecord>& moves, std::string_view from,
                       std::string_view to) {
    return std::count_if(moves.begin(), moves.end(), [&](const MoveRecord& m) {
      return std::string_view(m.from) == from && std::string_view(m.to) == to;
    });
  }

  std::shared_ptr<MemoryTier> near_;
  std::shared_ptr<MemoryTier> far_;
};

TEST_P(TierLevelsTest, BlocksSinkLevelByLevelAndComeBackWhole) {
  MakeLevels(4, 16, 4 << 20);  // host 32 blocks, near 16, far roomy
  Register(Big());
  AppendSequences(0, 24);  // 96 blocks
  const CacheStats stats = cache_->GetStats();
  ASSERT_EQ(stats.lower_stores.size(), 2u);
  EXPECT_EQ(stats.lower_stores[0].kind, "near");
  EXPECT_EQ(stats.lower_stores[1].kind, "far");
  const LowerLevelCounters near = stats.tiers.lower[0];
  const LowerLevelCounters far = stats.tiers.lower[1];
  EXPECT_GT(near.demotions, 0u);
  EXPECT_GT(far.demotions, 0u);  // near passed its watermark: its coldest went down
  EXPECT_EQ(near.evictions + far.evictions, 0u);  // nothing left the cache
  EXPECT_EQ(stats.capacity_evictions, 0u);
  // Each level counts its copies as its store does.
  EXPECT_EQ(near.blocks, near_->GetStats().live_copies);
  EXPECT_EQ(far.blocks, far_->GetStats().live_copies);
  EXPECT_LE(near_->GetStats().allocated_bytes, 16u * 8192);
  EXPECT_EQ(stats.blocks, 96u);
  std::vector<MoveRecord> moves = cache_->tiers().DrainMoves();
  EXPECT_EQ(Count(moves, "host", "near"), static_cast<int64_t>(near.demotions));
  EXPECT_EQ(Count(moves, "near", "far"), static_cast<int64_t>(far.demotions));

  // The oldest sequences are in the far level only: a lookup matches them,
  // a fetch reads them back from there, byte for byte, and promotes them.
  auto looked = cache_->Lookup(Big().key, SequenceOf(0));
  ASSERT_TRUE(looked.ok());
  for (const BlockInfo& b : looked->blocks) {
    EXPECT_EQ(b.tier, BlockTier::kLower);
    EXPECT_STREQ(b.lower_kind, "far");  // the level a fetch reads it from
  }
  for (uint32_t s = 0; s < 24; ++s) {
    EXPECT_EQ(Fetched(Big(), SequenceOf(s)), 4 * kBt) << "sequence " << s;
    Settle();
  }
  EXPECT_GT(Level(1).reads, 0u);
  EXPECT_GT(Level(1).promotions, 0u);
  EXPECT_GT(Level(0).reads, 0u);
  EXPECT_EQ(Level(0).checksum_failures + Level(1).checksum_failures, 0u);
  moves = cache_->tiers().DrainMoves();
  EXPECT_GT(Count(moves, "far", "host"), 0);
}

TEST_P(TierLevelsTest, ABlockPromotedFromTheFarLevelLeavesTheHostWithoutAWrite) {
  MakeLevels(4, 16, 4 << 20);
  Register(Big());
  AppendSequences(0, 24);
  ASSERT_EQ(Fetched(Big(), SequenceOf(0)), 4 * kBt);  // far -> host; the far copies stay
  const uint64_t near_writes = near_->GetStats().writes;
  const uint64_t near_demotions = Level(0).demotions;
  const uint64_t far_clean = Level(1).clean_drops;
  // Sequence 0 is the coldest again once newer ones arrive: it leaves the
  // host as a clean drop (the far level has it), written nowhere.
  AppendSequences(24, 12);
  EXPECT_GE(Level(1).clean_drops, far_clean + 4);
  auto looked = cache_->Lookup(Big().key, SequenceOf(0));
  ASSERT_TRUE(looked.ok());
  EXPECT_EQ(looked->matched_tokens, 4 * kBt);
  for (const BlockInfo& b : looked->blocks) EXPECT_EQ(b.tier, BlockTier::kLower);
  // Every write to a level is a demotion into it: the clean drops wrote
  // nothing.
  EXPECT_EQ(near_->GetStats().writes - near_writes, Level(0).demotions - near_demotions);
  EXPECT_EQ(far_->GetStats().writes, Level(1).demotions);
  EXPECT_EQ(Fetched(Big(), SequenceOf(0)), 4 * kBt);
}

TEST_P(TierLevelsTest, ACorruptFarCopyIsDroppedNeverServed) {
  MakeLevels(4, 16, 4 << 20);
  Register(Big());
  AppendSequences(0, 24);
  const std::vector<Token> tokens = SequenceOf(0);
  ASSERT_EQ(far_->Corrupt(PrefixKey(tokens, 2), 100), 1);
  auto plan = cache_->PrepareFetch(Big().key, {.tokens = tokens});
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_EQ(plan->matched_tokens, 2 * kBt);  // ends before the corrupt block
  EXPECT_TRUE(PlanHolds(*plan, Big(), tokens));
  EXPECT_EQ(Level(1).checksum_failures, 1u);
  EXPECT_EQ(Level(0).checksum_failures, 0u);
  EXPECT_EQ(StatsOf(Big()).corrupt_blocks, 1u);
  // The block had no other copy: it and the block below it left the cache.
  EXPECT_EQ(Matched(Big(), tokens), 2 * kBt);
  std::vector<MoveRecord> moves = cache_->tiers().DrainMoves();
  EXPECT_EQ(std::count_if(moves.begin(), moves.end(),
                          [](const MoveRecord& m) {
                            return std::string_view(m.from) == "far" &&
                                   std::string_view(m.reason) == "checksum";
                          }),
            1);
}

TEST_P(TierLevelsTest, VerifyReadsEveryLevelAndNamesTheOneThatFailed) {
  MakeLevels(4, 16, 4 << 20);
  Register(Big());
  AppendSequences(0, 24);
  const std::vector<Token> tokens = SequenceOf(0);  // in the far level only
  ASSERT_EQ(far_->Corrupt(PrefixKey(tokens, 3), 7), 1);
  CacheInspector inspector(cache_.get());
  absl::StatusOr<VerifyProgress> checked =
      inspector.VerifyBlocks({.model = Big().key, .include_lower = true});
  ASSERT_TRUE(checked.ok()) << checked.status();
  EXPECT_EQ(checked->blocks_checked, 96u);  // every block has one copy
  ASSERT_EQ(checked->bad_blocks.size(), 1u);
  EXPECT_EQ(checked->bad_blocks[0].tier, "far");
  EXPECT_EQ(checked->bad_blocks[0].key, PrefixKey(tokens, 3));
  EXPECT_FALSE(checked->bad_blocks[0].dropped);
  EXPECT_EQ(Level(1).checksum_failures, 0u);  // found, not dropped
  checked = inspector.VerifyBlocks({.model = Big().key, .drop_bad = true, .include_lower = true});
  ASSERT_TRUE(checked.ok()) << checked.status();
  ASSERT_EQ(checked->bad_blocks.size(), 1u);
  EXPECT_TRUE(checked->bad_blocks[0].dropped);
  EXPECT_EQ(Level(1).checksum_failures, 1u);
  EXPECT_EQ(Matched(Big(), tokens), 3 * kBt);  // the leaf went, its parents stay
}

TEST_P(TierLevelsTest, ACopyThatFailsItsChecksumOnTheWayDownIsDroppedNotPassedOn) {
  MakeLevels(4, 16, 4 << 20);
  Register(Big());
  const std::vector<Token> tokens = SequenceOf(0);
  uint32_t next = 0;
  // Until sequence 0's leaf sits in the near level (watched in the move log:
  // a lookup would make it hot).
  const uint64_t leaf = PrefixKey(tokens, 3);
  for (bool near = false; !near && next < 24; ++next) {
    AppendSequences(next, 1);
    for (const MoveRecord& m : cache_->tiers().DrainMoves()) {
      near = near || (m.key == leaf && std::string_view(m.to) == "near");
    }
  }
  ASSERT_LT(next, 24u) << "sequence 0 never reached the near level";
  ASSERT_EQ(near_->Corrupt(leaf, 11), 1);
  // More sequences push it on to the far level: the read on the way fails.
  AppendSequences(next, 24 - next);
  EXPECT_EQ(Level(0).checksum_failures, 1u);
  EXPECT_EQ(Level(1).checksum_failures, 0u);
  EXPECT_EQ(StatsOf(Big()).corrupt_blocks, 1u);
  // The leaf left the cache; its parents went down whole and come back whole.
  EXPECT_EQ(Matched(Big(), tokens), 3 * kBt);
  EXPECT_EQ(Fetched(Big(), tokens), 3 * kBt);
}

TEST_P(TierLevelsTest, AFullNearLevelDemotesToTheFarOneInsteadOfEvicting) {
  // No migrator between appends: the host's demotions land on a near level
  // with no room, whose writes make room by demoting its coldest to far.
  MakeLevels(4, 8, 4 << 20);
  Register(Big());
  for (uint32_t s = 0; s < 24; ++s) {
    auto r = Append(*cache_, Big(), SequenceOf(s));
    ASSERT_TRUE(r.ok()) << "sequence " << s << ": " << r.status();
  }
  EXPECT_GT(Level(1).demotions, 0u);
  EXPECT_EQ(Level(0).evictions + Level(1).evictions, 0u);
  EXPECT_EQ(cache_->GetStats().blocks, 96u);
  for (uint32_t s = 0; s < 24; ++s) EXPECT_EQ(Fetched(Big(), SequenceOf(s)), 4 * kBt);
}

TEST_P(TierLevelsTest, TheDeepestFullLevelEvictsItsColdestLeaves) {
  MakeLevels(4, 8, 16 * 8192);  // far holds 16 blocks
  Register(Big());
  AppendSequences(0, 24);
  // 96 blocks, room for 32 + 8 + 16: the far level evicted, whole sequences
  // from their leaves up, and what stayed is served whole.
  EXPECT_GT(Level(1).evictions, 0u);
  EXPECT_EQ(Level(0).evictions, 0u);
  EXPECT_LE(cache_->GetStats().blocks, 56u);
  EXPECT_EQ(Level(1).blocks, far_->GetStats().live_copies);
  for (uint32_t s = 0; s < 24; ++s) {
    const std::vector<Token> tokens = SequenceOf(s);
    EXPECT_EQ(Fetched(Big(), tokens), Matched(Big(), tokens));
  }
}

INSTANTIATE_TEST_SUITE_P(Policies, TierLevelsTest, ::testing::Values("lru", "lru_k"),
                         [](const auto& info) { return info.param; });

}  // namespace
}  // namespace cache_test
}  // namespace kvcache
