// Unit tests for the Cache facade over a real SlabPool and a ManualClock.
//
// Every block's bytes are a pattern derived from (model salt, chained key of
// its token prefix, offset), so a byte written or served for the wrong prefix,
// the wrong model or the wrong offset is caught. Registration, append, fetch,
// leases and stats here; capacity, quotas, eviction and expiry in
// cache_eviction_test.cc.
#include <tuple>

#include "server/core/cache_test_util.h"

namespace kvcache {
namespace cache_test {
namespace {

TEST_F(CacheTest, RegisterIsIdempotentForTheSameLayout) {
  auto first = cache_->RegisterModel(Small().key, Small().layout);
  ASSERT_TRUE(first.ok()) << first.status();
  EXPECT_THAT(*first, FieldsAre(true, Small().layout));
  auto again = cache_->RegisterModel(Small().key, Small().layout);
  ASSERT_TRUE(again.ok());
  EXPECT_FALSE(again->created);
  EXPECT_EQ(CodeOf(cache_->RegisterModel(Small().key, Layout(16, DType::kFp16))), kAlreadyExists);
  // The same id in another namespace is another model.
  auto tenant = cache_->RegisterModel({"tenant-b", "small"}, Layout(16, DType::kFp16));
  ASSERT_TRUE(tenant.ok());
  EXPECT_TRUE(tenant->created);
  EXPECT_EQ(CacheInspector(cache_.get()).ListModels().size(), 2u);
  EXPECT_EQ(LayoutOf(Small().key), Small().layout);
  EXPECT_EQ(LayoutOf(kUnregistered), std::nullopt);
}

TEST_F(CacheTest, RegisterNamesTheBadField) {
  const std::pair<ModelKey, std::string> bad_ids[] = {
      {{"", "m"}, "namespace"},
      {{"bad ns", "m"}, "namespace"},
      {{"default", ""}, "model_id"},
      {{"default", "a?b"}, "model_id"},
      {{"default", std::string(129, 'a')}, "model_id"}};
  for (const auto& [key, field] : bad_ids) {
    auto r = cache_->RegisterModel(key, Small().layout);
    EXPECT_EQ(CodeOf(r), kInvalidArgument) << field;
    EXPECT_THAT(r.status().message(), HasSubstr(field));
  }
  const std::tuple<uint32_t ModelLayout::*, uint32_t, std::string> bad_fields[] = {
      {&ModelLayout::num_layers, 0, "num_layers"},
      {&ModelLayout::num_layers, 1025, "num_layers"},
      {&ModelLayout::num_kv_heads, 0, "num_kv_heads"},
      {&ModelLayout::head_dim, 0, "head_dim"},
      {&ModelLayout::head_dim, 4097, "head_dim"},
      {&ModelLayout::block_tokens, 8, "block_tokens"},
      {&ModelLayout::block_tokens, 24, "block_tokens"},
      {&ModelLayout::block_tokens, 2048, "block_tokens"}};
  for (const auto& [member, value, field] : bad_fields) {
    ModelLayout layout = Small().layout;
    layout.*member = value;
    auto r = cache_->RegisterModel(Small().key, layout);
    EXPECT_EQ(CodeOf(r), kInvalidArgument) << field << "=" << value;
    EXPECT_THAT(r.status().message(), HasSubstr(field));
  }
  ModelLayout bad_dtype = Small().layout;
  bad_dtype.dtype = static_cast<DType>(0);
  const absl::Status dtype_status = cache_->RegisterModel(Small().key, bad_dtype).status();
  EXPECT_THAT(dtype_status.message(), HasSubstr("dtype"));
  EXPECT_TRUE(CacheInspector(cache_.get()).ListModels().empty());
}

TEST_F(CacheTest, RegisterDefaultsBlockTokensAndChecksCapacity) {
  ModelLayout layout = Small().layout;
  layout.block_tokens = 0;
  auto r = cache_->RegisterModel(Small().key, layout);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->layout.block_tokens, kDefaultBlockTokens);
  layout.block_tokens = kDefaultBlockTokens;
  EXPECT_FALSE(cache_->RegisterModel(Small().key, layout).value_or(RegisterResult{}).created);

  // 512 KiB blocks cannot fit a 256 KiB tier; 128 KiB blocks can (a run of two slabs).
  EXPECT_EQ(CodeOf(cache_->RegisterModel({"default", "huge"}, Layout(4096, DType::kFp32))),
            kResourceExhausted);
  const TestModel large{{"default", "large"}, Layout(1024, DType::kFp32), 44};
  Register(large);
  ASSERT_TRUE(Append(*cache_, large, Seq({1})).ok());
  EXPECT_EQ(Fetched(large, Seq({1})), kBt);
}

TEST_F(CacheTest, RegisterStopsAtMaxModels) {
  MakeCache(4, {.max_models = 2});
  Register(Small());
  Register(Mid());
  EXPECT_EQ(CodeOf(cache_->RegisterModel(Big().key, Big().layout)), kResourceExhausted);
  EXPECT_TRUE(cache_->RegisterModel(Small().key, Small().layout).ok());  // still idempotent
}

// ---- Append and fetch ----------------------------------------------------------

TEST_F(CacheTest, AppendLookupFetchRoundTripIsByteExact) {
  for (const TestModel& m : {Small(), Big()}) {
    SCOPED_TRACE(m.key.ToString());
    Register(m);
    const std::vector<Token> tokens = Seq({1, 2, 3, 4, 5}, 7);
    EXPECT_EQ(Matched(m, tokens), 0u);
    auto result = Append(*cache_, m, tokens, 0, {}, /*checksums=*/true);
    ASSERT_TRUE(result.ok()) << result.status();
    EXPECT_THAT(CountsOf(*result), FieldsAre(5u, 0u, 5 * m.layout.BlockBytes(), 5 * kBt));

    auto lookup = cache_->Lookup(m.key, tokens);
    ASSERT_TRUE(lookup.ok());
    EXPECT_EQ(lookup->matched_tokens, 5 * kBt);
    EXPECT_EQ(lookup->lease_id, 0u);
    ASSERT_EQ(lookup->blocks.size(), 5u);
    for (uint32_t b = 0; b < 5; ++b) {
      EXPECT_THAT(IdentityOf(lookup->blocks[b]),
                  FieldsAre(b, PrefixKey(tokens, b), Checksum(Pattern(m, tokens, b)),
                            m.layout.BlockBytes()));
    }
    EXPECT_EQ(Fetched(m, tokens), 5 * kBt);
    EXPECT_EQ(Fetched(m, std::span(tokens).first(3 * kBt - 1)), 2 * kBt);  // whole blocks only
    EXPECT_EQ(Fetched(m, {}), 0u);
  }
}

TEST_F(CacheTest, AnAppendBegunBeforeTheModelWasRegisteredAnewDoesNotCommit) {
  // Unregister then Register with the same layout: a new incarnation whose
  // state may sit at the old one's address. An append the old one began
  // must not land in it.
  for (int round = 0; round < 8; ++round) {
    SCOPED_TRACE(round);
    Register(Small());
    const std::vector<Token> tokens = Seq({1, 2, 3}, round);
    auto session = cache_->BeginAppend(Small().key, tokens, 0, {}, {});
    ASSERT_TRUE(session.ok()) << session.status();
    ASSERT_TRUE(cache_->UnregisterModel(Small().key).ok());
    Register(Small());
    ASSERT_TRUE(WriteInChunks(**session, Kv(Small(), tokens, 0, 3)).ok());
    EXPECT_EQ(CodeOf((*session)->Commit()), absl::StatusCode::kAborted);
    EXPECT_EQ(Matched(Small(), tokens), 0u);
    ASSERT_TRUE(cache_->UnregisterModel(Small().key).ok());
  }
}

TEST_F(CacheTest, AppendsExtendAndOverlapACachedPrefix) {
  Register(Small());
  ASSERT_TRUE(Append(*cache_, Small(), Seq({1, 2})).ok());
  auto extend = Append(*cache_, Small(), Seq({1, 2, 3, 4, 5}), 2 * kBt);
  ASSERT_TRUE(extend.ok()) << extend.status();
  EXPECT_THAT(CountsOf(*extend), FieldsAre(3u, 0u, 3 * 512u, 5 * kBt));
  auto overlap = Append(*cache_, Small(), Seq({1, 2, 3, 4, 5, 6}, 3), kBt);
  ASSERT_TRUE(overlap.ok()) << overlap.status();
  EXPECT_THAT(CountsOf(*overlap), FieldsAre(1u, 4u, 512u, 6 * kBt));
  EXPECT_EQ(Fetched(Small(), Seq({1, 2, 3, 4, 5, 6})), 6 * kBt);
  // start_token at the end of a cached sequence carries no blocks.
  auto empty = Append(*cache_, Small(), Seq({1, 2}, 5), 2 * kBt);
  ASSERT_TRUE(empty.ok()) << empty.status();
  EXPECT_THAT(CountsOf(*empty), FieldsAre(0u, 0u, 0u, 2 * kBt));
}

TEST_F(CacheTest, DuplicateBlocksAreStoredOnce) {
  Register(Small());
  const std::vector<Token> a = Seq({1, 2, 3, 4});
  ASSERT_TRUE(Append(*cache_, Small(), a).ok());
  const uint64_t allocated = Allocated();
  auto again = Append(*cache_, Small(), a);
  ASSERT_TRUE(again.ok());
  EXPECT_THAT(CountsOf(*again), FieldsAre(0u, 4u, 0u, 4 * kBt));
  EXPECT_EQ(Allocated(), allocated);

  const std::vector<Token> b = Seq({1, 2, 7, 8});  // shares two blocks with a
  auto shared = Append(*cache_, Small(), b);
  ASSERT_TRUE(shared.ok());
  EXPECT_THAT(CountsOf(*shared), FieldsAre(2u, 2u, 2 * 512u, 4 * kBt));
  const ModelStats stats = StatsOf(Small());
  EXPECT_EQ(stats.blocks, 6u);
  EXPECT_EQ(stats.bytes, 6 * 512u);
  EXPECT_EQ(stats.appended_blocks, 6u);
  EXPECT_EQ(stats.deduplicated_blocks, 6u);
  EXPECT_EQ(Fetched(Small(), a), 4 * kBt);
  EXPECT_EQ(Fetched(Small(), b), 4 * kBt);
}

TEST_F(CacheTest, BeginAppendValidatesTheRequest) {
  const TestModel m = Small();
  Register(m);
  ASSERT_TRUE(Append(*cache_, m, Seq({1})).ok());
  auto begin = [&](std::vector<Token> tokens, uint64_t start, AppendHints hints = {},
                   std::vector<uint64_t> sums = {}) {
    return cache_->BeginAppend(m.key, std::move(tokens), start, hints, std::move(sums)).status();
  };
  absl::Status gap = begin(Seq({1, 2, 3}), 2 * kBt);
  EXPECT_EQ(gap.code(), kFailedPrecondition);
  EXPECT_THAT(gap.message(), HasSubstr("resend from token 16"));
  EXPECT_EQ(begin(Seq({1, 2}), 5).code(), kInvalidArgument);        // not aligned
  EXPECT_EQ(begin(Seq({1, 2}), 3 * kBt).code(), kInvalidArgument);  // past the end
  EXPECT_EQ(begin(Seq({1, 2}), 0, {}, {1, 2, 3}).code(), kInvalidArgument);
  EXPECT_EQ(begin(Seq({1, 2}), 0, {.ttl = absl::Seconds(-1)}).code(), kInvalidArgument);
  EXPECT_EQ(CodeOf(cache_->BeginAppend(kUnregistered, Seq({1}), 0, {}, {})), kNotFound);
  EXPECT_EQ(Matched(m, Seq({1, 2, 3})), kBt);
}

// Every way an append can go wrong leaves the cache and the pool as they were.
TEST_F(CacheTest, FailedOrAbandonedAppendsStoreNothing) {
  const TestModel m = Small();
  Register(m);
  ASSERT_TRUE(Append(*cache_, m, Seq({1, 2})).ok());
  const std::vector<Token> tokens = Seq({1, 2, 3, 4, 5});
  const std::vector<std::byte> kv = Kv(m, tokens, 2, 3);
  std::vector<uint64_t> bad_sums = Checksums(m, tokens, 2);
  bad_sums[1] ^= 1;  // block 2 is fine, block 3 is not
  const std::byte one[1] = {};
  const uint64_t before = Allocated();
  const struct {
    const char* what;
    std::vector<uint64_t> sums;
    size_t write;  // bytes of kv to write
    bool extra_byte, commit, evict_prefix;
    absl::StatusCode code;
  } cases[] = {
      {"too few bytes", {}, kv.size() - 100, false, true, false, kInvalidArgument},
      {"too many bytes", {}, kv.size(), true, true, false, kInvalidArgument},
      {"checksum mismatch", bad_sums, kv.size(), false, true, false, kDataLoss},
      {"abandoned halfway", {}, 512 + 100, false, false, false, kOk},
      {"abandoned complete", {}, kv.size(), false, false, false, kOk},
      {"prefix evicted meanwhile", {}, kv.size(), false, true, true, kAborted},  // last
  };
  for (const auto& c : cases) {
    SCOPED_TRACE(c.what);
    auto s = cache_->BeginAppend(m.key, tokens, 2 * kBt, {}, c.sums);
    ASSERT_TRUE(s.ok());
    absl::Status written = WriteInChunks(**s, std::span(kv).first(c.write));
    if (c.extra_byte) {
      EXPECT_EQ((*s)->Write(one).code(), kInvalidArgument);
      EXPECT_EQ((*s)->Write(one).code(), kInvalidArgument);  // the session stays dead
    }
    EXPECT_EQ(written.code(), c.code == kDataLoss ? kDataLoss : kOk);
    if (c.evict_prefix) {
      ASSERT_TRUE(cache_->EvictPrefix(m.key, Seq({1})).ok());
    }
    if (c.commit) {
      EXPECT_EQ(CodeOf((*s)->Commit()), c.code);
    } else {
      EXPECT_GT(Allocated(), before);
    }
    s->reset();
    EXPECT_EQ(Matched(m, tokens), c.evict_prefix ? 0 : 2 * kBt);
    EXPECT_EQ(StatsOf(m).appended_blocks, 2u);
    if (c.evict_prefix) {  // the last case: put the prefix back to compare memory
      ASSERT_TRUE(Append(*cache_, m, Seq({1, 2})).ok());
    }
    EXPECT_EQ(Allocated(), before);
  }
}

// ---- Leases ------------------------------------------------------------------------

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
  auto plan = cache_->PrepareFetch(Small().key, {.lease_id = r->lease_id});
  ASSERT_TRUE(plan.ok());
  EXPECT_EQ(plan->matched_tokens, 2 * kBt);
  EXPECT_TRUE(PlanHolds(*plan, Small(), tokens));
  EXPECT_EQ(CodeOf(cache_->PrepareFetch(Mid().key, {.lease_id = r->lease_id})), kInvalidArgument);
  EXPECT_EQ(CodeOf(cache_->PrepareFetch(Small().key, {.lease_id = r->lease_id + 1})), kNotFound);
  EXPECT_EQ(CodeOf(cache_->PrepareFetch(kUnregistered, {.lease_id = r->lease_id})), kNotFound);

  const absl::Duration max_ttl = CacheOptions{}.max_lease_ttl;
  for (absl::Duration bad : {max_ttl + absl::Milliseconds(1), absl::Seconds(-1)}) {
    EXPECT_EQ(CodeOf(cache_->Lookup(Small().key, tokens, {.acquire = true, .ttl = bad})),
              kInvalidArgument);
  }
  auto longest = cache_->Lookup(Small().key, tokens, {.acquire = true, .ttl = max_ttl});
  ASSERT_TRUE(longest.ok()) << longest.status();
  EXPECT_EQ(longest->lease_expires, clock_.Now() + max_ttl);
  EXPECT_TRUE(cache_->ReleaseLease(r->lease_id));
  EXPECT_FALSE(cache_->ReleaseLease(r->lease_id));
  EXPECT_EQ(CodeOf(cache_->PrepareFetch(Small().key, {.lease_id = r->lease_id})), kNotFound);
  EXPECT_EQ(cache_->GetStats().active_leases, 1u);
}

// ---- Stats and limits ---------------------------------------------------------------

TEST_F(CacheTest, StatsArePerModel) {
  Register(Small());
  Register(Mid());
  ASSERT_TRUE(Append(*cache_, Small(), Seq({1, 2, 3})).ok());
  ASSERT_TRUE(Append(*cache_, Small(), Seq({1})).ok());  // deduplicated
  ASSERT_TRUE(Append(*cache_, Mid(), Seq({1})).ok());
  Matched(Small(), Seq({1, 2, 3, 4, 5}, 7));  // 3 blocks hit, 2 missed, the tail ignored
  Matched(Small(), Seq({9}));
  Matched(Mid(), Seq({1}));
  ASSERT_TRUE(cache_->EvictPrefix(Small().key, Seq({1, 2, 3})).ok());
  // model, layout, blocks, tokens, bytes, hit/miss tokens, appended/dedup/evicted blocks
  auto counters = [](const ModelStats& m) {
    return std::make_tuple(m.model, m.layout, m.blocks, m.tokens, m.bytes, m.hit_tokens,
                           m.miss_tokens, m.appended_blocks, m.deduplicated_blocks,
                           m.evicted_blocks);
  };
  EXPECT_THAT(counters(StatsOf(Small())), FieldsAre(Small().key, Small().layout, 2u, 2 * kBt,
                                                    2 * 512u, 3 * kBt, 3 * kBt, 3u, 1u, 1u));
  EXPECT_THAT(counters(StatsOf(Mid())),
              FieldsAre(Mid().key, Mid().layout, 1u, kBt, 2048u, kBt, 0u, 1u, 0u, 0u));
  const CacheStats all = cache_->GetStats();
  EXPECT_EQ(all.blocks, 3u);
  EXPECT_EQ(all.payload_bytes, 2 * 512u + 2048u);
  EXPECT_EQ(all.host_pool.allocated_bytes, all.payload_bytes);  // power-of-two block sizes
  EXPECT_EQ(all.host_pool.capacity_bytes, 4 * kSlab);
}

TEST_F(CacheTest, MaxTokensPerRequest) {
  MakeCache(4, {.max_tokens_per_request = 4 * kBt});
  Register(Small());
  const std::vector<Token> ok = Seq({1, 2, 3, 4});
  const std::vector<Token> too_many = Seq({1, 2, 3, 4}, 1);
  EXPECT_TRUE(Append(*cache_, Small(), ok).ok());
  EXPECT_EQ(CodeOf(cache_->Lookup(Small().key, too_many)), kInvalidArgument);
  EXPECT_EQ(CodeOf(cache_->PrepareFetch(Small().key, {.tokens = too_many})), kInvalidArgument);
  EXPECT_EQ(CodeOf(cache_->BeginAppend(Small().key, too_many, 0, {}, {})), kInvalidArgument);
  EXPECT_EQ(CodeOf(cache_->EvictPrefix(Small().key, Seq({1, 2, 3, 4, 5}))), kInvalidArgument);
  EXPECT_EQ(Matched(Small(), ok), 4 * kBt);
}
}  // namespace
}  // namespace cache_test
}  // namespace kvcache
