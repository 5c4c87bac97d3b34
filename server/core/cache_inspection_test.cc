// The operator's view of a Cache (cache_inspection.h): VerifyBlocks,
// SnapshotMemory, InspectSequence, InspectHottestPath and TopPrefixes.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>

#include "server/core/block_test_util.h"
#include "server/core/cache.h"
#include "server/core/cache_inspector.h"
#include "server/core/cache_test_util.h"
#include "server/core/compactor.h"
#include "server/core/memory_tier.h"

namespace kvcache::cache_test {
namespace {

using ::testing::Each;
using ::testing::ElementsAre;
using ::testing::Eq;

class CacheInspectionTest : public CacheTest {
 protected:
  CacheInspector Inspector() const { return CacheInspector(cache_.get()); }

  // Sequence s: blocks s*100+1 .. s*100+blocks.
  static std::vector<Token> SequenceOf(uint32_t s, uint32_t blocks) {
    Ids ids;
    for (uint32_t b = 0; b < blocks; ++b) ids.push_back(s * 100 + b + 1);
    return Seq(ids);
  }
  void AppendSequences(const TestModel& m, uint32_t n, uint32_t blocks) {
    for (uint32_t s = 0; s < n; ++s) {
      auto r = Append(*cache_, m, SequenceOf(s, blocks));
      ASSERT_TRUE(r.ok()) << r.status();
    }
  }
  // Flips one bit of the host copy of block `block` of `tokens`.
  void FlipHostByte(const TestModel& m, const std::vector<Token>& tokens, size_t block) {
    auto plan = cache_->PrepareFetch(m.key, {.tokens = tokens});
    ASSERT_TRUE(plan.ok()) << plan.status();
    ASSERT_GT(plan->blocks.size(), block);
    FlipBits(*plan->blocks[block], 3, std::byte{0x10});
  }
  VerifyProgress Verify(VerifyOptions options) {
    options.max_bytes_per_second = 0;
    absl::StatusOr<VerifyProgress> r = Inspector().VerifyBlocks(options);
    EXPECT_TRUE(r.ok()) << r.status();
    return r.ok() ? *r : VerifyProgress{};
  }
};

// ---- VerifyBlocks --------------------------------------------------------------

TEST_F(CacheInspectionTest, VerifyFindsNothingWrongInAnIntactCache) {
  Register(Small());
  Register(Mid());
  AppendSequences(Small(), 3, 3);
  AppendSequences(Mid(), 1, 2);
  const VerifyProgress r = Verify({});
  EXPECT_TRUE(r.done);
  EXPECT_EQ(r.blocks_total, 11u);
  EXPECT_EQ(r.blocks_checked, 11u);
  EXPECT_EQ(r.bytes_checked, 9 * Small().layout.BlockBytes() + 2 * Mid().layout.BlockBytes());
  EXPECT_EQ(r.bytes_checked, r.bytes_total);
  EXPECT_TRUE(r.bad_blocks.empty());
  EXPECT_EQ(r.dropped_blocks, 0u);
}

TEST_F(CacheInspectionTest, VerifyReportsAFlippedBitAndDropsTheBlockOnlyWhenAsked) {
  Register(Small());
  AppendSequences(Small(), 2, 3);
  const std::vector<Token> tokens = SequenceOf(0, 3);
  FlipHostByte(Small(), tokens, 1);

  VerifyProgress r = Verify({});
  ASSERT_EQ(r.bad_blocks.size(), 1u);
  const BadBlockReport& bad = r.bad_blocks[0];
  EXPECT_EQ(bad.model, Small().key);
  EXPECT_EQ(bad.key, PrefixKey(tokens, 1));
  EXPECT_EQ(bad.index, 1u);
  EXPECT_EQ(bad.tier, "host");
  EXPECT_THAT(bad.problem, HasSubstr("checksum"));
  EXPECT_FALSE(bad.dropped);
  EXPECT_EQ(Matched(Small(), tokens), 3 * kBt);  // only reported

  r = Verify({.drop_bad = true});
  ASSERT_EQ(r.bad_blocks.size(), 1u);
  EXPECT_TRUE(r.bad_blocks[0].dropped);
  EXPECT_EQ(r.dropped_blocks, 2u);  // the bad block and the one cached below it
  EXPECT_EQ(Matched(Small(), tokens), kBt);
  EXPECT_EQ(Fetched(Small(), SequenceOf(1, 3)), 3 * kBt);  // the other sequence is whole
  EXPECT_EQ(StatsOf(Small()).corrupt_blocks, 1u);
  EXPECT_TRUE(Verify({}).bad_blocks.empty());
}

TEST_F(CacheInspectionTest, VerifyNarrowsToAModelOrAPrefix) {
  Register(Small());
  Register(Mid());
  AppendSequences(Small(), 2, 3);
  AppendSequences(Mid(), 1, 2);
  EXPECT_EQ(Verify({.model = Mid().key}).blocks_checked, 2u);
  const VerifyProgress prefix =
      Verify({.model = Small().key, .prefix = SequenceOf(1, 2)});  // 2 of its 3 blocks
  EXPECT_EQ(prefix.blocks_checked, 2u);
  EXPECT_EQ(Verify({.ns = "other"}).blocks_total, 0u);
  EXPECT_EQ(Verify({.ns = "default"}).blocks_total, 8u);

  EXPECT_EQ(CodeOf(Inspector().VerifyBlocks({.model = kUnregistered})), kNotFound);
  EXPECT_EQ(CodeOf(Inspector().VerifyBlocks({.prefix = SequenceOf(0, 1)})), kInvalidArgument);
}

TEST_F(CacheInspectionTest, VerifyReportsProgressAndStopsWhenTheCallerGoesAway) {
  Register(Small());
  AppendSequences(Small(), 4, 2);
  FlipHostByte(Small(), SequenceOf(2, 2), 0);
  int calls = 0;
  uint64_t bad_seen = 0;
  VerifyProgress last;
  VerifyProgress r = Verify({.on_progress =
                                 [&](const VerifyProgress& p) {
                                   ++calls;
                                   bad_seen += p.bad_blocks.size();
                                   last = p;
                                   return true;
                                 },
                             .progress_interval = absl::ZeroDuration()});
  EXPECT_EQ(calls, 9);  // after each of 8 blocks, and the end
  EXPECT_TRUE(last.done);
  EXPECT_EQ(bad_seen, 1u);  // each bad block reported once
  EXPECT_EQ(r.bad_blocks.size(), 1u);

  calls = 0;
  r = Verify({.on_progress =
                  [&](const VerifyProgress&) {
                    ++calls;
                    return false;
                  },
              .progress_interval = absl::ZeroDuration()});
  EXPECT_EQ(calls, 1);
  EXPECT_FALSE(r.done);
  EXPECT_EQ(r.blocks_checked, 1u);
}

TEST_F(CacheInspectionTest, VerifyKeepsToItsRate) {
  Register(Mid());  // 2 KiB blocks
  AppendSequences(Mid(), 2, 4);
  const absl::Time start = absl::Now();
  absl::StatusOr<VerifyProgress> r =
      Inspector().VerifyBlocks({.max_bytes_per_second = 32 << 10});  // 16 KiB at 32 KiB/s
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->bytes_checked, 16u << 10);
  EXPECT_GE(absl::Now() - start, absl::Milliseconds(450));
}

TEST_F(CacheInspectionTest, VerifyReadsLowerCopiesWhenAsked) {
  auto pool =
      SlabPool::Create({.capacity_bytes = 4 * kSlab, .slab_bytes = kSlab, .min_class_bytes = 64});
  ASSERT_TRUE(pool.ok());
  auto lower = MemoryTier::Create(4 << 20, "ssd");  // standing in for the SSD
  cache_ = std::make_unique<Cache>(CacheOptions{}, *std::move(pool), NewLruPolicy(), &clock_, lower,
                                   NewLruPolicy());
  Register(Big());  // 8 KiB blocks: 32 fit the host
  AppendSequences(Big(), 12, 4);
  while (cache_->tiers().NeedsMigration()) cache_->tiers().Migrate();
  const std::vector<Token> tokens = SequenceOf(0, 4);  // demoted first
  ASSERT_EQ(lower->Corrupt(PrefixKey(tokens, 2), 100), 1);

  EXPECT_TRUE(Verify({}).bad_blocks.empty());  // host copies only
  VerifyProgress r = Verify({.include_lower = true});
  ASSERT_EQ(r.bad_blocks.size(), 1u);
  EXPECT_EQ(r.bad_blocks[0].tier, "ssd");
  EXPECT_EQ(r.bad_blocks[0].key, PrefixKey(tokens, 2));
  EXPECT_GT(r.blocks_checked, 32u);

  r = Verify({.drop_bad = true, .include_lower = true});
  ASSERT_EQ(r.bad_blocks.size(), 1u);
  EXPECT_TRUE(r.bad_blocks[0].dropped);
  EXPECT_EQ(Matched(Big(), tokens), 2 * kBt);
  EXPECT_TRUE(Verify({.include_lower = true}).bad_blocks.empty());
}

// A model whose blocks compress (finite Gaussian floats), for the checks
// that decode.
class CompressedInspectionTest : public CacheInspectionTest {
 protected:
  static constexpr uint32_t kLayers = 2;
  static constexpr uint32_t kHeads = 2;
  TestModel Model() const {
    return {{"default", "q"}, ModelLayout{kLayers, kHeads, 16, DType::kFp32, kBt}, 5};
  }
  void SetUp() override {
    CacheOptions options;
    options.importance.default_policy.params.sink_tokens = 4;
    options.importance.default_policy.params.recent_window = 16;
    options.importance.cold_after = absl::Seconds(60);
    MakeCache(16, options);
    Register(Model());
    tokens_ = SequenceOf(0, 4);
    std::vector<float> kv(Model().layout.BlockBytes() / 4 * 4);
    std::mt19937 rng(7);
    std::normal_distribution<float> normal;
    for (float& x : kv) x = normal(rng);
    auto session = cache_->BeginAppend(Model().key, tokens_, 0, {}, {});
    ASSERT_TRUE(session.ok());
    ASSERT_TRUE(
        (*session)->Write({reinterpret_cast<const std::byte*>(kv.data()), kv.size() * 4}).ok());
    ASSERT_TRUE((*session)->Commit().ok());
  }
  // Quantize mode keeps the recent window (block 3) raw; budget mode ranks it first instead.
  void Compress(CompressionMode mode, uint64_t expected_blocks = 3) {
    ASSERT_TRUE(cache_->UpdatePolicy(Model().key, {.mode = mode}).ok());
    clock_.Advance(absl::Seconds(61));
    const CompactionResult c = Compactor(cache_.get()).Compact();
    ASSERT_EQ(c.compressed_blocks, expected_blocks);
  }
  std::vector<Token> tokens_;
};

TEST_F(CompressedInspectionTest, VerifyDecodesCompressedBlocks) {
  Compress(CompressionMode::kQuantize);
  EXPECT_TRUE(Verify({}).bad_blocks.empty());
  auto plan = cache_->PrepareFetch(Model().key, {.tokens = tokens_, .accept_lossy = true});
  ASSERT_TRUE(plan.ok());
  ASSERT_TRUE(plan->blocks[1]->compressed());
  FlipBits(*plan->blocks[1], plan->blocks[1]->size() / 2, std::byte{0x40});
  const VerifyProgress r = Verify({});
  ASSERT_EQ(r.bad_blocks.size(), 1u);
  EXPECT_EQ(r.bad_blocks[0].index, 1u);
}

// ---- InspectSequence ---------------------------------------------------------

TEST_F(CompressedInspectionTest, InspectionShowsScoresProtectionAndPrecision) {
  // Attention on block 1's tokens, then quantize: block 3 (recent) stays raw.
  auto lease = cache_->Lookup(Model().key, tokens_, {.acquire = true});
  ASSERT_TRUE(lease.ok());
  std::vector<float> attention(tokens_.size(), 0.0f);
  for (size_t t = kBt; t < 2 * kBt; ++t) attention[t] = 1.0f;
  ASSERT_TRUE(cache_->ReportAttention(Model().key, tokens_, lease->lease_id, attention, 1).ok());
  ASSERT_TRUE(cache_->ReleaseLease(lease->lease_id));  // leased blocks are not compressed
  Compress(CompressionMode::kQuantize);

  absl::StatusOr<SequenceInspection> r =
      Inspector().InspectSequence(Model().key, tokens_, /*include_heads=*/true);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->matched_tokens, 4 * kBt);
  EXPECT_EQ(r->tokens, tokens_);
  ASSERT_EQ(r->blocks.size(), 4u);
  EXPECT_EQ(r->blocks[1].format_version, 1u);
  EXPECT_TRUE(r->blocks[1].lossy);
  EXPECT_EQ(r->blocks[3].format_version, 0u);
  EXPECT_LT(r->blocks[1].stored_bytes, r->blocks[1].raw_bytes);
  ASSERT_EQ(r->activity.size(), 4 * kBt);
  EXPECT_GT(r->activity[kBt], 0.4f);
  EXPECT_EQ(r->activity[2 * kBt], 0.0f);
  EXPECT_GT(r->importance[kBt + 1], r->importance[2 * kBt + 1]);
  // Sinks and the recent window are protected and kept exact.
  EXPECT_EQ(r->is_protected[0], 1);
  EXPECT_EQ(r->is_protected[3 * kBt], 1);
  EXPECT_EQ(r->is_protected[kBt], 0);
  EXPECT_EQ(r->precision[0], StoredPrecision::kFull);
  EXPECT_EQ(r->precision[kBt], StoredPrecision::kInt8);
  EXPECT_EQ(r->precision[3 * kBt], StoredPrecision::kFull);
  // Per (layer, head): version 1 keeps one precision per token.
  ASSERT_EQ(r->head_precision.size(), kLayers * kHeads * 4 * kBt);
  EXPECT_EQ(r->head_precision[3 * 4 * kBt + kBt], StoredPrecision::kInt8);
  EXPECT_TRUE(r->head_activity.empty());  // no per-head reports
  EXPECT_EQ(r->attention_reports, 1u);
}

TEST_F(CompressedInspectionTest, BudgetModeInspectionHasPerHeadMaps) {
  auto lease = cache_->Lookup(Model().key, tokens_, {.acquire = true});
  ASSERT_TRUE(lease.ok());
  ASSERT_TRUE(
      cache_->UpdatePolicy(Model().key, {.mode = CompressionMode::kBudget, .target_bytes = 0.3})
          .ok());
  std::vector<float> attention(kLayers * kHeads * tokens_.size(), 0.0f);
  for (size_t t = 0; t < tokens_.size(); ++t) attention[t] = 1.0f;  // layer 0, head 0 only
  ASSERT_TRUE(
      cache_->ReportAttention(Model().key, tokens_, lease->lease_id, attention, kLayers).ok());
  ASSERT_TRUE(cache_->ReleaseLease(lease->lease_id));  // leased blocks are not compressed
  Compress(CompressionMode::kBudget, 4);
  absl::StatusOr<SequenceInspection> r = Inspector().InspectSequence(Model().key, tokens_, true);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->blocks[1].format_version, 2u);
  ASSERT_EQ(r->head_activity.size(), kLayers * kHeads * 4 * kBt);
  EXPECT_GT(r->head_activity[kBt], 0.4f);            // layer 0 head 0
  EXPECT_EQ(r->head_activity[4 * kBt + kBt], 0.0f);  // layer 0 head 1
  // At 30% of the bytes some entries are below full precision.
  int reduced = 0;
  for (StoredPrecision p : r->head_precision) reduced += p != StoredPrecision::kFull ? 1 : 0;
  EXPECT_GT(reduced, 0);
}

TEST_F(CacheInspectionTest, InspectingWhatIsNotCached) {
  Register(Small());
  AppendSequences(Small(), 1, 2);
  absl::StatusOr<SequenceInspection> r =
      Inspector().InspectSequence(Small().key, SequenceOf(5, 2), false);
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->matched_tokens, 0u);
  EXPECT_TRUE(r->blocks.empty());
  EXPECT_EQ(CodeOf(Inspector().InspectSequence(kUnregistered, SequenceOf(0, 1), false)), kNotFound);
}

TEST_F(CacheInspectionTest, PinnedTokensAreMarked) {
  Register(Small());
  const std::vector<Token> tokens = SequenceOf(0, 2);
  AppendHints hints;
  hints.protected_ranges = {{.begin = 20, .end = 24}};
  ASSERT_TRUE(Append(*cache_, Small(), tokens, 0, hints).ok());
  absl::StatusOr<SequenceInspection> r = Inspector().InspectSequence(Small().key, tokens, false);
  ASSERT_TRUE(r.ok());
  std::vector<int> pinned;
  for (size_t t = 0; t < r->pinned.size(); ++t) {
    if (r->pinned[t] != 0) pinned.push_back(static_cast<int>(t));
  }
  EXPECT_THAT(pinned, ElementsAre(20, 21, 22, 23));
}

// ---- InspectHottestPath and TopPrefixes ----------------------------------------

TEST_F(CacheInspectionTest, TheHottestPathFollowsTheMostUsedBranch) {
  Register(Small());
  const std::vector<Token> a = Seq({1, 2, 3});
  const std::vector<Token> b = Seq({1, 7, 8, 9});
  ASSERT_TRUE(Append(*cache_, Small(), a).ok());
  ASSERT_TRUE(Append(*cache_, Small(), b).ok());
  for (int i = 0; i < 3; ++i) Matched(Small(), a);
  absl::StatusOr<SequenceInspection> r =
      Inspector().InspectHottestPath(Small().key, PrefixKey(a, 0), false);
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->tokens, a);
  for (int i = 0; i < 6; ++i) Matched(Small(), b);
  r = Inspector().InspectHottestPath(Small().key, PrefixKey(a, 0), false);
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->tokens, b);
  r = Inspector().InspectHottestPath(Small().key, 12345, false);  // no such first block
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->matched_tokens, 0u);
}

TEST_F(CacheInspectionTest, TopPrefixesRankSubtreesByUse) {
  Register(Small());
  Register(Mid());
  ASSERT_TRUE(Append(*cache_, Small(), Seq({1, 2, 3})).ok());
  ASSERT_TRUE(Append(*cache_, Small(), Seq({1, 4})).ok());
  ASSERT_TRUE(Append(*cache_, Small(), Seq({5})).ok());
  ASSERT_TRUE(Append(*cache_, Mid(), Seq({6, 7})).ok());
  for (int i = 0; i < 4; ++i) Matched(Mid(), Seq({6, 7}));
  std::vector<PrefixSummary> top = Inspector().TopPrefixes(2);
  ASSERT_EQ(top.size(), 2u);
  EXPECT_EQ(top[0].model, Mid().key);
  EXPECT_EQ(top[0].blocks, 2u);
  EXPECT_EQ(top[0].depth, 2u);
  EXPECT_EQ(top[0].bytes, 2 * Mid().layout.BlockBytes());
  EXPECT_EQ(top[1].model, Small().key);
  EXPECT_EQ(top[1].key, PrefixKey(Seq({1}), 0));
  EXPECT_EQ(top[1].blocks, 4u);  // 1, 2, 3 and 4
  EXPECT_EQ(top[1].depth, 3u);
  ASSERT_EQ(top[1].first_tokens.size(), 16u);
  EXPECT_EQ(top[1].first_tokens[0], 1024u);
  EXPECT_EQ(Inspector().TopPrefixes(10).size(), 3u);
}

// ---- SnapshotMemory ----------------------------------------------------------

TEST_F(CacheInspectionTest, SnapshotCountsBlocksLeasesAndReaders) {
  Register(Small());
  AppendSequences(Small(), 3, 2);
  clock_.Advance(absl::Seconds(5));
  auto lease = cache_->Lookup(Small().key, SequenceOf(1, 2), {.acquire = true});
  ASSERT_TRUE(lease.ok());
  clock_.Advance(absl::Seconds(2));
  auto plan = cache_->PrepareFetch(Small().key, {.tokens = SequenceOf(2, 2)});  // a fetch in flight
  ASSERT_TRUE(plan.ok());

  const MemorySnapshot s = Inspector().SnapshotMemory();
  ASSERT_EQ(s.models.size(), 1u);
  const ModelMemory& m = s.models[0];
  EXPECT_EQ(m.host_blocks, 6u);
  EXPECT_EQ(m.host_bytes, 6 * Small().layout.BlockBytes());
  EXPECT_EQ(m.raw_blocks, 6u);
  EXPECT_EQ(m.leased_blocks, 2u);
  EXPECT_EQ(m.referenced_blocks, 4u);  // the lease's and the fetch's
  EXPECT_EQ(m.pinned_by[static_cast<size_t>(PinReason::kLease)], 2u);
  EXPECT_EQ(m.pinned_by[static_cast<size_t>(PinReason::kFetch)], 2u);
  EXPECT_EQ(m.pinned_by[static_cast<size_t>(PinReason::kMove)], 0u);
  EXPECT_GT(m.metadata_bytes, 0u);
  ASSERT_EQ(s.leases.size(), 1u);
  EXPECT_EQ(s.leases_total, 1u);
  EXPECT_EQ(s.leases[0].id, lease->lease_id);
  EXPECT_EQ(s.leases[0].blocks, 2u);
  EXPECT_EQ(s.taken - s.leases[0].created, absl::Seconds(2));
  EXPECT_FALSE(s.slab_classes.empty());
  EXPECT_EQ(s.stats.models.size(), 1u);
  EXPECT_EQ(Inspector().SnapshotMemory(0).leases.size(), 0u);
  EXPECT_EQ(Inspector().SnapshotMemory(0).leases_total, 1u);
}

}  // namespace
}  // namespace kvcache::cache_test
