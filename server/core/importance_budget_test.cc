// Unit tests for budget mode (importance_policy.h): compaction to the
// compressed format version 2 within target_bytes, per-(layer, KV head)
// attention reports, and bad input. Real SlabPool, ManualClock, fp32 KV.
#include <cmath>
#include <cstring>
#include <numeric>
#include <random>
#include <vector>

#include "gtest/gtest.h"
#include "server/core/cache.h"
#include "server/core/compactor.h"
#include "server/core/fetch_block.h"
#include "server/core/importance_test_util.h"
#include "server/importance/block_codec.h"

namespace kvcache {
namespace {

using enum ::absl::StatusCode;
using namespace importance_test;  // NOLINT: the shared test shapes

class BudgetModeTest : public ::testing::Test {
 protected:
  void SetUp() override {
    options_.importance.default_policy.params.sink_tokens = 4;
    options_.importance.default_policy.params.recent_window = 16;
    options_.importance.cold_after = absl::Seconds(60);
    auto pool = SlabPool::Create(
        {.capacity_bytes = 16 * kSlab, .slab_bytes = kSlab, .min_class_bytes = 64});
    ASSERT_TRUE(pool.ok()) << pool.status();
    cache_ = std::make_unique<Cache>(options_, *std::move(pool), NewLruPolicy(), &clock_);
    ASSERT_TRUE(cache_->RegisterModel(kModel, TestLayout()).ok());
    tokens_.resize(kBlocks * kBt);
    std::iota(tokens_.begin(), tokens_.end(), 100);
    std::mt19937 rng(7);
    std::normal_distribution<float> normal(0.0f, 1.0f);
    kv_.resize(kBlocks * kBlockFloats);
    for (float& x : kv_) x = normal(rng);
    auto session = cache_->BeginAppend(kModel, tokens_, 0, {}, {});
    ASSERT_TRUE(session.ok()) << session.status();
    ASSERT_TRUE((*session)->Write(std::as_bytes(std::span<const float>(kv_))).ok());
    ASSERT_TRUE((*session)->Commit().ok());
  }
  ModelStats Stats() const { return cache_->GetStats().models.at(0); }
  std::vector<PinnedBlock> Stored() {
    auto plan = cache_->PrepareFetch(kModel, {.tokens = tokens_, .accept_lossy = true});
    EXPECT_TRUE(plan.ok());
    return plan.ok() ? plan->blocks : std::vector<PinnedBlock>{};
  }

  CacheOptions options_;
  ManualClock clock_;
  std::unique_ptr<Cache> cache_;
  std::vector<Token> tokens_;
  std::vector<float> kv_;
};

TEST_F(BudgetModeTest, CompactsWithinTargetBytesKeepingSinksExact) {
  ASSERT_TRUE(
      cache_->UpdatePolicy(kModel, {.mode = CompressionMode::kBudget, .target_bytes = 0.3}).ok());
  clock_.Advance(absl::Seconds(61));
  const CompactionResult r = Compactor(cache_.get()).Compact();
  EXPECT_EQ(r.compressed_blocks, kBlocks);  // the recent window is not protected in budget mode
  EXPECT_EQ(r.budget_overruns, 0u);
  const ModelStats s = Stats();
  EXPECT_GT(s.int8_entries + s.int4_entries, 0u);
  EXPECT_EQ(s.int8_entries, r.int8_entries);
  EXPECT_EQ(s.int4_entries, r.int4_entries);
  const uint64_t raw = TestLayout().BlockBytes();
  const std::vector<PinnedBlock> stored = Stored();
  ASSERT_EQ(stored.size(), kBlocks);
  for (size_t b = 0; b < stored.size(); ++b) {
    auto view = importance::ParseCompressedBlock(stored[b]->data());
    ASSERT_TRUE(view.ok()) << view.status();
    EXPECT_EQ(view->version, importance::kCompressedVersion2);
    EXPECT_LE(static_cast<double>(stored[b]->size()), 0.3 * static_cast<double>(raw));
    absl::StatusOr<FetchBlock> f = MaterializeForFetch(stored[b], false);
    ASSERT_TRUE(f.ok()) << f.status();
    const float* got = reinterpret_cast<const float*>(f->bytes->data().data());
    const float* want = kv_.data() + b * kBlockFloats;
    for (uint32_t l = 0; l < kLayers; ++l) {
      for (uint32_t h = 0; h < kHeads; ++h) {
        for (uint32_t t = 0; t < kBt; ++t) {
          const importance::TokenPrecision p = view->EntryPrecision(l, h, t);
          if (b == 0 && t < 4) {
            EXPECT_EQ(p, importance::TokenPrecision::kFull) << "sink " << t;
          }
          for (uint32_t kv = 0; kv < 2; ++kv) {
            for (uint32_t d = 0; d < kDim; ++d) {
              const size_t i = At(l, kv, h, t, d);
              if (p == importance::TokenPrecision::kFull) {
                ASSERT_EQ(got[i], want[i]);
              } else if (p == importance::TokenPrecision::kPruned) {
                ASSERT_EQ(got[i], 0.0f);
              } else {
                ASSERT_LT(std::fabs(got[i] - want[i]), 1.5f);  // Gaussian values, 4-bit at worst
              }
            }
          }
        }
      }
    }
  }
  // The recent window (the last 16 tokens: block 3) ranks first: none of its
  // entries is at a lower precision than any entry of block 1 (same budget).
  auto lowest = [&](size_t b) {
    auto view = importance::ParseCompressedBlock(stored[b]->data());
    int best = 3;
    for (uint32_t l = 0; l < kLayers; ++l) {
      for (uint32_t h = 0; h < kHeads; ++h) {
        for (uint32_t t = 0; t < kBt; ++t) {
          const auto p = view->EntryPrecision(l, h, t);
          const int rank = p == importance::TokenPrecision::kPruned ? 0
                           : p == importance::TokenPrecision::kInt4 ? 1
                           : p == importance::TokenPrecision::kInt8 ? 2
                                                                    : 3;
          best = std::min(best, rank);
        }
      }
    }
    return best;
  };
  EXPECT_GE(lowest(3), lowest(1));
  // Switching off drops the lossy blocks and their counts.
  ASSERT_TRUE(cache_->UpdatePolicy(kModel, {.mode = CompressionMode::kOff}).ok());
  EXPECT_EQ(Stats().int8_entries + Stats().int4_entries + Stats().pruned_entries, 0u);
}

TEST_F(BudgetModeTest, AGenerousBudgetPromotesToFull) {
  ASSERT_TRUE(
      cache_->UpdatePolicy(kModel, {.mode = CompressionMode::kBudget, .target_bytes = 0.6}).ok());
  clock_.Advance(absl::Seconds(61));
  const CompactionResult r = Compactor(cache_.get()).Compact();
  EXPECT_EQ(r.int4_entries + r.pruned_entries, 0u);
  // Each block is compressed within the budget, or left raw where the copy
  // would not take a smaller piece of the pool.
  EXPECT_EQ(r.compressed_blocks + r.no_saving_blocks, kBlocks);
  for (const PinnedBlock& b : Stored()) {
    if (!b->compressed()) continue;
    EXPECT_LE(static_cast<double>(b->size()), 0.6 * static_cast<double>(TestLayout().BlockBytes()));
    auto view = importance::ParseCompressedBlock(b->data());
    ASSERT_TRUE(view.ok());
    EXPECT_GT(view->num_full, 0u);  // promoted entries
  }
}

TEST_F(BudgetModeTest, PerHeadReportsAreAcceptedAndBadInputChangesNothing) {
  ASSERT_TRUE(cache_->UpdatePolicy(kModel, {.mode = CompressionMode::kBudget}).ok());
  const size_t n = tokens_.size();
  std::vector<float> per_head(size_t{kLayers} * kHeads * n, 0.01f);
  // Head 1 of layer 0 attends token 30 strongly.
  per_head[(0 * kHeads + 1) * n + 30] = 5.0f;
  auto ok = cache_->ReportAttention(kModel, tokens_, 0, per_head, kLayers);
  ASSERT_TRUE(ok.ok()) << ok.status();
  EXPECT_EQ(ok->updated_tokens, n);
  // Per layer still works.
  std::vector<float> per_layer(size_t{kLayers} * n, 0.01f);
  EXPECT_TRUE(cache_->ReportAttention(kModel, tokens_, 0, per_layer, kLayers).ok());
  const uint64_t reports = Stats().attention_reports;
  // Wrong row counts.
  std::vector<float> wrong(size_t{kLayers} * kHeads * n + 1, 0.01f);
  EXPECT_EQ(cache_->ReportAttention(kModel, tokens_, 0, wrong, kLayers).status().code(),
            kInvalidArgument);
  std::vector<float> three_rows(3 * n, 0.01f);
  EXPECT_EQ(cache_->ReportAttention(kModel, tokens_, 0, three_rows, kLayers).status().code(),
            kInvalidArgument);
  EXPECT_EQ(Stats().attention_reports, reports);
  // target_bytes outside (0, 1].
  const ImportancePolicy before = *cache_->GetPolicy(kModel);
  for (double bad : {0.0 - 0.1, 1.5, std::nan("")}) {
    EXPECT_EQ(cache_->UpdatePolicy(kModel, {.target_bytes = bad}).status().code(), kInvalidArgument)
        << bad;
  }
  EXPECT_EQ(cache_->GetPolicy(kModel)->target_bytes, before.target_bytes);
  EXPECT_EQ(cache_->GetPolicy(kModel)->mode, CompressionMode::kBudget);
  // Compaction with per-head activity still meets the budget.
  clock_.Advance(absl::Seconds(61));
  const CompactionResult r = Compactor(cache_.get()).Compact();
  EXPECT_EQ(r.compressed_blocks, kBlocks);
  for (const PinnedBlock& b : Stored()) {
    EXPECT_LE(static_cast<double>(b->size()),
              before.target_bytes * static_cast<double>(TestLayout().BlockBytes()));
  }
}

TEST(BudgetPolicyTest, ModeNameAndValidation) {
  EXPECT_EQ(CompressionModeName(CompressionMode::kBudget), "budget");
  EXPECT_EQ(ParseCompressionMode("budget"), CompressionMode::kBudget);
  ImportancePolicy p;
  EXPECT_EQ(p.target_bytes, 0.37);
  EXPECT_TRUE(p.Validate().ok());
  p.target_bytes = 0;
  EXPECT_EQ(p.Validate().code(), kInvalidArgument);
  p.target_bytes = 1;
  EXPECT_TRUE(p.Validate().ok());
}

}  // namespace
}  // namespace kvcache
