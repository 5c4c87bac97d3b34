// Unit tests for importance-aware retention in the Cache: attention reports,
// compaction in quantize and prune modes, protected positions, fetch
// decoding, policy updates and calibration. Real SlabPool, ManualClock, fp32
// KV with Gaussian values so quantization error can be bounded exactly.
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstring>
#include <numeric>
#include <random>
#include <thread>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "kvcache/kernels/novelty.h"
#include "server/core/block_test_util.h"
#include "server/core/cache.h"
#include "server/core/compactor.h"
#include "server/core/fetch_block.h"
#include "server/core/importance_test_util.h"
#include "server/importance/block_codec.h"
#include "server/importance/scoring.h"

namespace kvcache {
namespace {

using enum ::absl::StatusCode;

using namespace importance_test;  // NOLINT: the shared test shapes

class ImportanceTest : public ::testing::Test {
 protected:
  void SetUp() override {
    options_.importance.default_policy.params.sink_tokens = 4;
    options_.importance.default_policy.params.recent_window = 16;
    options_.importance.cold_after = absl::Seconds(60);
    options_.importance.calibration_min_samples = 16;
    MakeCache();
  }
  void MakeCache(uint64_t slabs = 16) {
    cache_.reset();
    auto pool = SlabPool::Create(
        {.capacity_bytes = slabs * kSlab, .slab_bytes = kSlab, .min_class_bytes = 64});
    ASSERT_TRUE(pool.ok()) << pool.status();
    cache_ = std::make_unique<Cache>(options_, *std::move(pool), NewLruPolicy(), &clock_);
    ASSERT_TRUE(cache_->RegisterModel(kModel, TestLayout()).ok());
    tokens_.resize(kBlocks * kBt);
    std::iota(tokens_.begin(), tokens_.end(), 100);
    std::mt19937 rng(7);
    std::normal_distribution<float> normal(0.0f, 1.0f);
    kv_.resize(kBlocks * kBlockFloats);
    for (float& x : kv_) x = normal(rng);
  }
  void AppendAll(const AppendHints& hints = {}) {
    auto session = cache_->BeginAppend(kModel, tokens_, 0, hints, {});
    ASSERT_TRUE(session.ok()) << session.status();
    ASSERT_TRUE((*session)->Write(std::as_bytes(std::span<const float>(kv_))).ok());
    ASSERT_TRUE((*session)->Commit().ok());
  }
  void SetMode(CompressionMode mode) {
    ASSERT_TRUE(cache_->UpdatePolicy(kModel, {.mode = mode}).ok());
  }
  // The decoded fetch of the whole sequence (lossy blocks accepted), as
  // floats, and each block's encoding.
  std::vector<float> FetchFloats(std::vector<FetchBlock>* blocks = nullptr) {
    auto plan = cache_->PrepareFetch(kModel, {.tokens = tokens_, .accept_lossy = true});
    EXPECT_TRUE(plan.ok());
    std::vector<float> out;
    for (const PinnedBlock& stored : plan->blocks) {
      absl::StatusOr<FetchBlock> b = MaterializeForFetch(stored, false);
      EXPECT_TRUE(b.ok()) << b.status();
      EXPECT_EQ(b->bytes->checksum(), Checksum(b->bytes->data()));
      const size_t n = b->bytes->size() / sizeof(float);
      const size_t at = out.size();
      out.resize(at + n);
      std::memcpy(out.data() + at, b->bytes->data().data(), b->bytes->size());
      if (blocks != nullptr) blocks->push_back(*std::move(b));
    }
    return out;
  }
  ModelStats Stats() const { return cache_->GetStats().models.at(0); }

  CacheOptions options_;
  ManualClock clock_;
  std::unique_ptr<Cache> cache_;
  std::vector<Token> tokens_;
  std::vector<float> kv_;
};

TEST_F(ImportanceTest, OffModeNeverCompresses) {
  AppendAll();
  clock_.Advance(absl::Hours(1));
  EXPECT_EQ(Compactor(cache_.get()).Compact().compressed_blocks, 0u);
  EXPECT_EQ(FetchFloats(), kv_);
  EXPECT_EQ(Stats().compressed_blocks, 0u);
  EXPECT_EQ(Stats().full_tokens, kBlocks * kBt);
}

TEST_F(ImportanceTest, QuantizeKeepsProtectedTokensExactAndBoundsTheRest) {
  AppendHints hints;
  hints.protected_ranges = {{.begin = 20, .end = 24}};
  AppendAll(hints);
  const uint64_t raw_allocated = cache_->GetStats().host_pool.allocated_bytes;
  SetMode(CompressionMode::kQuantize);
  clock_.Advance(absl::Seconds(61));
  const CompactionResult r = Compactor(cache_.get()).Compact();
  // The last block is the recent window (16 tokens): nothing to compress there.
  EXPECT_EQ(r.compressed_blocks, kBlocks - 1);
  EXPECT_EQ(r.pruned_tokens, 0u);
  // Blocks 0-2 hold 48 tokens: 4 sinks and 4 pinned stay full.
  EXPECT_EQ(r.int8_tokens, 40u);

  std::vector<FetchBlock> blocks;
  const std::vector<float> got = FetchFloats(&blocks);
  ASSERT_EQ(got.size(), kv_.size());
  double err2 = 0, ref2 = 0;
  for (uint32_t b = 0; b < kBlocks; ++b) {
    EXPECT_EQ(blocks[b].encoding,
              b + 1 < kBlocks ? FetchEncoding::kDequantized : FetchEncoding::kRaw);
    EXPECT_TRUE(blocks[b].kept_tokens.empty());
    for (uint32_t layer = 0; layer < kLayers; ++layer) {
      for (uint32_t kv = 0; kv < 2; ++kv) {
        for (uint32_t h = 0; h < kHeads; ++h) {
          float max_abs = 0;
          for (uint32_t t = 0; t < kBt; ++t) {
            for (uint32_t d = 0; d < kDim; ++d) {
              max_abs = std::max(max_abs, std::abs(kv_[b * kBlockFloats + At(layer, kv, h, t, d)]));
            }
          }
          for (uint32_t t = 0; t < kBt; ++t) {
            const uint32_t g = b * kBt + t;
            const bool is_protected = g < 4 || g >= 48 || (g >= 20 && g < 24);
            for (uint32_t d = 0; d < kDim; ++d) {
              const size_t i = b * kBlockFloats + At(layer, kv, h, t, d);
              if (is_protected) {
                ASSERT_EQ(got[i], kv_[i]) << "protected token " << g << " changed";
              } else {
                // At most half a quantization step of the group, whose scale
                // is at most max_abs / 127.
                ASSERT_LE(std::abs(got[i] - kv_[i]), max_abs / 127 * 0.5001f) << "token " << g;
                err2 += double(got[i] - kv_[i]) * (got[i] - kv_[i]);
                ref2 += double(kv_[i]) * kv_[i];
              }
            }
          }
        }
      }
    }
  }
  EXPECT_LE(std::sqrt(err2 / ref2), 0.01) << "INT8 relative RMSE";

  const ModelStats s = Stats();
  EXPECT_EQ(s.policy.mode, CompressionMode::kQuantize);
  EXPECT_EQ(s.compressed_blocks, kBlocks - 1);
  EXPECT_EQ(s.int8_tokens, 40u);
  EXPECT_EQ(s.full_tokens, kBlocks * kBt - 40);
  EXPECT_EQ(s.bytes_saved, r.bytes_saved);
  // Savings are pool memory: what the raw copies took less what the compressed ones take.
  EXPECT_EQ(cache_->GetStats().host_pool.allocated_bytes, raw_allocated - s.bytes_saved);
  EXPECT_GT(s.bytes_saved, (kBlocks - 1) * TestLayout().BlockBytes() / 2);
  EXPECT_LT(s.bytes, kBlocks * TestLayout().BlockBytes() - s.bytes_saved / 2);
  EXPECT_EQ(cache_->GetStats().payload_bytes, s.bytes);
  EXPECT_EQ(cache_->GetStats().scores.total, (kBlocks - 1) * kBt);
}

TEST_F(ImportanceTest, CompressedFetchCarriesTheStoredFormat) {
  AppendAll();
  SetMode(CompressionMode::kQuantize);
  clock_.Advance(absl::Seconds(61));
  ASSERT_EQ(Compactor(cache_.get()).Compact().compressed_blocks, kBlocks - 1);
  auto plan = cache_->PrepareFetch(kModel, {.tokens = tokens_, .accept_lossy = true});
  ASSERT_TRUE(plan.ok());
  absl::StatusOr<FetchBlock> b = MaterializeForFetch(plan->blocks[1], true);
  ASSERT_TRUE(b.ok());
  EXPECT_EQ(b->encoding, FetchEncoding::kCompressed);
  EXPECT_EQ(b->bytes, plan->blocks[1]);  // sent as stored, no copy
  EXPECT_LT(b->bytes->size(), TestLayout().BlockBytes() / 2);
  absl::StatusOr<importance::CompressedBlockView> view =
      importance::ParseCompressedBlock(b->bytes->data());
  ASSERT_TRUE(view.ok()) << view.status();
  EXPECT_EQ(view->num_int8, kBt);
}

TEST_F(ImportanceTest, CorruptCompressedPayloadIsDataLossNotGarbage) {
  const std::vector<std::byte> garbage(256, std::byte{0x5a});
  BlockRef bad = SealedHeapBlock(
      garbage,
      {.checksum = Checksum(garbage), .raw_checksum = Checksum(garbage), .compressed = true});
  for (bool accept : {false, true}) {
    absl::StatusOr<FetchBlock> b = MaterializeForFetch(PinnedBlock(bad, PinReason::kFetch), accept);
    EXPECT_EQ(b.status().code(), kDataLoss) << accept;
  }
}

TEST_F(ImportanceTest, OnlyColdBlocksAreCompressed) {
  AppendAll();
  SetMode(CompressionMode::kQuantize);
  clock_.Advance(absl::Seconds(30));
  EXPECT_EQ(Compactor(cache_.get()).Compact().compressed_blocks, 0u);
  clock_.Advance(absl::Seconds(20));
  ASSERT_TRUE(cache_->Lookup(kModel, std::span(tokens_).first(2 * kBt)).ok());  // blocks 0-1
  clock_.Advance(absl::Seconds(20));  // block 2 idle 70 s, blocks 0-1 20 s
  EXPECT_EQ(Compactor(cache_.get()).Compact().compressed_blocks, 1u);
  clock_.Advance(absl::Seconds(60));
  EXPECT_EQ(Compactor(cache_.get()).Compact().compressed_blocks, 2u);
}

TEST_F(ImportanceTest, MemoryPressureCompressesWithoutWaiting) {
  options_.importance.pressure_watermark = 0.01;
  MakeCache();
  AppendAll();
  SetMode(CompressionMode::kQuantize);
  const CompactionResult r = Compactor(cache_.get()).Compact();
  EXPECT_TRUE(r.under_pressure);
  EXPECT_EQ(r.compressed_blocks, kBlocks - 1);
}

TEST_F(ImportanceTest, BlocksBeingFetchedAreLeftAlone) {
  AppendAll();
  SetMode(CompressionMode::kQuantize);
  clock_.Advance(absl::Seconds(61));
  {
    auto plan = cache_->PrepareFetch(kModel, {.tokens = tokens_});  // holds every block
    ASSERT_TRUE(plan.ok());
    clock_.Advance(absl::Seconds(61));
    EXPECT_EQ(Compactor(cache_.get()).Compact().compressed_blocks, 0u);
  }
  EXPECT_EQ(Compactor(cache_.get()).Compact().compressed_blocks, kBlocks - 1);
}

// Reports attention with two heavy hitters and checks what prune mode keeps
// against scores computed here from the same inputs.
TEST_F(ImportanceTest, PruneKeepsTheSmallestSetCoveringTheTargetMass) {
  AppendAll();
  constexpr double kTarget = 0.8;
  ASSERT_TRUE(
      cache_->UpdatePolicy(kModel, {.mode = CompressionMode::kPrune, .target_mass = kTarget}).ok());
  std::vector<float> attention(tokens_.size(), 0.01f);
  attention[10] = 1.0f;
  attention[30] = 0.5f;
  for (size_t t = 36; t < 40; ++t) attention[t] = 0.2f;
  auto report = cache_->ReportAttention(kModel, tokens_, 0, attention, 1);
  ASSERT_TRUE(report.ok()) << report.status();
  EXPECT_EQ(report->matched_tokens, tokens_.size());
  EXPECT_EQ(report->updated_tokens, tokens_.size());
  clock_.Advance(absl::Seconds(61));
  const CompactionResult r = Compactor(cache_.get()).Compact();
  ASSERT_EQ(r.compressed_blocks, kBlocks - 1);
  EXPECT_GT(r.pruned_tokens, 0u);

  const ImportancePolicy policy = *cache_->GetPolicy(kModel);
  const double fade = std::exp2(-61.0 / options_.importance.activity_half_life_seconds);
  auto plan = cache_->PrepareFetch(kModel, {.tokens = tokens_, .accept_lossy = true});
  ASSERT_TRUE(plan.ok());
  for (uint32_t b = 0; b + 1 < kBlocks; ++b) {
    // This block's inputs, as the cache saw them.
    std::vector<float> activity(kBt), novelty(kBt, 0.0f), one(kBt), scores(kBt);
    for (uint32_t t = 0; t < kBt; ++t) {
      activity[t] =
          static_cast<float>(options_.importance.activity_weight * attention[b * kBt + t] * fade);
    }
    for (uint32_t layer = 0; layer < kLayers; ++layer) {
      ASSERT_EQ(kernels::KeyNoveltyCpu(&kv_[b * kBlockFloats + At(layer, 0, 0, 0, 0)],
                                       kernels::DType::kFloat32, kHeads, kBt, kDim, one.data()),
                kernels::KernelStatus::kOk);
      for (uint32_t t = 0; t < kBt; ++t) novelty[t] += one[t] / kLayers;
    }
    importance::ScoreTokens(policy.params, b * kBt, kBlocks * kBt, activity, novelty, scores);
    auto sent = MaterializeForFetch(plan->blocks[b], true);
    ASSERT_TRUE(sent.ok());
    auto view = importance::ParseCompressedBlock(sent->bytes->data());
    ASSERT_TRUE(view.ok());
    double total = 0, kept = 0;
    float smallest_kept = INFINITY;
    for (uint32_t t = 0; t < kBt; ++t) {
      const uint32_t g = b * kBt + t;
      const bool is_protected = g < 4;
      total += scores[t];
      if (view->precision[t] == importance::TokenPrecision::kPruned) {
        EXPECT_FALSE(is_protected) << "sink " << g << " pruned";
        EXPECT_EQ(std::find(sent->kept_tokens.begin(), sent->kept_tokens.end(), t),
                  sent->kept_tokens.end());
        continue;
      }
      kept += scores[t];
      if (!is_protected) smallest_kept = std::min(smallest_kept, scores[t]);
      EXPECT_EQ(view->precision[t], is_protected ? importance::TokenPrecision::kFull
                                                 : importance::TokenPrecision::kInt8);
    }
    EXPECT_GE(kept, kTarget * total * (1 - 1e-6)) << "block " << b;
    if (std::isfinite(smallest_kept)) {
      EXPECT_LT(kept - smallest_kept, kTarget * total) << "block " << b << " keeps too much";
    }
  }
  // The heavy hitters survive with every byte within quantization error.
  const std::vector<float> got = FetchFloats();
  for (uint32_t g : {10u, 30u}) {
    const uint32_t b = g / kBt;
    const size_t i = b * kBlockFloats + At(1, 1, 1, g % kBt, 3);
    EXPECT_NEAR(got[i], kv_[i], 0.05) << "heavy hitter " << g;
  }
  EXPECT_EQ(Stats().pruned_tokens, r.pruned_tokens);
}

// With novelty weighted heavily, a run of tokens whose keys repeat their
// predecessor's (novelty 0) is what prune mode drops; novelty is computed at
// append because the model already compresses.
TEST_F(ImportanceTest, PruneDropsRedundantRunsFirst) {
  ASSERT_TRUE(cache_
                  ->UpdatePolicy(kModel, {.mode = CompressionMode::kPrune,
                                          .weights = importance::Weights{0, 0.05f, 0.95f},
                                          .target_mass = 0.9})
                  .ok());
  for (uint32_t b = 0; b < kBlocks; ++b) {
    for (uint32_t layer = 0; layer < kLayers; ++layer) {
      for (uint32_t h = 0; h < kHeads; ++h) {
        for (uint32_t t = 8; t < kBt; ++t) {  // keys of tokens 8..15 repeat token 7's
          std::memcpy(&kv_[b * kBlockFloats + At(layer, 0, h, t, 0)],
                      &kv_[b * kBlockFloats + At(layer, 0, h, 7, 0)], kDim * sizeof(float));
        }
      }
    }
  }
  AppendAll();
  clock_.Advance(absl::Seconds(61));
  ASSERT_EQ(Compactor(cache_.get()).Compact().compressed_blocks, kBlocks - 1);
  auto plan = cache_->PrepareFetch(kModel, {.tokens = tokens_, .accept_lossy = true});
  ASSERT_TRUE(plan.ok());
  for (uint32_t b = 1; b + 1 < kBlocks; ++b) {  // block 0 holds the sinks
    auto sent = MaterializeForFetch(plan->blocks[b], false);
    ASSERT_TRUE(sent.ok());
    std::vector<uint32_t> expected_kept(8);
    std::iota(expected_kept.begin(), expected_kept.end(), 0);  // the novel tokens 0..7
    EXPECT_EQ(sent->kept_tokens, expected_kept) << "block " << b;
  }
}

TEST_F(ImportanceTest, SwitchingOffRemovesCompressedBlocks) {
  AppendAll();
  SetMode(CompressionMode::kQuantize);
  clock_.Advance(absl::Seconds(61));
  ASSERT_EQ(Compactor(cache_.get()).Compact().compressed_blocks, kBlocks - 1);
  absl::StatusOr<PolicyChange> change =
      cache_->UpdatePolicy(kModel, {.mode = CompressionMode::kOff});
  ASSERT_TRUE(change.ok());
  EXPECT_EQ(change->previous_mode, CompressionMode::kQuantize);
  EXPECT_EQ(change->dropped_blocks, kBlocks);  // the raw last block hung below them
  const ModelStats s = Stats();
  EXPECT_EQ(s.blocks, 0u);
  EXPECT_EQ(s.compressed_blocks, 0u);
  EXPECT_EQ(s.int8_tokens, 0u);
  EXPECT_EQ(s.bytes_saved, 0u);
  EXPECT_EQ(s.bytes, 0u);
  EXPECT_EQ(cache_->GetStats().payload_bytes, 0u);
  // Appending again serves lossless KV.
  AppendAll();
  clock_.Advance(absl::Hours(1));
  EXPECT_EQ(Compactor(cache_.get()).Compact().compressed_blocks, 0u);
  EXPECT_EQ(FetchFloats(), kv_);
}

TEST_F(ImportanceTest, EvictingCompressedBlocksResetsTheirStats) {
  AppendAll();
  SetMode(CompressionMode::kPrune);
  clock_.Advance(absl::Seconds(61));
  ASSERT_GT(Compactor(cache_.get()).Compact().compressed_blocks, 0u);
  ASSERT_TRUE(cache_->EvictModel(kModel).ok());
  const ModelStats s = Stats();
  EXPECT_EQ(s.compressed_blocks, 0u);
  EXPECT_EQ(s.int8_tokens + s.pruned_tokens + s.full_tokens + s.bytes_saved + s.bytes, 0u);
}

TEST_F(ImportanceTest, BadReportsAreRejectedAndChangeNothing) {
  AppendAll();
  std::vector<float> ok(tokens_.size(), 0.1f);
  std::vector<float> short_report(tokens_.size() - 1, 0.1f);
  std::vector<float> nan = ok;
  nan[5] = NAN;
  std::vector<float> negative = ok;
  negative[7] = -1;
  EXPECT_EQ(cache_->ReportAttention(kModel, tokens_, 0, short_report, 1).status().code(),
            kInvalidArgument);
  EXPECT_EQ(cache_->ReportAttention(kModel, tokens_, 0, ok, 2).status().code(), kInvalidArgument);
  EXPECT_EQ(cache_->ReportAttention(kModel, tokens_, 0, nan, 1).status().code(), kInvalidArgument);
  EXPECT_EQ(cache_->ReportAttention(kModel, tokens_, 0, negative, 1).status().code(),
            kInvalidArgument);
  EXPECT_EQ(cache_->ReportAttention(kModel, {}, 0, {}, 1).status().code(), kInvalidArgument);
  EXPECT_EQ(cache_->ReportAttention({"default", "nope"}, tokens_, 0, ok, 1).status().code(),
            kNotFound);
  EXPECT_EQ(cache_->ReportAttention(kModel, {}, 12345, ok, 1).status().code(), kNotFound);
  EXPECT_EQ(Stats().attention_reports, 0u);
  // Two rows (layers) of the right length are averaged.
  std::vector<float> two_rows(2 * tokens_.size(), 0.1f);
  EXPECT_TRUE(cache_->ReportAttention(kModel, tokens_, 0, two_rows, 2).ok());
  EXPECT_EQ(Stats().attention_reports, 1u);
}

TEST_F(ImportanceTest, ReportsByLeaseCoverTheLeasedPrefix) {
  AppendAll();
  auto lease = cache_->Lookup(kModel, std::span(tokens_).first(2 * kBt), {.acquire = true});
  ASSERT_TRUE(lease.ok());
  ASSERT_NE(lease->lease_id, 0u);
  std::vector<float> attention(2 * kBt, 0.3f);
  auto r = cache_->ReportAttention(kModel, {}, lease->lease_id, attention, 1);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->matched_tokens, 2 * kBt);
  EXPECT_EQ(r->updated_tokens, 2 * kBt);
  std::vector<float> too_long(tokens_.size(), 0.3f);
  EXPECT_EQ(cache_->ReportAttention(kModel, {}, lease->lease_id, too_long, 1).status().code(),
            kInvalidArgument);
}

TEST_F(ImportanceTest, InvalidPolicyUpdatesChangeNothing) {
  const ImportancePolicy before = *cache_->GetPolicy(kModel);
  EXPECT_EQ(cache_->UpdatePolicy(kModel, {.target_mass = 1.5}).status().code(), kInvalidArgument);
  EXPECT_EQ(cache_->UpdatePolicy(kModel, {.target_mass = 0}).status().code(), kInvalidArgument);
  EXPECT_EQ(cache_->UpdatePolicy(kModel, {.weights = importance::Weights{0, 0, 0}}).status().code(),
            kInvalidArgument);
  EXPECT_EQ(cache_
                ->UpdatePolicy(kModel, {.mode = CompressionMode::kPrune,
                                        .weights = importance::Weights{-1, 0.5, 0.5}})
                .status()
                .code(),
            kInvalidArgument);
  EXPECT_EQ(cache_->UpdatePolicy({"default", "nope"}, {}).status().code(), kNotFound);
  const ImportancePolicy after = *cache_->GetPolicy(kModel);
  EXPECT_EQ(after.mode, before.mode);
  EXPECT_EQ(after.params.alpha, before.params.alpha);
  EXPECT_EQ(after.target_mass, before.target_mass);
}

// Workers report attention that follows the position factor exactly; the
// calibrated weights must move toward beta, by at most the step bound.
TEST_F(ImportanceTest, CalibrationMovesWeightsTowardPlantedTruth) {
  SetMode(CompressionMode::kQuantize);  // so novelty is computed at append
  AppendAll();
  const ImportancePolicy policy = *cache_->GetPolicy(kModel);
  std::vector<float> attention(tokens_.size());
  for (size_t t = 0; t < attention.size(); ++t) {
    attention[t] = kernels::PositionFactor(static_cast<int64_t>(t),
                                           static_cast<int64_t>(attention.size()), policy.params);
  }
  ASSERT_TRUE(cache_->ReportAttention(kModel, tokens_, 0, attention, 1).ok());
  const std::vector<CalibrationOutcome> outcomes = Compactor(cache_.get()).Calibrate();
  ASSERT_EQ(outcomes.size(), 1u);
  const CalibrationOutcome& c = outcomes[0];
  ASSERT_TRUE(c.applied);
  EXPECT_EQ(c.samples, tokens_.size() - 4 - 16);  // sinks and the recent window not sampled
  EXPECT_GT(c.fitted.beta, 0.9f);
  EXPECT_GT(c.after.beta, c.before.beta);
  EXPECT_LT(c.after.alpha, c.before.alpha);
  const float step = options_.importance.calibration_max_step;
  EXPECT_LE(std::abs(c.after.alpha - c.before.alpha), 2 * step);
  EXPECT_NEAR(c.after.alpha + c.after.beta + c.after.gamma, 1.0f, 1e-5);
  EXPECT_GT(c.correlation_after, c.correlation_before);
  const ImportancePolicy now = *cache_->GetPolicy(kModel);
  EXPECT_EQ(now.params.beta, c.after.beta);
  EXPECT_EQ(Stats().calibrations, 1u);
  // Nothing new reported: nothing to refit.
  EXPECT_TRUE(Compactor(cache_.get()).Calibrate().empty());
}

// Workers append, fetch, report and evict while compaction runs and the
// mode flips: every fetched element must be the appended one, or within the
// INT8 bound of it, or zero at a position the fetch says was pruned.
TEST_F(ImportanceTest, ConcurrentCompactionNeverServesWrongKv) {
  options_.importance.pressure_watermark = 1e-6;  // compress whatever is idle
  MakeCache(64);
  SetMode(CompressionMode::kPrune);
  constexpr int kSequences = 6;
  auto sequence = [](int s) {
    std::vector<Token> t(kBlocks * kBt);
    for (uint32_t i = 0; i < t.size(); ++i) t[i] = i < kBt ? i : 1000 * (s + 1) + i;
    return t;
  };
  // Block b of sequence s: Gaussian floats seeded by the block's prefix.
  auto block_data = [](int s, uint32_t b) {
    std::mt19937 rng(b == 0 ? 1 : 100 * (s + 1) + b);
    std::normal_distribution<float> normal(0.0f, 1.0f);
    std::vector<float> out(kBlockFloats);
    for (float& x : out) x = normal(rng);
    return out;
  };
  std::atomic<bool> stop{false};
  std::atomic<uint64_t> checked{0}, failures{0}, decoded{0}, compressed{0};
  auto worker = [&](int id) {
    std::mt19937 rng(id);
    // At least 150 rounds, and on until fetches have seen compressed blocks.
    for (int iter = 0; iter < 150 || (decoded.load() < 50 && iter < 20000); ++iter) {
      const int s = static_cast<int>(rng() % kSequences);
      const std::vector<Token> tokens = sequence(s);
      std::vector<float> kv;
      for (uint32_t b = 0; b < kBlocks; ++b) {
        std::vector<float> d = block_data(s, b);
        kv.insert(kv.end(), d.begin(), d.end());
      }
      if (auto session = cache_->BeginAppend(kModel, tokens, 0, {}, {}); session.ok()) {
        if ((*session)->Write(std::as_bytes(std::span<const float>(kv))).ok()) {
          (void)(*session)->Commit();
        }
      }
      std::vector<float> attention(tokens.size());
      for (float& a : attention) a = static_cast<float>(rng() % 100) / 100;
      (void)cache_->ReportAttention(kModel, tokens, 0, attention, 1);
      auto plan = cache_->PrepareFetch(kModel, {.tokens = tokens, .accept_lossy = true});
      if (!plan.ok()) {
        ++failures;
        continue;
      }
      for (uint32_t b = 0; b < plan->blocks.size(); ++b) {
        absl::StatusOr<FetchBlock> sent = MaterializeForFetch(plan->blocks[b], false);
        if (!sent.ok() || sent->bytes->checksum() != Checksum(sent->bytes->data())) {
          ++failures;
          continue;
        }
        const std::vector<float> want = block_data(s, b);
        std::vector<float> got(kBlockFloats);
        std::memcpy(got.data(), sent->bytes->data().data(), sent->bytes->size());
        float max_abs = 0;
        for (float x : want) max_abs = std::max(max_abs, std::abs(x));
        std::vector<bool> kept(kBt, sent->kept_tokens.empty());
        for (uint32_t t : sent->kept_tokens) kept[t] = true;
        for (size_t i = 0; i < kBlockFloats; ++i) {
          const uint32_t t = static_cast<uint32_t>((i / kDim) % kBt);
          const bool ok = !kept[t] ? got[i] == 0.0f
                          : sent->encoding == FetchEncoding::kRaw
                              ? got[i] == want[i]
                              : std::abs(got[i] - want[i]) <= max_abs / 127 * 0.5001f;
          if (!ok) ++failures;
        }
        ++checked;
        decoded += sent->encoding == FetchEncoding::kDequantized;
      }
      if (rng() % 10 == 0) {
        (void)cache_->EvictPrefix(kModel, std::span(tokens).first(2 * kBt));
      }
    }
  };
  std::thread compactor([&] {
    // Flips the mode every 30 ms: prune, quantize, off (which drops compressed blocks).
    const CompressionMode modes[] = {CompressionMode::kPrune, CompressionMode::kQuantize,
                                     CompressionMode::kOff};
    const auto start = std::chrono::steady_clock::now();
    int applied = 0;
    for (int round = 0; !stop.load(); ++round) {
      compressed += Compactor(cache_.get()).Compact().compressed_blocks;
      const int phase = static_cast<int>((std::chrono::steady_clock::now() - start) /
                                         std::chrono::milliseconds(30));
      if (phase != applied) {
        applied = phase;
        (void)cache_->UpdatePolicy(kModel, {.mode = modes[phase % 3]});
      }
      if (round % 20 == 0) (void)Compactor(cache_.get()).Calibrate();
      std::this_thread::yield();
    }
  });
  std::vector<std::thread> workers;
  for (int i = 0; i < 4; ++i) workers.emplace_back(worker, i);
  for (std::thread& t : workers) t.join();
  stop = true;
  compactor.join();
  EXPECT_EQ(failures.load(), 0u);
  EXPECT_GT(checked.load(), 500u);
  EXPECT_GT(compressed.load(), 0u);
  EXPECT_GE(decoded.load(), 50u) << "fetches rarely saw a compressed block";
  // The books balance: what the models hold is what the pool's payloads hold.
  const CacheStats stats = cache_->GetStats();
  const ModelStats& m = stats.models.at(0);
  EXPECT_EQ(stats.payload_bytes, m.bytes);
  EXPECT_LE(m.bytes, m.blocks * TestLayout().BlockBytes());
  EXPECT_EQ(m.full_tokens + m.int8_tokens + m.pruned_tokens, m.tokens);
  ASSERT_TRUE(cache_->EvictModel(kModel).ok());
  EXPECT_EQ(cache_->GetStats().host_pool.allocated_bytes, 0u);
}

}  // namespace
}  // namespace kvcache
