// Unit tests for the cache's integrity and resource rules: lossy KV only to
// readers that accept it, checksums kept through compaction, conflicting and
// racing appends, protected ranges, rejected appends that evict nothing, and
// the lease and metadata budgets. Real SlabPool, ManualClock, fp32 KV.
#include <cmath>
#include <cstring>
#include <limits>
#include <numeric>
#include <random>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server/common/status_macros.h"
#include "server/core/block_test_util.h"
#include "server/core/cache.h"
#include "server/core/cache_access.h"
#include "server/core/compactor.h"
#include "server/core/fetch_block.h"
#include "server/core/importance_test_util.h"
#include "server/importance/block_codec.h"

namespace kvcache {
namespace {

using enum ::absl::StatusCode;
using ::testing::HasSubstr;

using namespace importance_test;  // NOLINT: the shared test shapes

// Gaussian floats for `blocks` blocks, seeded.
std::vector<float> Gaussian(uint32_t blocks, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> kv(blocks * kBlockFloats);
  for (float& x : kv) x = normal(rng);
  return kv;
}

std::span<const std::byte> Bytes(const std::vector<float>& kv) {
  return std::as_bytes(std::span<const float>(kv));
}

class IntegrityTest : public ::testing::Test {
 protected:
  void SetUp() override {
    options_.importance.default_policy.params.sink_tokens = 4;
    options_.importance.default_policy.params.recent_window = 16;
    options_.importance.cold_after = absl::Seconds(60);
    MakeCache();
  }
  void MakeCache(uint64_t slabs = 16) {
    cache_.reset();
    auto pool = SlabPool::Create(
        {.capacity_bytes = slabs * kSlab, .slab_bytes = kSlab, .min_class_bytes = 64});
    ASSERT_TRUE(pool.ok()) << pool.status();
    cache_ = std::make_unique<Cache>(options_, *std::move(pool), NewLruPolicy(), &clock_);
    ASSERT_TRUE(cache_->RegisterModel(kModel, TestLayout()).ok());
    tokens_ = Tokens(0);
    kv_ = Gaussian(kBlocks, 7);
  }
  static std::vector<Token> Tokens(uint32_t sequence, uint32_t blocks = kBlocks) {
    std::vector<Token> t(blocks * kBt);
    std::iota(t.begin(), t.end(), 100 + 10000 * sequence);
    return t;
  }
  absl::StatusOr<AppendResult> Append(const std::vector<Token>& tokens,
                                      const std::vector<float>& kv, uint64_t start_token = 0,
                                      const AppendHints& hints = {},
                                      std::vector<uint64_t> checksums = {}) {
    auto session = cache_->BeginAppend(kModel, tokens, start_token, hints, std::move(checksums));
    if (!session.ok()) return session.status();
    const size_t skip = start_token / kBt * kBlockFloats;
    std::vector<float> part(kv.begin() + skip, kv.end());
    KVCACHE_RETURN_IF_ERROR((*session)->Write(Bytes(part)));
    return (*session)->Commit();
  }
  void AppendAll() { ASSERT_TRUE(Append(tokens_, kv_).ok()); }
  // Quantizes every cold block of the test sequence (all but the recent window).
  void CompressAll() {
    ASSERT_TRUE(cache_->UpdatePolicy(kModel, {.mode = CompressionMode::kQuantize}).ok());
    clock_.Advance(absl::Seconds(61));
    ASSERT_EQ(Compactor(cache_.get()).Compact().compressed_blocks, kBlocks - 1);
  }
  // Every block of `plan` is exactly the appended bytes.
  bool Exact(const FetchPlan& plan, const std::vector<float>& kv) {
    for (size_t b = 0; b < plan.blocks.size(); ++b) {
      const PinnedBlock& p = plan.blocks[b];
      if (p->compressed()) return false;
      if (std::memcmp(p->data().data(), kv.data() + b * kBlockFloats, p->size()) != 0) return false;
      if (p->checksum() != Checksum(p->data())) return false;
    }
    return true;
  }
  ModelStats Stats() const { return cache_->GetStats().models.at(0); }

  CacheOptions options_;
  ManualClock clock_;
  std::unique_ptr<Cache> cache_;
  std::vector<Token> tokens_;
  std::vector<float> kv_;
};

// ---- Lossy KV only with opt-in (issue items 1, 2, 20) ----------------------------

TEST_F(IntegrityTest, LossyBlocksReachOnlyReadersThatAcceptThem) {
  AppendAll();
  CompressAll();
  // By default the prefix ends before the first lossy block, and says why.
  auto lookup = cache_->Lookup(kModel, tokens_);
  ASSERT_TRUE(lookup.ok());
  EXPECT_EQ(lookup->matched_tokens, 0u);
  EXPECT_EQ(lookup->withheld_tokens, kBlocks * kBt);
  auto plan = cache_->PrepareFetch(kModel, {.tokens = tokens_});
  ASSERT_TRUE(plan.ok());
  EXPECT_TRUE(plan->blocks.empty());
  EXPECT_EQ(plan->withheld_tokens, kBlocks * kBt);
  // A lease taken without opting in covers nothing lossy either.
  auto leased = cache_->Lookup(kModel, tokens_, {.acquire = true});
  ASSERT_TRUE(leased.ok());
  EXPECT_EQ(leased->lease_id, 0u);

  // Opting in: every block, and descriptors say what a fetch sends.
  auto lossy = cache_->Lookup(kModel, tokens_, {}, /*accept_lossy=*/true);
  ASSERT_TRUE(lossy.ok());
  EXPECT_EQ(lossy->matched_tokens, kBlocks * kBt);
  EXPECT_EQ(lossy->withheld_tokens, 0u);
  auto all = cache_->PrepareFetch(kModel, {.tokens = tokens_, .accept_lossy = true});
  ASSERT_TRUE(all.ok());
  ASSERT_EQ(all->blocks.size(), kBlocks);
  for (uint32_t b = 0; b < kBlocks; ++b) {
    const BlockInfo& d = lossy->blocks[b];
    absl::StatusOr<FetchBlock> decoded = MaterializeForFetch(all->blocks[b], false);
    ASSERT_TRUE(decoded.ok()) << decoded.status();
    EXPECT_EQ(d.lossy, b + 1 < kBlocks);
    EXPECT_EQ(d.bytes, TestLayout().BlockBytes());
    EXPECT_EQ(d.checksum, decoded->bytes->checksum()) << "descriptor of block " << b;
    EXPECT_EQ(d.stored_bytes, all->blocks[b]->size());
    EXPECT_EQ(d.stored_checksum, all->blocks[b]->checksum());
  }
}

TEST_F(IntegrityTest, SwitchingOffDuringACompactionPassCompressesNothing) {
  // The pass has encoded its blocks when the operator switches the model off.
  options_.on_compaction_encoded = [this] {
    ASSERT_TRUE(cache_->UpdatePolicy(kModel, {.mode = CompressionMode::kOff}).ok());
  };
  MakeCache();
  AppendAll();
  ASSERT_TRUE(cache_->UpdatePolicy(kModel, {.mode = CompressionMode::kQuantize}).ok());
  clock_.Advance(absl::Seconds(61));
  const CompactionResult r = Compactor(cache_.get()).Compact();
  EXPECT_EQ(r.compressed_blocks, 0u);
  EXPECT_EQ(Stats().compressed_blocks, 0u);
  EXPECT_EQ(Stats().policy.mode, CompressionMode::kOff);
  auto plan = cache_->PrepareFetch(kModel, {.tokens = tokens_, .accept_lossy = true});
  ASSERT_TRUE(plan.ok());
  EXPECT_EQ(plan->blocks.size(), kBlocks);
  EXPECT_TRUE(Exact(*plan, kv_));
}

TEST_F(IntegrityTest, SwitchingOffRevokesLossyBlocksOfFetchesAndLeases) {
  AppendAll();
  CompressAll();
  auto plan = cache_->PrepareFetch(kModel, {.tokens = tokens_, .accept_lossy = true});
  ASSERT_TRUE(plan.ok());
  auto lease = cache_->Lookup(kModel, tokens_, {.acquire = true}, /*accept_lossy=*/true);
  ASSERT_TRUE(lease.ok());
  ASSERT_NE(lease->lease_id, 0u);
  EXPECT_TRUE(plan->MaySendLossy());
  ASSERT_TRUE(cache_->UpdatePolicy(kModel, {.mode = CompressionMode::kOff}).ok());
  // The fetch in flight may no longer send its lossy blocks...
  EXPECT_FALSE(plan->MaySendLossy());
  // ...and the lease now ends before its first lossy block (block 0).
  auto by_lease = cache_->PrepareFetch(kModel, {.lease_id = lease->lease_id, .accept_lossy = true});
  ASSERT_TRUE(by_lease.ok());
  EXPECT_EQ(by_lease->matched_tokens, 0u);
  EXPECT_TRUE(by_lease->blocks.empty());
  // A plan made after the switch is lossless and stays sendable.
  AppendAll();
  auto after = cache_->PrepareFetch(kModel, {.tokens = tokens_, .accept_lossy = true});
  ASSERT_TRUE(after.ok());
  EXPECT_TRUE(after->MaySendLossy());
  EXPECT_TRUE(Exact(*after, kv_));
}

// ---- Checksums through compaction (item 3) ---------------------------------------

TEST_F(IntegrityTest, CorruptRawBlockIsDroppedNotCompressed) {
  AppendAll();
  {
    auto plan = cache_->PrepareFetch(kModel, {.tokens = tokens_});
    ASSERT_TRUE(plan.ok());
    FlipBits(*plan->blocks[1], 100, std::byte{0x01});  // a bit flips in memory
  }
  ASSERT_TRUE(cache_->UpdatePolicy(kModel, {.mode = CompressionMode::kQuantize}).ok());
  clock_.Advance(absl::Seconds(61));
  const CompactionResult r = Compactor(cache_.get()).Compact();
  EXPECT_EQ(r.corrupt_blocks, 1u);
  EXPECT_EQ(Stats().corrupt_blocks, 1u);
  // Block 1 (and what hangs below it) is gone; block 0 is intact (compressed).
  auto plan = cache_->PrepareFetch(kModel, {.tokens = tokens_, .accept_lossy = true});
  ASSERT_TRUE(plan.ok());
  EXPECT_EQ(plan->matched_tokens, kBt);
}

TEST_F(IntegrityTest, CorruptCompressedBlockIsDataLossWhenDecoded) {
  AppendAll();
  CompressAll();
  auto plan = cache_->PrepareFetch(kModel, {.tokens = tokens_, .accept_lossy = true});
  ASSERT_TRUE(plan.ok());
  PinnedBlock stored = plan->blocks[1];
  ASSERT_TRUE(stored->compressed());
  // A flipped byte in the INT8 codes still parses: only the checksum tells.
  const size_t at = stored->size() / 2;
  FlipBits(*stored, at, std::byte{0x40});
  ASSERT_TRUE(importance::ParseCompressedBlock(stored->data()).ok());
  absl::StatusOr<FetchBlock> decoded = MaterializeForFetch(stored, false);
  EXPECT_EQ(decoded.status().code(), kDataLoss) << decoded.status();
  // Sent as stored, its checksum no longer matches: the worker's check fails.
  absl::StatusOr<FetchBlock> as_stored = MaterializeForFetch(stored, true);
  ASSERT_TRUE(as_stored.ok());
  EXPECT_NE(Checksum(as_stored->bytes->data()), as_stored->bytes->checksum());
  FlipBits(*stored, at, std::byte{0x40});
}

TEST_F(IntegrityTest, DecodingIntoTheWorkersMemoryWritesWhatTheHeapDecodeSends) {
  AppendAll();
  CompressAll();
  auto plan = cache_->PrepareFetch(kModel, {.tokens = tokens_, .accept_lossy = true});
  ASSERT_TRUE(plan.ok());
  const uint64_t block_bytes = TestLayout().BlockBytes();
  for (uint32_t b = 0; b + 1 < kBlocks; ++b) {
    const PinnedBlock& stored = plan->blocks[b];
    ASSERT_TRUE(stored->compressed());
    absl::StatusOr<FetchBlock> heap = MaterializeForFetch(stored, false);
    ASSERT_TRUE(heap.ok()) << heap.status();
    std::vector<std::byte> into(block_bytes, std::byte{0x5a});
    absl::StatusOr<DecodedForFetch> decoded = DecodeForFetchInto(*stored, into);
    ASSERT_TRUE(decoded.ok()) << decoded.status();
    EXPECT_EQ(decoded->checksum, heap->bytes->checksum()) << "block " << b;
    EXPECT_EQ(Checksum(into), decoded->checksum) << "block " << b;
    EXPECT_EQ(decoded->kept_tokens, heap->kept_tokens);
  }
  // A destination of another size is refused, and written nothing.
  std::vector<std::byte> small(block_bytes - 1, std::byte{0x5a});
  EXPECT_EQ(DecodeForFetchInto(*plan->blocks[0], small).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(small[0], std::byte{0x5a});
  // Corrupt stored bytes are DATA_LOSS before anything is written.
  PinnedBlock stored = plan->blocks[1];
  const size_t at = stored->size() / 2;
  FlipBits(*stored, at, std::byte{0x40});
  std::vector<std::byte> into(block_bytes, std::byte{0x5a});
  EXPECT_EQ(DecodeForFetchInto(*stored, into).status().code(), kDataLoss);
  EXPECT_EQ(into[0], std::byte{0x5a});
  FlipBits(*stored, at, std::byte{0x40});
}

TEST_F(IntegrityTest, CompressedBlocksKeepTheirRawChecksum) {
  AppendAll();
  std::vector<uint64_t> raw;
  for (uint32_t b = 0; b < kBlocks; ++b) {
    raw.push_back(Checksum(Bytes(kv_).subspan(b * kBlockFloats * 4, kBlockFloats * 4)));
  }
  CompressAll();
  auto plan = cache_->PrepareFetch(kModel, {.tokens = tokens_, .accept_lossy = true});
  ASSERT_TRUE(plan.ok());
  for (uint32_t b = 0; b < kBlocks; ++b) EXPECT_EQ(plan->blocks[b]->raw_checksum(), raw[b]);
}

// ---- Conflicting and re-appended blocks (items 4, 5) -----------------------------

TEST_F(IntegrityTest, ConflictingAppendIsReportedAndTheCachedCopyKept) {
  AppendAll();
  const std::vector<float> other = Gaussian(kBlocks, 99);
  std::vector<uint64_t> sums;
  for (uint32_t b = 0; b < kBlocks; ++b) {
    sums.push_back(Checksum(Bytes(other).subspan(b * kBlockFloats * 4, kBlockFloats * 4)));
  }
  auto r = Append(tokens_, other, 0, {}, sums);  // valid checksums, other bytes
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->conflicting_blocks, kBlocks);
  EXPECT_EQ(r->first_conflicting_block, 0);
  EXPECT_EQ(r->deduplicated_blocks, kBlocks);
  EXPECT_EQ(Stats().conflicting_blocks, kBlocks);
  EXPECT_EQ(cache_->GetStats().conflicting_appends, 1u);
  auto plan = cache_->PrepareFetch(kModel, {.tokens = tokens_});
  ASSERT_TRUE(plan.ok());
  EXPECT_TRUE(Exact(*plan, kv_));  // what readers were served before
  // The same bytes again are no conflict.
  auto same = Append(tokens_, kv_);
  ASSERT_TRUE(same.ok());
  EXPECT_EQ(same->conflicting_blocks, 0u);
  EXPECT_EQ(same->first_conflicting_block, -1);
}

TEST_F(IntegrityTest, ReappendingTheExactBytesRestoresLossyBlocks) {
  AppendAll();
  CompressAll();
  const uint64_t compressed_bytes = Stats().bytes;
  auto r = Append(tokens_, kv_);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->restored_blocks, kBlocks - 1);
  EXPECT_EQ(r->conflicting_blocks, 0u);
  const ModelStats s = Stats();
  EXPECT_EQ(s.compressed_blocks, 0u);
  EXPECT_EQ(s.int8_tokens, 0u);
  EXPECT_EQ(s.bytes_saved, 0u);
  EXPECT_EQ(s.restored_blocks, kBlocks - 1);
  EXPECT_GT(s.bytes, compressed_bytes);
  EXPECT_EQ(s.bytes, kBlocks * TestLayout().BlockBytes());
  auto plan = cache_->PrepareFetch(kModel, {.tokens = tokens_});
  ASSERT_TRUE(plan.ok());
  EXPECT_EQ(plan->blocks.size(), kBlocks);
  EXPECT_TRUE(Exact(*plan, kv_));
  // Other bytes for a lossy block are a conflict, and do not replace it.
  plan = absl::InternalError("released");  // a plan pins its blocks against compaction
  CompressAll();
  auto conflicting = Append(tokens_, Gaussian(kBlocks, 5));
  ASSERT_TRUE(conflicting.ok());
  EXPECT_EQ(conflicting->restored_blocks, 0u);
  EXPECT_EQ(conflicting->conflicting_blocks, kBlocks);
  EXPECT_EQ(Stats().compressed_blocks, kBlocks - 1);
}

TEST_F(IntegrityTest, ProtectingALossyBlockNeedsItsBytes) {
  AppendAll();
  CompressAll();
  AppendHints hints;
  hints.protected_ranges = {{.begin = 5, .end = 9}};  // in block 0, stored lossy
  const std::vector<Token> longer = Tokens(0, kBlocks + 1);
  std::vector<float> longer_kv = kv_;
  const std::vector<float> tail = Gaussian(1, 3);
  longer_kv.insert(longer_kv.end(), tail.begin(), tail.end());
  auto skipping = Append(longer, longer_kv, kBlocks * kBt, hints);
  EXPECT_EQ(skipping.status().code(), kFailedPrecondition);
  EXPECT_THAT(skipping.status().message(), HasSubstr("block 0 holds protected tokens"));
  EXPECT_EQ(Stats().blocks, kBlocks);  // nothing changed
  // Sent with its bytes, the block is exact again and pinned from then on.
  auto with_bytes = Append(longer, longer_kv, 0, hints);
  ASSERT_TRUE(with_bytes.ok()) << with_bytes.status();
  EXPECT_EQ(with_bytes->restored_blocks, kBlocks - 1);
  auto plan = cache_->PrepareFetch(kModel, {.tokens = longer});
  ASSERT_TRUE(plan.ok());
  EXPECT_EQ(plan->blocks.size(), kBlocks + 1);
  EXPECT_TRUE(Exact(*plan, longer_kv));
}

// ---- What compaction compresses (items 6, 7, 14) ---------------------------------

TEST_F(IntegrityTest, CompactionLeavesBlocksRawWhenTheCopyFreesNoMemory) {
  // fp16 blocks of exactly two slabs: an INT8 copy (half, plus scales) still
  // needs a two-slab run, so compressing would lose precision for nothing.
  const ModelKey big{"default", "big"};
  const ModelLayout layout{4, 2, 64, DType::kFp16, 64};  // 128 KiB = 2 slabs
  ASSERT_EQ(layout.BlockBytes(), 2 * kSlab);
  ASSERT_TRUE(cache_->RegisterModel(big, layout).ok());
  std::vector<Token> tokens(4 * 64);
  std::iota(tokens.begin(), tokens.end(), 7);
  std::vector<uint16_t> kv(4 * layout.BlockBytes() / 2);
  std::mt19937 rng(3);
  for (uint16_t& h : kv) h = static_cast<uint16_t>(0x3000 + rng() % 0x0800);  // finite fp16
  auto session = cache_->BeginAppend(big, tokens, 0, {}, {});
  ASSERT_TRUE(session.ok());
  ASSERT_TRUE((*session)->Write(std::as_bytes(std::span<const uint16_t>(kv))).ok());
  ASSERT_TRUE((*session)->Commit().ok());
  const uint64_t allocated = cache_->GetStats().host_pool.allocated_bytes;
  ASSERT_TRUE(cache_->UpdatePolicy(big, {.mode = CompressionMode::kQuantize}).ok());
  clock_.Advance(absl::Seconds(61));
  const CompactionResult r = Compactor(cache_.get()).Compact();
  EXPECT_EQ(r.compressed_blocks, 0u);
  EXPECT_GE(r.no_saving_blocks, 3u);
  EXPECT_EQ(r.bytes_saved, 0u);
  EXPECT_EQ(cache_->GetStats().host_pool.allocated_bytes, allocated);
}

TEST_F(IntegrityTest, NonFiniteKeysStayExactAndSpoilNothingElse) {
  const size_t inf_at = kBlockFloats + At(0, 0, 1, 6, 3);  // block 1, key of token 22
  kv_[inf_at] = std::numeric_limits<float>::infinity();
  const size_t nan_at = 2 * kBlockFloats + At(1, 1, 0, 9, 0);  // block 2, value of token 41
  kv_[nan_at] = std::numeric_limits<float>::quiet_NaN();
  AppendAll();
  CompressAll();
  auto plan = cache_->PrepareFetch(kModel, {.tokens = tokens_, .accept_lossy = true});
  ASSERT_TRUE(plan.ok());
  for (uint32_t b = 1; b <= 2; ++b) {
    absl::StatusOr<FetchBlock> sent = MaterializeForFetch(plan->blocks[b], false);
    ASSERT_TRUE(sent.ok());
    std::vector<float> got(kBlockFloats);
    std::memcpy(got.data(), sent->bytes->data().data(), sent->bytes->size());
    for (size_t i = 0; i < kBlockFloats; ++i) {
      const float want = kv_[b * kBlockFloats + i];
      if (std::isnan(want)) {
        EXPECT_TRUE(std::isnan(got[i])) << i;
      } else if (std::isinf(want)) {
        EXPECT_EQ(got[i], want) << i;
      } else {
        ASSERT_TRUE(std::isfinite(got[i])) << "block " << b << " element " << i;
        ASSERT_LE(std::abs(got[i] - want), 0.05f) << "block " << b << " element " << i;
      }
    }
  }
  // The tokens holding them are stored exactly; the rest of the block is INT8.
  EXPECT_EQ(Stats().int8_tokens, 3 * kBt - 4 - 2);
}

TEST_F(IntegrityTest, CompactionWorksWhenTheTierIsAtItsBudget) {
  // Appends keep a quarter of the pool free for appends in flight; a full
  // tier (the steady state) still has room for compressed copies there.
  options_.append_staging_bytes = 4 * kSlab;
  options_.importance.pressure_watermark = 0.5;
  MakeCache(16);
  ASSERT_TRUE(cache_->UpdatePolicy(kModel, {.mode = CompressionMode::kQuantize}).ok());
  for (uint32_t s = 0; s < 40; ++s) {  // 160 blocks of 8 KiB: more than the tier holds
    ASSERT_TRUE(Append(Tokens(s), Gaussian(kBlocks, s)).ok()) << s;
  }
  const CacheStats full = cache_->GetStats();
  EXPECT_GT(full.capacity_evictions, 0u);
  EXPECT_LE(full.host_pool.allocated_bytes, 12 * kSlab);
  const CompactionResult r = Compactor(cache_.get()).Compact();
  EXPECT_TRUE(r.under_pressure);
  EXPECT_GT(r.compressed_blocks, 0u);
  EXPECT_GT(r.bytes_saved, 0u);
}

// ---- One request hurting everyone (items 8, 10, 11, 12) --------------------------

TEST_F(IntegrityTest, ProtectedRangesAreCappedAndMerged) {
  options_.max_protected_ranges = 64;
  MakeCache();
  AppendHints too_many;
  for (uint64_t i = 0; i < 65; ++i) too_many.protected_ranges.push_back({i, i + 1});
  auto refused = Append(tokens_, kv_, 0, too_many);
  EXPECT_EQ(refused.status().code(), kInvalidArgument);
  EXPECT_THAT(refused.status().message(), HasSubstr("max_protected_ranges"));
  EXPECT_EQ(Stats().blocks, 0u);
  // Overlapping, unordered ranges pin the union.
  AppendHints overlapping;
  overlapping.protected_ranges = {{30, 40}, {20, 25}, {24, 31}, {22, 23}};
  ASSERT_TRUE(Append(tokens_, kv_, 0, overlapping).ok());
  ASSERT_TRUE(cache_->UpdatePolicy(kModel, {.mode = CompressionMode::kQuantize}).ok());
  clock_.Advance(absl::Seconds(61));
  const CompactionResult r = Compactor(cache_.get()).Compact();
  // Blocks 0-2 hold 48 tokens: 4 sinks and tokens 20..39 stay full.
  EXPECT_EQ(r.int8_tokens, 48u - 4 - 20);
}

TEST_F(IntegrityTest, LeasesAreCappedInNumberAndTokens) {
  options_.max_leases = 2;
  options_.max_lease_tokens = 3 * kBlocks * kBt;
  MakeCache();
  AppendAll();
  auto a = cache_->Lookup(kModel, tokens_, {.acquire = true});
  auto b = cache_->Lookup(kModel, tokens_, {.acquire = true});
  ASSERT_TRUE(a.ok() && b.ok());
  auto c = cache_->Lookup(kModel, tokens_, {.acquire = true});
  EXPECT_EQ(c.status().code(), kResourceExhausted);
  EXPECT_THAT(c.status().message(), HasSubstr("max_leases"));
  EXPECT_EQ(cache_->GetStats().active_leases, 2u);
  EXPECT_EQ(cache_->GetStats().lease_tokens, 2 * kBlocks * kBt);
  ASSERT_TRUE(cache_->ReleaseLease(a->lease_id));
  options_.max_leases = 100;
  MakeCache();
  AppendAll();
  for (int i = 0; i < 3; ++i) ASSERT_TRUE(cache_->Lookup(kModel, tokens_, {.acquire = true}).ok());
  auto over = cache_->Lookup(kModel, tokens_, {.acquire = true});
  EXPECT_EQ(over.status().code(), kResourceExhausted);
  EXPECT_THAT(over.status().message(), HasSubstr("max_lease_tokens"));
  // Expired leases give their tokens back.
  clock_.Advance(absl::Minutes(5));
  CacheAccess::Locked(CacheAccess(cache_.get())).ExpireLeases();
  EXPECT_EQ(cache_->GetStats().lease_tokens, 0u);
  EXPECT_TRUE(cache_->Lookup(kModel, tokens_, {.acquire = true}).ok());
}

TEST_F(IntegrityTest, RejectedAppendEvictsNothingWhenItFitsTheStaging) {
  options_.append_staging_bytes = 4 * kSlab;  // 32 blocks
  MakeCache(16);                              // 128 blocks of 8 KiB
  for (uint32_t s = 0; s < 24; ++s) ASSERT_TRUE(Append(Tokens(s), Gaussian(kBlocks, s)).ok());
  const CacheStats before = cache_->GetStats();
  ASSERT_EQ(before.blocks, 96u);  // the committed budget: 128 - 32
  // Eight blocks whose last checksum is wrong: DATA_LOSS, and no block evicted.
  const std::vector<Token> tokens = Tokens(100, 8);
  const std::vector<float> kv = Gaussian(8, 100);
  std::vector<uint64_t> sums;
  for (uint32_t b = 0; b < 8; ++b) {
    sums.push_back(Checksum(Bytes(kv).subspan(b * kBlockFloats * 4, kBlockFloats * 4)));
  }
  sums.back() ^= 1;
  auto bad = Append(tokens, kv, 0, {}, sums);
  EXPECT_EQ(bad.status().code(), kDataLoss);
  const CacheStats after = cache_->GetStats();
  EXPECT_EQ(after.blocks, before.blocks);
  EXPECT_EQ(after.capacity_evictions + after.metadata_evictions,
            before.capacity_evictions + before.metadata_evictions);
  EXPECT_EQ(after.staged_bytes, 0u);
  EXPECT_EQ(after.host_pool.allocated_bytes, before.host_pool.allocated_bytes);
  // The good append is stored, and its commit evicts to keep the staging free.
  sums.back() ^= 1;
  auto good = Append(tokens, kv, 0, {}, sums);
  ASSERT_TRUE(good.ok()) << good.status();
  EXPECT_EQ(good->stored_blocks, 8u);
  EXPECT_EQ(cache_->GetStats().blocks, 96u);
  EXPECT_EQ(cache_->GetStats().capacity_evictions, before.capacity_evictions + 8);
}

TEST_F(IntegrityTest, AppendsWithoutChecksumsAreRefusedWhenRequired) {
  std::vector<uint64_t> sums;
  for (uint32_t b = 0; b < kBlocks; ++b) {
    sums.push_back(Checksum(Bytes(kv_).subspan(b * kBlockFloats * 4, kBlockFloats * 4)));
  }
  options_.require_block_checksums = true;
  MakeCache();
  auto bare = Append(tokens_, kv_);
  EXPECT_EQ(bare.status().code(), kInvalidArgument);
  EXPECT_THAT(bare.status().message(), HasSubstr("block_checksums"));
  EXPECT_THAT(bare.status().message(), HasSubstr("security.require_block_checksums"));
  // Refused before anything was claimed, staged or stored.
  EXPECT_EQ(cache_->GetStats().blocks, 0u);
  EXPECT_EQ(cache_->GetStats().staged_bytes, 0u);
  EXPECT_EQ(cache_->Lookup(kModel, tokens_)->matched_tokens, 0u);
  // Tokens without a whole block carry no KV and need no checksum.
  const std::vector<Token> partial(tokens_.begin(), tokens_.begin() + kBt - 1);
  auto empty = Append(partial, {});
  ASSERT_TRUE(empty.ok()) << empty.status();
  EXPECT_EQ(empty->stored_blocks, 0u);
  // With its checksums the same append stores every block.
  auto checked = Append(tokens_, kv_, 0, {}, sums);
  ASSERT_TRUE(checked.ok()) << checked.status();
  EXPECT_EQ(checked->stored_blocks, kBlocks);

  // Not required (the core's default): the bare append is stored.
  options_.require_block_checksums = false;
  MakeCache();
  auto accepted = Append(tokens_, kv_);
  ASSERT_TRUE(accepted.ok()) << accepted.status();
  EXPECT_EQ(accepted->stored_blocks, kBlocks);
}

TEST_F(IntegrityTest, RacingAppendsOfTheSameTokensStoreOneCopy) {
  AppendHints none;
  auto first = cache_->BeginAppend(kModel, tokens_, 0, none, {});
  auto second = cache_->BeginAppend(kModel, tokens_, 0, none, {});
  ASSERT_TRUE(first.ok() && second.ok());
  ASSERT_TRUE((*first)->Write(Bytes(kv_)).ok());
  const uint64_t one_copy = cache_->GetStats().staged_bytes;
  EXPECT_GE(one_copy, kBlocks * TestLayout().BlockBytes());
  ASSERT_TRUE((*second)->Write(Bytes(kv_)).ok());
  EXPECT_EQ(cache_->GetStats().staged_bytes, one_copy) << "the second append stored a copy";
  // The second finishes first: its blocks are the first's to store.
  auto r2 = (*second)->Commit();
  ASSERT_TRUE(r2.ok());
  EXPECT_EQ(r2->stored_blocks, 0u);
  EXPECT_EQ(r2->pending_blocks, kBlocks);
  EXPECT_EQ(r2->cached_tokens, 0u);
  auto r1 = (*first)->Commit();
  ASSERT_TRUE(r1.ok());
  EXPECT_EQ(r1->stored_blocks, kBlocks);
  EXPECT_EQ(cache_->GetStats().host_pool.allocated_bytes, one_copy);
  // After a commit, the same append deduplicates and compares.
  auto again = Append(tokens_, kv_);
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(again->deduplicated_blocks, kBlocks);
  EXPECT_EQ(again->conflicting_blocks, 0u);
  // An abandoned append gives its claims back.
  const std::vector<Token> other = Tokens(1);
  { auto abandoned = cache_->BeginAppend(kModel, other, 0, none, {}); }
  auto stored = Append(other, Gaussian(kBlocks, 1));
  ASSERT_TRUE(stored.ok());
  EXPECT_EQ(stored->stored_blocks, kBlocks);
}

TEST_F(IntegrityTest, MetadataIsCountedAndBounded) {
  AppendAll();
  const uint64_t per_block = cache_->GetStats().metadata_bytes / kBlocks;
  EXPECT_GE(per_block, sizeof(IndexNode) + kBt * sizeof(Token));
  // Attention reports add activity state.
  std::vector<float> attention(tokens_.size(), 0.1f);
  ASSERT_TRUE(cache_->ReportAttention(kModel, tokens_, 0, attention, 1).ok());
  EXPECT_GE(cache_->GetStats().metadata_bytes, kBlocks * (per_block + kBt * sizeof(float)));
  // A budget of about ten blocks' metadata keeps about ten blocks.
  options_.max_metadata_bytes = 10 * per_block + per_block / 2;
  MakeCache(64);
  for (uint32_t s = 0; s < 10; ++s) ASSERT_TRUE(Append(Tokens(s), Gaussian(kBlocks, s)).ok());
  const CacheStats stats = cache_->GetStats();
  EXPECT_LE(stats.metadata_bytes, options_.max_metadata_bytes);
  EXPECT_EQ(stats.blocks, 10u);
  EXPECT_EQ(stats.metadata_evictions, 30u);
  // Leases count too: a lease keeps a copy of its tokens.
  auto lease = cache_->Lookup(kModel, Tokens(9), {.acquire = true});
  ASSERT_TRUE(lease.ok());
  EXPECT_GE(cache_->GetStats().metadata_bytes,
            stats.metadata_bytes + kBlocks * kBt * sizeof(Token));
  ASSERT_TRUE(cache_->ReleaseLease(lease->lease_id));
  ASSERT_TRUE(cache_->EvictModel(kModel).ok());
  EXPECT_EQ(cache_->GetStats().metadata_bytes, 0u);
}

}  // namespace
}  // namespace kvcache
