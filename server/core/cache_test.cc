// Unit tests for the Cache facade over a real SlabPool and a ManualClock.
//
// Every block's bytes are a pattern derived from (model salt, chained key of
// its token prefix, offset), so a byte written or served for the wrong prefix,
// the wrong model or the wrong offset is caught.
#include "server/core/cache.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstring>
#include <map>
#include <random>
#include <thread>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace kvcache {
namespace {

using ::absl::StatusCode;
using ::testing::HasSubstr;

constexpr uint32_t kBt = 16;
constexpr uint64_t kSlab = uint64_t{64} << 10;

struct TestModel {
  ModelKey key;
  ModelLayout layout;
  uint64_t salt;
};

ModelLayout Layout(uint32_t head_dim, DType dtype) {
  return {.num_layers = 1,
          .num_kv_heads = 1,
          .head_dim = head_dim,
          .dtype = dtype,
          .block_tokens = kBt};
}
TestModel Small() { return {{"default", "small"}, Layout(8, DType::kFp16), 11}; }  // 512 B
TestModel Mid() { return {{"default", "mid"}, Layout(16, DType::kFp32), 22}; }     // 2 KiB
TestModel Big() { return {{"default", "big"}, Layout(64, DType::kFp32), 33}; }     // 8 KiB

// Block `id` is tokens id*1024 .. id*1024+15; `extra` tokens make a partial tail.
std::vector<Token> Seq(const std::vector<uint32_t>& ids, uint32_t extra = 0) {
  std::vector<Token> tokens;
  for (uint32_t id : ids) {
    for (uint32_t t = 0; t < kBt; ++t) tokens.push_back(id * 1024 + t);
  }
  for (uint32_t t = 0; t < extra; ++t) tokens.push_back(900'000'000 + t);
  return tokens;
}

uint64_t Mix(uint64_t x) {  // splitmix64
  x += 0x9e3779b97f4a7c15;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9;
  x = (x ^ (x >> 27)) * 0x94d049bb133111eb;
  return x ^ (x >> 31);
}

uint64_t PrefixKey(std::span<const Token> tokens, size_t block) {
  uint64_t key = 0;
  for (size_t b = 0; b <= block; ++b)
    key = PrefixIndex::ChainKey(key, tokens.subspan(b * kBt, kBt));
  return key;
}

std::vector<std::byte> Pattern(const TestModel& m, std::span<const Token> tokens, size_t block) {
  const uint64_t key = PrefixKey(tokens, block) ^ Mix(m.salt);
  std::vector<std::byte> out(m.layout.BlockBytes());
  for (size_t i = 0; i < out.size(); i += 8) {
    const uint64_t word = Mix(key + i);
    std::memcpy(out.data() + i, &word, std::min<size_t>(8, out.size() - i));
  }
  return out;
}

std::vector<std::byte> Kv(const TestModel& m, std::span<const Token> tokens, size_t first,
                          size_t count) {
  std::vector<std::byte> kv;
  for (size_t b = first; b < first + count; ++b) {
    std::vector<std::byte> block = Pattern(m, tokens, b);
    kv.insert(kv.end(), block.begin(), block.end());
  }
  return kv;
}

absl::Status WriteInChunks(AppendSession& session, std::span<const std::byte> kv) {
  static constexpr size_t kChunks[] = {1, 7, 333, 4093, 64, 100003, 5};
  for (size_t i = 0; !kv.empty(); ++i) {
    const size_t n = std::min(kv.size(), kChunks[i % std::size(kChunks)]);
    if (absl::Status s = session.Write(kv.first(n)); !s.ok()) return s;
    kv = kv.subspan(n);
  }
  return absl::OkStatus();
}

std::vector<uint64_t> Checksums(const TestModel& m, std::span<const Token> tokens, size_t first) {
  std::vector<uint64_t> sums;
  for (size_t b = first; b < tokens.size() / kBt; ++b)
    sums.push_back(Checksum(Pattern(m, tokens, b)));
  return sums;
}

// BeginAppend, Write in odd-sized chunks, Commit.
absl::StatusOr<AppendResult> Append(Cache& cache, const TestModel& m,
                                    const std::vector<Token>& tokens, uint64_t start_token = 0,
                                    AppendHints hints = {}, bool checksums = false) {
  const size_t first = start_token / kBt;
  auto session =
      cache.BeginAppend(m.key, tokens, start_token, hints,
                        checksums ? Checksums(m, tokens, first) : std::vector<uint64_t>{});
  if (!session.ok()) return session.status();
  const size_t count = (tokens.size() - start_token) / kBt;
  if (absl::Status s = WriteInChunks(**session, Kv(m, tokens, first, count)); !s.ok()) return s;
  return (*session)->Commit();
}

// Every block of `plan` holds exactly the pattern of its prefix of `tokens`.
::testing::AssertionResult PlanHolds(const FetchPlan& plan, const TestModel& m,
                                     std::span<const Token> tokens) {
  if (plan.layout != m.layout) return ::testing::AssertionFailure() << "wrong layout";
  if (plan.matched_tokens != plan.blocks.size() * kBt || plan.matched_tokens > tokens.size()) {
    return ::testing::AssertionFailure() << "matched_tokens " << plan.matched_tokens << " for "
                                         << plan.blocks.size() << " blocks";
  }
  for (size_t b = 0; b < plan.blocks.size(); ++b) {
    const std::vector<std::byte> expected = Pattern(m, tokens, b);
    std::span<const std::byte> got = plan.blocks[b]->data();
    if (!std::equal(got.begin(), got.end(), expected.begin(), expected.end())) {
      return ::testing::AssertionFailure() << "block " << b << " holds wrong bytes";
    }
    if (plan.blocks[b]->checksum() != Checksum(expected)) {
      return ::testing::AssertionFailure() << "block " << b << " has a wrong checksum";
    }
  }
  return ::testing::AssertionSuccess();
}

template <typename T>
StatusCode CodeOf(const absl::StatusOr<T>& s) {
  return s.status().code();
}

class CacheTest : public ::testing::Test {
 protected:
  void SetUp() override { MakeCache(4); }

  void MakeCache(uint64_t slabs, const CacheOptions& options = {}) {
    cache_.reset();
    auto pool = SlabPool::Create(
        {.capacity_bytes = slabs * kSlab, .slab_bytes = kSlab, .min_class_bytes = 64});
    ASSERT_TRUE(pool.ok()) << pool.status();
    cache_ = std::make_unique<Cache>(options, *std::move(pool), NewLruPolicy(), &clock_);
  }

  void Register(const TestModel& m) {
    auto r = cache_->RegisterModel(m.key, m.layout);
    ASSERT_TRUE(r.ok()) << r.status();
  }

  uint64_t Matched(const TestModel& m, std::span<const Token> tokens) {
    auto r = cache_->Lookup(m.key, tokens);
    EXPECT_TRUE(r.ok()) << r.status();
    return r.ok() ? r->matched_tokens : 0;
  }

  // Fetches the cached prefix of `tokens`, checks every byte, returns its length.
  uint64_t Fetched(const TestModel& m, std::span<const Token> tokens) {
    auto plan = cache_->PrepareFetch(m.key, tokens);
    EXPECT_TRUE(plan.ok()) << plan.status();
    if (!plan.ok()) return 0;
    EXPECT_TRUE(PlanHolds(*plan, m, tokens));
    return plan->matched_tokens;
  }

  uint64_t Allocated() const { return cache_->GetStats().host_pool.allocated_bytes; }

  ModelStats StatsOf(const TestModel& m) const {
    for (const ModelStats& s : cache_->GetStats().models) {
      if (s.model == m.key) return s;
    }
    ADD_FAILURE() << "no stats for " << m.key.ToString();
    return {};
  }

  ManualClock clock_;
  std::unique_ptr<Cache> cache_;
};

// ---- RegisterModel ---------------------------------------------------------

TEST_F(CacheTest, RegisterIsIdempotentForTheSameLayout) {
  auto first = cache_->RegisterModel(Small().key, Small().layout);
  ASSERT_TRUE(first.ok()) << first.status();
  EXPECT_TRUE(first->created);
  EXPECT_EQ(first->layout, Small().layout);
  auto again = cache_->RegisterModel(Small().key, Small().layout);
  ASSERT_TRUE(again.ok());
  EXPECT_FALSE(again->created);
  EXPECT_EQ(CodeOf(cache_->RegisterModel(Small().key, Layout(16, DType::kFp16))),
            StatusCode::kAlreadyExists);
  // The same id in another namespace is another model.
  auto tenant = cache_->RegisterModel({"tenant-b", "small"}, Layout(16, DType::kFp16));
  ASSERT_TRUE(tenant.ok());
  EXPECT_TRUE(tenant->created);
  EXPECT_EQ(cache_->ListModels().size(), 2u);
  auto layout = cache_->GetLayout(Small().key);
  ASSERT_TRUE(layout.ok());
  EXPECT_EQ(*layout, Small().layout);
  EXPECT_EQ(CodeOf(cache_->GetLayout({"default", "nope"})), StatusCode::kNotFound);
}

TEST_F(CacheTest, RegisterNamesTheBadField) {
  const ModelKey key = Small().key;
  auto with = [](void (*mutate)(ModelLayout&)) {
    ModelLayout l = Small().layout;
    mutate(l);
    return l;
  };
  const struct {
    ModelKey key;
    ModelLayout layout;
    std::string field;
  } cases[] = {
      {{"", "m"}, Small().layout, "namespace"},
      {{"bad ns", "m"}, Small().layout, "namespace"},
      {{"default", ""}, Small().layout, "model_id"},
      {{"default", "a?b"}, Small().layout, "model_id"},
      {{"default", std::string(129, 'a')}, Small().layout, "model_id"},
      {key, with([](ModelLayout& l) { l.num_layers = 0; }), "num_layers"},
      {key, with([](ModelLayout& l) { l.num_layers = 1025; }), "num_layers"},
      {key, with([](ModelLayout& l) { l.num_kv_heads = 0; }), "num_kv_heads"},
      {key, with([](ModelLayout& l) { l.head_dim = 0; }), "head_dim"},
      {key, with([](ModelLayout& l) { l.head_dim = 4097; }), "head_dim"},
      {key, with([](ModelLayout& l) { l.dtype = static_cast<DType>(0); }), "dtype"},
      {key, with([](ModelLayout& l) { l.block_tokens = 8; }), "block_tokens"},
      {key, with([](ModelLayout& l) { l.block_tokens = 24; }), "block_tokens"},
      {key, with([](ModelLayout& l) { l.block_tokens = 2048; }), "block_tokens"},
  };
  for (const auto& c : cases) {
    auto r = cache_->RegisterModel(c.key, c.layout);
    EXPECT_EQ(CodeOf(r), StatusCode::kInvalidArgument) << c.field;
    EXPECT_THAT(r.status().message(), HasSubstr(c.field));
  }
  EXPECT_TRUE(cache_->ListModels().empty());
}

TEST_F(CacheTest, RegisterDefaultsBlockTokensAndChecksCapacity) {
  ModelLayout layout = Small().layout;
  layout.block_tokens = 0;
  auto r = cache_->RegisterModel(Small().key, layout);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->layout.block_tokens, kDefaultBlockTokens);
  layout.block_tokens = kDefaultBlockTokens;
  auto explicit_default = cache_->RegisterModel(Small().key, layout);
  ASSERT_TRUE(explicit_default.ok());
  EXPECT_FALSE(explicit_default->created);

  // 512 KiB blocks cannot fit a 256 KiB tier; 128 KiB blocks can (a run of two slabs).
  EXPECT_EQ(CodeOf(cache_->RegisterModel({"default", "huge"}, Layout(4096, DType::kFp32))),
            StatusCode::kResourceExhausted);
  const TestModel large{{"default", "large"}, Layout(1024, DType::kFp32), 44};
  Register(large);
  const std::vector<Token> tokens = Seq({1});
  ASSERT_TRUE(Append(*cache_, large, tokens).ok());
  EXPECT_EQ(Fetched(large, tokens), kBt);
}

TEST_F(CacheTest, RegisterStopsAtMaxModels) {
  MakeCache(4, {.max_models = 2});
  Register(Small());
  Register(Mid());
  EXPECT_EQ(CodeOf(cache_->RegisterModel(Big().key, Big().layout)), StatusCode::kResourceExhausted);
  EXPECT_TRUE(cache_->RegisterModel(Small().key, Small().layout).ok());  // still idempotent
}

// ---- Append and fetch ------------------------------------------------------

TEST_F(CacheTest, AppendLookupFetchRoundTripIsByteExact) {
  for (const TestModel& m : {Small(), Big()}) {
    SCOPED_TRACE(m.key.ToString());
    Register(m);
    const std::vector<Token> tokens = Seq({1, 2, 3, 4, 5}, 7);
    EXPECT_EQ(Matched(m, tokens), 0u);
    auto result = Append(*cache_, m, tokens, 0, {}, /*checksums=*/true);
    ASSERT_TRUE(result.ok()) << result.status();
    EXPECT_EQ(result->stored_blocks, 5u);
    EXPECT_EQ(result->deduplicated_blocks, 0u);
    EXPECT_EQ(result->stored_bytes, 5 * m.layout.BlockBytes());
    EXPECT_EQ(result->cached_tokens, 5 * kBt);

    auto lookup = cache_->Lookup(m.key, tokens);
    ASSERT_TRUE(lookup.ok());
    EXPECT_EQ(lookup->matched_tokens, 5 * kBt);
    EXPECT_EQ(lookup->lease_id, 0u);
    ASSERT_EQ(lookup->blocks.size(), 5u);
    for (uint32_t b = 0; b < 5; ++b) {
      EXPECT_EQ(lookup->blocks[b].index, b);
      EXPECT_EQ(lookup->blocks[b].key, PrefixKey(tokens, b));
      EXPECT_EQ(lookup->blocks[b].checksum, Checksum(Pattern(m, tokens, b)));
      EXPECT_EQ(lookup->blocks[b].bytes, m.layout.BlockBytes());
    }
    EXPECT_EQ(Fetched(m, tokens), 5 * kBt);
    EXPECT_EQ(Fetched(m, std::span(tokens).first(3 * kBt - 1)), 2 * kBt);  // whole blocks only
    EXPECT_EQ(Fetched(m, {}), 0u);
  }
}

TEST_F(CacheTest, AppendsExtendAndOverlapACachedPrefix) {
  Register(Small());
  ASSERT_TRUE(Append(*cache_, Small(), Seq({1, 2})).ok());
  auto extend = Append(*cache_, Small(), Seq({1, 2, 3, 4, 5}), 2 * kBt);
  ASSERT_TRUE(extend.ok()) << extend.status();
  EXPECT_EQ(extend->stored_blocks, 3u);
  EXPECT_EQ(extend->cached_tokens, 5 * kBt);
  auto overlap = Append(*cache_, Small(), Seq({1, 2, 3, 4, 5, 6}, 3), kBt);
  ASSERT_TRUE(overlap.ok()) << overlap.status();
  EXPECT_EQ(overlap->stored_blocks, 1u);
  EXPECT_EQ(overlap->deduplicated_blocks, 4u);
  EXPECT_EQ(overlap->cached_tokens, 6 * kBt);
  EXPECT_EQ(Fetched(Small(), Seq({1, 2, 3, 4, 5, 6})), 6 * kBt);
  // start_token at the end of a cached sequence carries no blocks.
  auto empty = Append(*cache_, Small(), Seq({1, 2}, 5), 2 * kBt);
  ASSERT_TRUE(empty.ok()) << empty.status();
  EXPECT_EQ(empty->stored_blocks + empty->deduplicated_blocks, 0u);
  EXPECT_EQ(empty->cached_tokens, 2 * kBt);
}

TEST_F(CacheTest, DuplicateBlocksAreStoredOnce) {
  Register(Small());
  const std::vector<Token> a = Seq({1, 2, 3, 4});
  ASSERT_TRUE(Append(*cache_, Small(), a).ok());
  const uint64_t allocated = Allocated();
  auto again = Append(*cache_, Small(), a);
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(again->stored_blocks, 0u);
  EXPECT_EQ(again->deduplicated_blocks, 4u);
  EXPECT_EQ(again->stored_bytes, 0u);
  EXPECT_EQ(Allocated(), allocated);

  const std::vector<Token> b = Seq({1, 2, 7, 8});  // shares two blocks with a
  auto shared = Append(*cache_, Small(), b);
  ASSERT_TRUE(shared.ok());
  EXPECT_EQ(shared->stored_blocks, 2u);
  EXPECT_EQ(shared->deduplicated_blocks, 2u);
  const ModelStats stats = StatsOf(Small());
  EXPECT_EQ(stats.blocks, 6u);
  EXPECT_EQ(stats.appended_blocks, 6u);
  EXPECT_EQ(stats.deduplicated_blocks, 6u);
  EXPECT_EQ(stats.bytes, 6 * Small().layout.BlockBytes());
  EXPECT_EQ(Fetched(Small(), a), 4 * kBt);
  EXPECT_EQ(Fetched(Small(), b), 4 * kBt);
}

TEST_F(CacheTest, BeginAppendValidatesTheRequest) {
  Register(Small());
  const TestModel m = Small();
  ASSERT_TRUE(Append(*cache_, m, Seq({1})).ok());
  auto begin = [&](std::vector<Token> tokens, uint64_t start, AppendHints hints = {},
                   std::vector<uint64_t> sums = {}) {
    return cache_->BeginAppend(m.key, std::move(tokens), start, hints, std::move(sums)).status();
  };
  absl::Status gap = begin(Seq({1, 2, 3}), 2 * kBt);
  EXPECT_EQ(gap.code(), StatusCode::kFailedPrecondition);
  EXPECT_THAT(gap.message(), HasSubstr("resend from token 16"));
  EXPECT_EQ(begin(Seq({1, 2}), 5).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(begin(Seq({1, 2}), 3 * kBt).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(begin(Seq({1, 2}), 0, {}, {1, 2, 3}).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(begin(Seq({1, 2}), 0, {.ttl = absl::Seconds(-1)}).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(cache_->BeginAppend({"default", "nope"}, Seq({1}), 0, {}, {}).status().code(),
            StatusCode::kNotFound);
  EXPECT_EQ(Matched(m, Seq({1, 2, 3})), kBt);
}

TEST_F(CacheTest, WrongByteCountsStoreNothing) {
  Register(Small());
  const std::vector<Token> tokens = Seq({1, 2, 3});
  const std::vector<std::byte> kv = Kv(Small(), tokens, 0, 3);
  const uint64_t before = Allocated();

  auto s = cache_->BeginAppend(Small().key, tokens, 0, {}, {});
  ASSERT_TRUE(s.ok());
  ASSERT_TRUE(WriteInChunks(**s, std::span(kv).first(kv.size() - 100)).ok());
  auto short_commit = (*s)->Commit();
  EXPECT_EQ(CodeOf(short_commit), StatusCode::kInvalidArgument);
  EXPECT_THAT(short_commit.status().message(), HasSubstr("expected"));
  EXPECT_EQ(Allocated(), before);
  s->reset();

  s = cache_->BeginAppend(Small().key, tokens, 0, {}, {});
  ASSERT_TRUE(s.ok());
  ASSERT_TRUE(WriteInChunks(**s, kv).ok());
  const std::byte extra[1] = {};
  EXPECT_EQ((*s)->Write(extra).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ((*s)->Write(extra).code(), StatusCode::kInvalidArgument);  // the session is dead
  EXPECT_EQ(CodeOf((*s)->Commit()), StatusCode::kInvalidArgument);
  EXPECT_EQ(Allocated(), before);
  s->reset();
  EXPECT_EQ(Matched(Small(), tokens), 0u);
  EXPECT_EQ(StatsOf(Small()).blocks, 0u);
}

TEST_F(CacheTest, ChecksumMismatchIsDataLossAndStoresNothing) {
  Register(Small());
  const std::vector<Token> tokens = Seq({1, 2, 3});
  std::vector<uint64_t> sums = Checksums(Small(), tokens, 0);
  sums[1] ^= 1;  // block 0 is fine, block 1 is not
  const uint64_t before = Allocated();
  auto s = cache_->BeginAppend(Small().key, tokens, 0, {}, sums);
  ASSERT_TRUE(s.ok());
  EXPECT_EQ(WriteInChunks(**s, Kv(Small(), tokens, 0, 3)).code(), StatusCode::kDataLoss);
  EXPECT_EQ(CodeOf((*s)->Commit()), StatusCode::kDataLoss);
  EXPECT_EQ(Allocated(), before);
  EXPECT_EQ(Matched(Small(), tokens), 0u);
}

TEST_F(CacheTest, AbandonedSessionStoresNothingAndFreesMemory) {
  Register(Small());
  const std::vector<Token> tokens = Seq({1, 2, 3, 4});
  const std::vector<std::byte> kv = Kv(Small(), tokens, 0, 4);
  const uint64_t before = Allocated();
  for (size_t written : {size_t{2 * 512 + 100}, kv.size()}) {
    auto s = cache_->BeginAppend(Small().key, tokens, 0, {}, {});
    ASSERT_TRUE(s.ok());
    ASSERT_TRUE(WriteInChunks(**s, std::span(kv).first(written)).ok());
    EXPECT_GT(Allocated(), before);
    s->reset();
    EXPECT_EQ(Allocated(), before);
    EXPECT_EQ(Matched(Small(), tokens), 0u);
  }
}

TEST_F(CacheTest, CommitAbortsWhenThePrefixWasEvictedMeanwhile) {
  Register(Small());
  ASSERT_TRUE(Append(*cache_, Small(), Seq({1, 2})).ok());
  const std::vector<Token> tokens = Seq({1, 2, 3});
  auto s = cache_->BeginAppend(Small().key, tokens, 2 * kBt, {}, {});
  ASSERT_TRUE(s.ok());
  ASSERT_TRUE(WriteInChunks(**s, Kv(Small(), tokens, 2, 1)).ok());
  ASSERT_TRUE(cache_->EvictPrefix(Small().key, Seq({1})).ok());
  EXPECT_EQ(CodeOf((*s)->Commit()), StatusCode::kAborted);
  s->reset();
  EXPECT_EQ(Matched(Small(), tokens), 0u);
  EXPECT_EQ(Allocated(), 0u);
}

// ---- Capacity: 2 slabs of 8 KiB blocks hold 16 blocks -------------------------

class CapacityTest : public CacheTest {
 protected:
  void SetUp() override {
    MakeCache(2);
    Register(Big());
    for (uint32_t s = 0; s < 4; ++s) {  // four sequences of four blocks
      seqs_.push_back(Seq({10 * s + 1, 10 * s + 2, 10 * s + 3, 10 * s + 4}));
      ASSERT_TRUE(Append(*cache_, Big(), seqs_.back()).ok());
    }
    ASSERT_EQ(cache_->GetStats().blocks, 16u);
  }
  absl::StatusOr<AppendResult> AppendNew(uint32_t id, uint32_t blocks) {
    std::vector<uint32_t> ids;
    for (uint32_t b = 0; b < blocks; ++b) ids.push_back(id + b);
    return Append(*cache_, Big(), Seq(ids));
  }
  uint64_t Lease(const std::vector<Token>& tokens, absl::Duration ttl = absl::ZeroDuration()) {
    auto r = cache_->Lookup(Big().key, tokens, {.acquire = true, .ttl = ttl});
    EXPECT_TRUE(r.ok() && r->lease_id != 0);
    return r.ok() ? r->lease_id : 0;
  }
  std::vector<std::vector<Token>> seqs_;
};

TEST_F(CapacityTest, EvictsLeastRecentlyUsedLeavesFirst) {
  for (int s : {0, 2, 3}) Matched(Big(), seqs_[s]);  // seqs_[1] is now the coldest
  auto e = AppendNew(100, 2);
  ASSERT_TRUE(e.ok()) << e.status();
  EXPECT_EQ(cache_->GetStats().capacity_evictions, 2u);
  EXPECT_EQ(StatsOf(Big()).evicted_blocks, 2u);
  // Its leaf went first, then its parent; the order of these lookups is the new recency.
  EXPECT_EQ(Fetched(Big(), seqs_[0]), 4 * kBt);
  EXPECT_EQ(Fetched(Big(), seqs_[2]), 4 * kBt);
  EXPECT_EQ(Fetched(Big(), seqs_[3]), 4 * kBt);
  EXPECT_EQ(Fetched(Big(), Seq({100, 101})), 2 * kBt);
  EXPECT_EQ(Fetched(Big(), seqs_[1]), 2 * kBt);
  ASSERT_TRUE(AppendNew(200, 5).ok());  // all of seqs_[0], then seqs_[2]'s leaf
  EXPECT_EQ(Matched(Big(), seqs_[0]), 0u);
  EXPECT_EQ(Matched(Big(), seqs_[2]), 3 * kBt);
  EXPECT_EQ(Matched(Big(), seqs_[3]), 4 * kBt);
  EXPECT_EQ(Matched(Big(), seqs_[1]), 2 * kBt);
  EXPECT_EQ(Fetched(Big(), Seq({200, 201, 202, 203, 204})), 5 * kBt);
  EXPECT_EQ(cache_->GetStats().blocks, 16u);
}

TEST_F(CapacityTest, LeasedBlocksAreNeverEvicted) {
  const uint64_t l0 = Lease(seqs_[0]);
  Lease(seqs_[1]);
  ASSERT_TRUE(AppendNew(100, 8).ok());  // takes all of seqs_[2] and seqs_[3]
  EXPECT_EQ(Fetched(Big(), seqs_[0]), 4 * kBt);
  EXPECT_EQ(Fetched(Big(), seqs_[1]), 4 * kBt);
  EXPECT_EQ(Matched(Big(), seqs_[2]) + Matched(Big(), seqs_[3]), 0u);
  EXPECT_TRUE(cache_->ReleaseLease(l0));
  EXPECT_FALSE(cache_->ReleaseLease(l0));
  EXPECT_EQ(Matched(Big(), Seq({100, 101, 102, 103, 104, 105, 106, 107})), 8 * kBt);
  ASSERT_TRUE(AppendNew(200, 1).ok());  // seqs_[0] is the coldest and no longer leased
  EXPECT_EQ(Matched(Big(), seqs_[0]), 3 * kBt);
  EXPECT_EQ(Fetched(Big(), seqs_[1]), 4 * kBt);
}

TEST_F(CapacityTest, AppendFailsWhenEverythingIsLeased) {
  std::vector<uint64_t> leases;
  for (const auto& s : seqs_) leases.push_back(Lease(s));
  const uint64_t allocated = Allocated();
  EXPECT_EQ(CodeOf(AppendNew(100, 1)), StatusCode::kResourceExhausted);
  EXPECT_EQ(cache_->GetStats().rejected_appends, 1u);
  EXPECT_EQ(cache_->GetStats().capacity_evictions, 0u);
  EXPECT_EQ(Allocated(), allocated);
  for (const auto& s : seqs_) EXPECT_EQ(Fetched(Big(), s), 4 * kBt);
  EXPECT_EQ(Matched(Big(), Seq({100})), 0u);
  EXPECT_TRUE(cache_->ReleaseLease(leases[3]));
  ASSERT_TRUE(AppendNew(100, 1).ok());
  EXPECT_EQ(Fetched(Big(), seqs_[3]), 3 * kBt);
}

TEST_F(CapacityTest, FetchPlansPinTheirBlocks) {
  std::vector<FetchPlan> plans;
  for (const auto& s : seqs_) plans.push_back(*cache_->PrepareFetch(Big().key, s));
  EXPECT_EQ(CodeOf(AppendNew(100, 1)), StatusCode::kResourceExhausted);
  plans.pop_back();
  EXPECT_TRUE(AppendNew(100, 1).ok());
  for (size_t s = 0; s < plans.size(); ++s) EXPECT_TRUE(PlanHolds(plans[s], Big(), seqs_[s]));
}

TEST_F(CapacityTest, ExpiredLeasesStopPinning) {
  std::vector<uint64_t> leases;
  for (const auto& s : seqs_) leases.push_back(Lease(s, absl::Seconds(5)));
  EXPECT_EQ(CodeOf(AppendNew(100, 1)), StatusCode::kResourceExhausted);
  clock_.Advance(absl::Seconds(4));
  EXPECT_EQ(CodeOf(AppendNew(100, 1)), StatusCode::kResourceExhausted);
  clock_.Advance(absl::Seconds(1));
  EXPECT_TRUE(AppendNew(100, 1).ok());
  EXPECT_FALSE(cache_->ReleaseLease(leases[1]));
  EXPECT_EQ(CodeOf(cache_->PrepareFetchLease(Big().key, leases[2])), StatusCode::kNotFound);
  cache_->ExpireLeases();
  EXPECT_EQ(cache_->GetStats().active_leases, 0u);
}

// ---- Leases -----------------------------------------------------------------

TEST_F(CacheTest, LeasesPinExactlyTheMatchedBlocks) {
  Register(Small());
  Register(Mid());
  const std::vector<Token> tokens = Seq({1, 2, 3, 4});
  ASSERT_TRUE(Append(*cache_, Small(), tokens).ok());
  auto none = cache_->Lookup(Small().key, Seq({9}), {.acquire = true});
  ASSERT_TRUE(none.ok());
  EXPECT_EQ(none->lease_id, 0u);  // nothing matched, nothing leased

  auto r = cache_->Lookup(Small().key, std::span(tokens).first(2 * kBt + 3), {.acquire = true});
  ASSERT_TRUE(r.ok());
  ASSERT_NE(r->lease_id, 0u);
  EXPECT_EQ(r->lease_expires, clock_.Now() + CacheOptions{}.default_lease_ttl);
  EXPECT_EQ(cache_->GetStats().active_leases, 1u);
  auto plan = cache_->PrepareFetchLease(Small().key, r->lease_id);
  ASSERT_TRUE(plan.ok());
  EXPECT_EQ(plan->matched_tokens, 2 * kBt);
  EXPECT_TRUE(PlanHolds(*plan, Small(), tokens));
  EXPECT_EQ(CodeOf(cache_->PrepareFetchLease(Mid().key, r->lease_id)),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(CodeOf(cache_->PrepareFetchLease(Small().key, r->lease_id + 1)), StatusCode::kNotFound);
  EXPECT_EQ(CodeOf(cache_->PrepareFetchLease({"default", "nope"}, r->lease_id)),
            StatusCode::kNotFound);

  auto longer = cache_->Lookup(Small().key, tokens, {.acquire = true, .ttl = absl::Hours(5)});
  ASSERT_TRUE(longer.ok());
  EXPECT_EQ(longer->lease_expires, clock_.Now() + CacheOptions{}.max_lease_ttl);  // capped
  EXPECT_TRUE(cache_->ReleaseLease(r->lease_id));
  EXPECT_FALSE(cache_->ReleaseLease(r->lease_id));
  EXPECT_EQ(CodeOf(cache_->PrepareFetchLease(Small().key, r->lease_id)), StatusCode::kNotFound);
  EXPECT_EQ(cache_->GetStats().active_leases, 1u);
}

// ---- Explicit eviction and expiry -------------------------------------------

TEST_F(CacheTest, FetchPlansOutliveEviction) {
  Register(Small());
  const std::vector<Token> tokens = Seq({1, 2, 3, 4});
  for (bool whole_model : {false, true}) {
    ASSERT_TRUE(Append(*cache_, Small(), tokens).ok());
    const uint64_t allocated = Allocated();
    auto plan = cache_->PrepareFetch(Small().key, tokens);
    ASSERT_TRUE(plan.ok());
    auto evicted =
        whole_model ? cache_->EvictModel(Small().key) : cache_->EvictPrefix(Small().key, Seq({1}));
    ASSERT_TRUE(evicted.ok());
    EXPECT_EQ(evicted->evicted_blocks, 4u);
    EXPECT_EQ(Matched(Small(), tokens), 0u);
    EXPECT_EQ(Allocated(), allocated);               // the plan still holds the memory...
    EXPECT_TRUE(PlanHolds(*plan, Small(), tokens));  // ...and the bytes
    plan = FetchPlan{};
    EXPECT_EQ(Allocated(), 0u);
  }
}

TEST_F(CacheTest, EvictPrefixRemovesTheSubtree) {
  Register(Small());
  const uint64_t bb = Small().layout.BlockBytes();
  ASSERT_TRUE(Append(*cache_, Small(), Seq({1, 2, 3, 4})).ok());
  ASSERT_TRUE(Append(*cache_, Small(), Seq({1, 2, 5, 6})).ok());
  ASSERT_TRUE(Append(*cache_, Small(), Seq({1, 7})).ok());
  auto r = cache_->EvictPrefix(Small().key, Seq({1, 2}));
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->evicted_blocks, 5u);
  EXPECT_EQ(r->evicted_bytes, 5 * bb);
  EXPECT_EQ(Fetched(Small(), Seq({1, 2, 3, 4})), kBt);
  EXPECT_EQ(Fetched(Small(), Seq({1, 7})), 2 * kBt);
  const ModelStats stats = StatsOf(Small());
  EXPECT_EQ(stats.blocks, 2u);
  EXPECT_EQ(stats.bytes, 2 * bb);
  EXPECT_EQ(stats.evicted_blocks, 5u);
  EXPECT_EQ(cache_->GetStats().payload_bytes, 2 * bb);

  auto missing = cache_->EvictPrefix(Small().key, Seq({1, 2}));
  ASSERT_TRUE(missing.ok());
  EXPECT_EQ(missing->evicted_blocks, 0u);
  EXPECT_EQ(CodeOf(cache_->EvictPrefix(Small().key, Seq({1}, 3))), StatusCode::kInvalidArgument);
  EXPECT_EQ(CodeOf(cache_->EvictPrefix(Small().key, {})), StatusCode::kInvalidArgument);
  EXPECT_EQ(CodeOf(cache_->EvictPrefix({"default", "nope"}, Seq({1}))), StatusCode::kNotFound);
}

TEST_F(CacheTest, EvictModelEmptiesOnlyThatModel) {
  Register(Small());
  Register(Mid());
  ASSERT_TRUE(Append(*cache_, Small(), Seq({1, 2, 3})).ok());
  ASSERT_TRUE(Append(*cache_, Mid(), Seq({1, 2})).ok());
  auto r = cache_->EvictModel(Small().key);
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->evicted_blocks, 3u);
  EXPECT_EQ(r->evicted_bytes, 3 * Small().layout.BlockBytes());
  EXPECT_EQ(StatsOf(Small()).blocks, 0u);
  EXPECT_EQ(StatsOf(Small()).bytes, 0u);
  EXPECT_EQ(Fetched(Mid(), Seq({1, 2})), 2 * kBt);
  EXPECT_TRUE(cache_->GetLayout(Small().key).ok());  // still registered
  ASSERT_TRUE(Append(*cache_, Small(), Seq({1, 2, 3})).ok());
  EXPECT_EQ(Fetched(Small(), Seq({1, 2, 3})), 3 * kBt);
  EXPECT_EQ(CodeOf(cache_->EvictModel({"default", "nope"})), StatusCode::kNotFound);
}

TEST_F(CacheTest, HintTtlExpiresBlocks) {
  Register(Small());
  ASSERT_TRUE(Append(*cache_, Small(), Seq({1, 2})).ok());
  ASSERT_TRUE(
      Append(*cache_, Small(), Seq({1, 2, 3, 4}), 2 * kBt, {.ttl = absl::Seconds(10)}).ok());
  ASSERT_TRUE(Append(*cache_, Small(), Seq({5, 6}), 0, {.ttl = absl::Seconds(20)}).ok());
  clock_.Advance(absl::Seconds(9));
  EXPECT_EQ(Matched(Small(), Seq({1, 2, 3, 4})), 4 * kBt);
  clock_.Advance(absl::Seconds(1));
  EXPECT_EQ(Matched(Small(), Seq({1, 2, 3, 4})), 2 * kBt);  // the untimed prefix stays
  EXPECT_EQ(Fetched(Small(), Seq({5, 6})), 2 * kBt);
  EXPECT_EQ(StatsOf(Small()).evicted_blocks, 2u);
  clock_.Advance(absl::Seconds(10));
  EXPECT_EQ(Fetched(Small(), Seq({5, 6})), 0u);
  EXPECT_EQ(StatsOf(Small()).blocks, 2u);
}

// ---- Stats and limits ---------------------------------------------------------

TEST_F(CacheTest, StatsArePerModel) {
  Register(Small());
  Register(Mid());
  ASSERT_TRUE(Append(*cache_, Small(), Seq({1, 2, 3})).ok());
  ASSERT_TRUE(Append(*cache_, Mid(), Seq({1})).ok());
  Matched(Small(), Seq({1, 2, 3, 4, 5}, 7));  // 3 blocks hit, 2 missed, the tail ignored
  Matched(Small(), Seq({9}));
  Matched(Mid(), Seq({1}));
  const ModelStats s = StatsOf(Small());
  EXPECT_EQ(s.layout, Small().layout);
  EXPECT_EQ(s.blocks, 3u);
  EXPECT_EQ(s.tokens, 3 * kBt);
  EXPECT_EQ(s.bytes, 3 * Small().layout.BlockBytes());
  EXPECT_EQ(s.hit_tokens, 3 * kBt);
  EXPECT_EQ(s.miss_tokens, 3 * kBt);
  EXPECT_EQ(s.appended_blocks, 3u);
  const ModelStats m = StatsOf(Mid());
  EXPECT_EQ(m.hit_tokens, kBt);
  EXPECT_EQ(m.miss_tokens, 0u);
  EXPECT_EQ(m.bytes, Mid().layout.BlockBytes());
  const CacheStats all = cache_->GetStats();
  EXPECT_EQ(all.blocks, 4u);
  EXPECT_EQ(all.payload_bytes, s.bytes + m.bytes);
  EXPECT_EQ(all.host_pool.allocated_bytes, s.bytes + m.bytes);  // both are power-of-two sizes
  EXPECT_EQ(all.host_pool.capacity_bytes, 4 * kSlab);
}

TEST_F(CacheTest, MaxTokensPerRequest) {
  MakeCache(4, {.max_tokens_per_request = 4 * kBt});
  Register(Small());
  const std::vector<Token> ok = Seq({1, 2, 3, 4});
  const std::vector<Token> too_many = Seq({1, 2, 3, 4}, 1);
  EXPECT_TRUE(Append(*cache_, Small(), ok).ok());
  EXPECT_EQ(CodeOf(cache_->Lookup(Small().key, too_many)), StatusCode::kInvalidArgument);
  EXPECT_EQ(CodeOf(cache_->PrepareFetch(Small().key, too_many)), StatusCode::kInvalidArgument);
  EXPECT_EQ(CodeOf(cache_->BeginAppend(Small().key, too_many, 0, {}, {})),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(CodeOf(cache_->EvictPrefix(Small().key, Seq({1, 2, 3, 4, 5}))),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(Matched(Small(), ok), 4 * kBt);
}

// ---- Randomized against a reference ---------------------------------------------

using Ids = std::vector<uint32_t>;

Ids Prefix(const Ids& ids, size_t k) { return Ids(ids.begin(), ids.begin() + k); }
bool StartsWith(const Ids& ids, const Ids& prefix) {
  return ids.size() >= prefix.size() && std::equal(prefix.begin(), prefix.end(), ids.begin());
}

// What one model should hold: every cached prefix (as block ids) and its
// expiry. Every prefix of a member is a member.
struct RefModel {
  bool registered = false;
  std::map<Ids, absl::Time> blocks;

  // Removes `prefix` and everything below it; returns how many blocks.
  uint64_t Erase(const Ids& prefix) {
    auto first = blocks.lower_bound(prefix);
    auto last = first;
    while (last != blocks.end() && StartsWith(last->first, prefix)) ++last;
    const auto n = static_cast<uint64_t>(std::distance(first, last));
    blocks.erase(first, last);
    return n;
  }
  // Cached blocks of `ids`; like any lookup, drops the first expired block's subtree.
  size_t Match(const Ids& ids, absl::Time now) {
    for (size_t k = 0; k < ids.size(); ++k) {
      auto it = blocks.find(Prefix(ids, k + 1));
      if (it == blocks.end()) return k;
      if (it->second <= now) {
        Erase(Prefix(ids, k + 1));
        return k;
      }
    }
    return ids.size();
  }
};

struct RefLease {
  size_t model;
  Ids ids;  // the leased blocks
  std::vector<Token> tokens;
  uint64_t id;
  absl::Time expires;
  bool released = false;
  bool broken = false;  // some leased block was explicitly evicted
};

class RandomizedCacheTest : public CacheTest {
 protected:
  // exact: capacity is large enough that nothing is evicted for space, so the
  // cache agrees with the reference exactly. Otherwise the reference is an
  // upper bound, hints carry no TTL, and live leases keep their blocks.
  void Run(bool exact, uint64_t seed, int ops);
};

void RandomizedCacheTest::Run(bool exact, uint64_t seed, int ops) {
  MakeCache(exact ? 128 : 3);
  const TestModel models[] = {Small(), Mid(), {{"tenant-b", "small"}, Small().layout, 55}};
  RefModel ref[3];
  std::vector<RefLease> leases;
  std::mt19937_64 rng(seed);
  auto random_ids = [&](size_t lo, size_t hi) {
    Ids ids(lo + rng() % (hi - lo + 1));
    for (auto& id : ids) id = 1 + rng() % 3;
    return ids;
  };
  auto expect_matched = [&](uint64_t matched_tokens, size_t ref_blocks) {
    if (exact) {
      EXPECT_EQ(matched_tokens, ref_blocks * kBt);
    } else {
      EXPECT_LE(matched_tokens, ref_blocks * kBt);
    }
  };
  for (int op = 0; op < ops && !HasFatalFailure(); ++op) {
    SCOPED_TRACE(::testing::Message() << "op " << op);
    const size_t mi = rng() % 3;
    const TestModel& m = models[mi];
    RefModel& r = ref[mi];
    const Ids ids = random_ids(1, 6);
    const std::vector<Token> tokens = Seq(ids, rng() % kBt);
    const absl::Time now = clock_.Now();
    const int kind = rng() % 100;
    if (kind < 4) {
      auto result = cache_->RegisterModel(m.key, m.layout);
      ASSERT_TRUE(result.ok()) << result.status();
      EXPECT_EQ(result->created, !r.registered);
      r.registered = true;
    } else if (!r.registered) {
      EXPECT_EQ(CodeOf(cache_->Lookup(m.key, tokens)), StatusCode::kNotFound);
      EXPECT_EQ(CodeOf(cache_->PrepareFetch(m.key, tokens)), StatusCode::kNotFound);
    } else if (kind < 40) {  // append from a random point of the cached prefix
      auto lookup = cache_->Lookup(m.key, tokens);
      ASSERT_TRUE(lookup.ok());
      expect_matched(lookup->matched_tokens, r.Match(ids, now));
      const size_t have = lookup->matched_tokens / kBt;
      if (have < ids.size() && rng() % 10 == 0) {
        EXPECT_EQ(CodeOf(Append(*cache_, m, tokens, (have + 1) * kBt)),
                  StatusCode::kFailedPrecondition);
        continue;
      }
      const size_t start = rng() % (have + 1);
      AppendHints hints{.priority = static_cast<int32_t>(rng() % 3)};
      if (exact && rng() % 3 == 0) hints.ttl = absl::Seconds(1 + rng() % 20);
      if (rng() % 20 == 0) {  // abandoned halfway
        const uint64_t before = Allocated();
        auto s = cache_->BeginAppend(m.key, tokens, start * kBt, hints, {});
        ASSERT_TRUE(s.ok()) << s.status();
        const std::vector<std::byte> kv = Kv(m, tokens, start, ids.size() - start);
        (void)WriteInChunks(**s, std::span(kv).first(kv.size() / 2));
        s->reset();
        EXPECT_LE(Allocated(), before);
        if (exact) EXPECT_EQ(Allocated(), before);
        continue;
      }
      auto result = Append(*cache_, m, tokens, start * kBt, hints, rng() % 2 == 0);
      if (!exact && CodeOf(result) == StatusCode::kResourceExhausted) continue;
      ASSERT_TRUE(result.ok()) << result.status();
      EXPECT_EQ(result->cached_tokens, ids.size() * kBt);
      const absl::Time expires =
          hints.ttl == absl::ZeroDuration() ? absl::InfiniteFuture() : now + hints.ttl;
      uint32_t stored = 0;
      for (size_t k = 1; k <= ids.size(); ++k)
        stored += r.blocks.emplace(Prefix(ids, k), expires).second;
      if (exact) {
        EXPECT_EQ(result->stored_blocks, stored);
        EXPECT_EQ(result->deduplicated_blocks, ids.size() - start - stored);
      }
    } else if (kind < 55) {  // lookup, perhaps leased
      const LeaseRequest lease{.acquire = rng() % 3 == 0, .ttl = absl::Seconds(1 + rng() % 20)};
      auto lookup = cache_->Lookup(m.key, tokens, lease);
      ASSERT_TRUE(lookup.ok());
      expect_matched(lookup->matched_tokens, r.Match(ids, now));
      for (const BlockInfo& b : lookup->blocks) {
        EXPECT_EQ(b.key, PrefixKey(tokens, b.index));
        EXPECT_EQ(b.checksum, Checksum(Pattern(m, tokens, b.index)));
      }
      if (lookup->lease_id != 0) {
        leases.push_back({.model = mi,
                          .ids = Prefix(ids, lookup->matched_tokens / kBt),
                          .tokens = tokens,
                          .id = lookup->lease_id,
                          .expires = lookup->lease_expires});
      }
    } else if (kind < 75) {  // fetch and verify
      auto plan = cache_->PrepareFetch(m.key, tokens);
      ASSERT_TRUE(plan.ok());
      expect_matched(plan->matched_tokens, r.Match(ids, now));
      EXPECT_TRUE(PlanHolds(*plan, m, tokens));
    } else if (kind < 83) {  // fetch or release a lease
      if (leases.empty()) continue;
      RefLease& l = leases[rng() % leases.size()];
      const bool live = !l.released && now < l.expires;
      if (rng() % 2 == 0) {
        EXPECT_EQ(cache_->ReleaseLease(l.id), live);
        l.released = true;
        continue;
      }
      auto plan = cache_->PrepareFetchLease(models[l.model].key, l.id);
      if (!live) {
        EXPECT_EQ(CodeOf(plan), StatusCode::kNotFound);
        continue;
      }
      ASSERT_TRUE(plan.ok()) << plan.status();
      EXPECT_EQ(plan->matched_tokens, l.ids.size() * kBt);
      EXPECT_TRUE(PlanHolds(*plan, models[l.model], l.tokens));  // even if evicted since
    } else if (kind < 92) {  // explicit eviction of a prefix, rarely of the model
      const bool whole = kind == 91;
      const Ids prefix = whole ? Ids{} : random_ids(1, 3);
      auto evicted = whole ? cache_->EvictModel(m.key) : cache_->EvictPrefix(m.key, Seq(prefix));
      ASSERT_TRUE(evicted.ok()) << evicted.status();
      EXPECT_EQ(evicted->evicted_bytes, evicted->evicted_blocks * m.layout.BlockBytes());
      const uint64_t expected = r.Erase(prefix);
      if (exact) {
        EXPECT_EQ(evicted->evicted_blocks, expected);
      } else {
        EXPECT_LE(evicted->evicted_blocks, expected);
      }
      for (RefLease& l : leases) l.broken |= l.model == mi && StartsWith(l.ids, prefix);
    } else {
      clock_.Advance(absl::Seconds(1 + rng() % 5));
    }
    if (exact) {
      ASSERT_EQ(StatsOf(m).blocks, r.blocks.size());
    } else if (op % 50 == 0) {  // capacity eviction never takes a leased block
      for (const RefLease& l : leases) {
        if (l.released || l.broken || clock_.Now() >= l.expires) continue;
        auto plan = cache_->PrepareFetch(models[l.model].key, l.tokens);
        ASSERT_TRUE(plan.ok());
        EXPECT_GE(plan->matched_tokens, l.ids.size() * kBt) << "lease " << l.id;
        EXPECT_TRUE(PlanHolds(*plan, models[l.model], l.tokens));
      }
    }
  }
  const CacheStats stats = cache_->GetStats();
  if (exact) EXPECT_EQ(stats.capacity_evictions, 0u);
  if (!exact) EXPECT_GT(stats.capacity_evictions, 0u);  // the run did exercise eviction
  EXPECT_LE(stats.host_pool.reserved_bytes, stats.host_pool.capacity_bytes);
}

TEST_F(RandomizedCacheTest, AgreesExactlyWhenNothingIsEvictedForSpace) { Run(true, 1, 4000); }
TEST_F(RandomizedCacheTest, StaysWithinReferenceUnderCapacityEviction) { Run(false, 2, 4000); }

// ---- Concurrency --------------------------------------------------------------

TEST_F(CacheTest, ConcurrentClientsOnlyEverSeeCorrectBytes) {
  MakeCache(2);  // 64 blocks of 2 KiB: far fewer than the sequences below need
  const TestModel m = Mid();
  Register(m);
  std::atomic<uint64_t> stored{0}, fetched{0}, failures{0};
  auto fail = [&](const std::string& what) {
    if (failures++ < 10) ADD_FAILURE() << what;
  };
  auto worker = [&](uint64_t seed) {
    std::mt19937_64 rng(seed);
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(2);
    while (std::chrono::steady_clock::now() < deadline) {
      Ids ids(1 + rng() % 8);
      for (auto& id : ids) id = 1 + rng() % 4;
      const std::vector<Token> tokens = Seq(ids, rng() % kBt);
      const int kind = rng() % 100;
      if (kind < 40) {
        auto lookup = cache_->Lookup(m.key, tokens);
        if (!lookup.ok()) return fail(lookup.status().ToString());
        const uint64_t start = rng() % (lookup->matched_tokens / kBt + 1) * kBt;
        auto r = Append(*cache_, m, tokens, start, {}, rng() % 2 == 0);
        if (r.ok()) {
          stored += r->stored_blocks;
          if (r->cached_tokens != ids.size() * kBt) fail("append cached_tokens");
        } else if (!absl::IsResourceExhausted(r.status()) && !absl::IsAborted(r.status()) &&
                   !absl::IsFailedPrecondition(r.status())) {
          fail(r.status().ToString());
        }
      } else if (kind < 60) {
        auto lookup = cache_->Lookup(m.key, tokens, {.acquire = true});
        if (!lookup.ok()) return fail(lookup.status().ToString());
        if (lookup->lease_id == 0) continue;
        auto plan = cache_->PrepareFetchLease(m.key, lookup->lease_id);
        if (!plan.ok() || plan->matched_tokens != lookup->matched_tokens) fail("lease fetch");
        if (plan.ok() && !PlanHolds(*plan, m, tokens)) fail("lease bytes");
        if (!cache_->ReleaseLease(lookup->lease_id)) fail("release");
      } else if (kind < 95) {
        auto plan = cache_->PrepareFetch(m.key, tokens);
        if (!plan.ok()) return fail(plan.status().ToString());
        if (auto held = PlanHolds(*plan, m, tokens); !held) fail(held.message());
        fetched += plan->blocks.size();
      } else {
        auto evicted = kind == 99
                           ? cache_->EvictModel(m.key)
                           : cache_->EvictPrefix(m.key, Seq(Prefix(ids, 1 + rng() % ids.size())));
        if (!evicted.ok()) fail(evicted.status().ToString());
      }
    }
  };
  std::vector<std::thread> threads;
  for (uint64_t t = 0; t < 8; ++t) threads.emplace_back(worker, 1000 + t);
  for (auto& t : threads) t.join();

  EXPECT_EQ(failures.load(), 0u);
  EXPECT_GT(stored.load(), 0u);
  EXPECT_GT(fetched.load(), 0u);
  const CacheStats stats = cache_->GetStats();
  EXPECT_GT(stats.capacity_evictions, 0u);
  EXPECT_EQ(stats.active_leases, 0u);
  // Nothing leaked: what the pool holds is exactly what the index holds.
  EXPECT_EQ(stats.payload_bytes, stats.blocks * m.layout.BlockBytes());
  EXPECT_EQ(stats.host_pool.allocated_bytes, stats.payload_bytes);
  EXPECT_EQ(stats.host_pool.live_allocations, stats.blocks);
  EXPECT_LE(stats.host_pool.reserved_bytes, stats.host_pool.capacity_bytes);
}

}  // namespace
}  // namespace kvcache
