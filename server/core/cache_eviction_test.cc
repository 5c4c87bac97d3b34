// Unit tests for the Cache's eviction: capacity and quotas, pinning, explicit eviction, expiry.
//
// The same fixture and byte patterns as cache_test.cc (cache_test_util.h):
// each block's bytes derive from (model salt, chained key, offset), so a
// block served for the wrong prefix or model after an eviction is caught.
#include "server/core/cache_inspector.h"
#include "server/core/cache_test_util.h"
#include "server/core/eviction_policy.h"
#include "server/core/touch_buffer.h"

namespace kvcache {
namespace cache_test {
namespace {

// ---- Capacity: 2 slabs of 8 KiB blocks hold 16 blocks ---------------------------

class CapacityTest : public CacheTest {
 protected:
  void SetUp() override {
    MakeCache(2);
    Register(Big());
    for (uint32_t s = 0; s < 4; ++s) {  // four sequences of four blocks fill it
      seqs_.push_back(Seq({10 * s + 1, 10 * s + 2, 10 * s + 3, 10 * s + 4}));
      ASSERT_TRUE(Append(*cache_, Big(), seqs_.back()).ok());
    }
    ASSERT_EQ(cache_->GetStats().blocks, 16u);
  }
  static std::vector<Token> NewSeq(uint32_t id, uint32_t blocks) {
    Ids ids;
    for (uint32_t b = 0; b < blocks; ++b) ids.push_back(id + b);
    return Seq(ids);
  }
  absl::StatusCode AppendNew(uint32_t id, uint32_t blocks) {
    return Append(*cache_, Big(), NewSeq(id, blocks)).status().code();
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
  ASSERT_EQ(AppendNew(100, 2), kOk);
  EXPECT_EQ(cache_->GetStats().capacity_evictions, 2u);
  EXPECT_EQ(StatsOf(Big()).evicted_blocks, 2u);
  // seqs_[1] lost its leaf, then its parent. The order of these fetches is the new recency.
  EXPECT_EQ(Fetched(Big(), seqs_[0]), 4 * kBt);
  EXPECT_EQ(Fetched(Big(), seqs_[2]), 4 * kBt);
  EXPECT_EQ(Fetched(Big(), seqs_[3]), 4 * kBt);
  EXPECT_EQ(Fetched(Big(), NewSeq(100, 2)), 2 * kBt);
  EXPECT_EQ(Fetched(Big(), seqs_[1]), 2 * kBt);
  ASSERT_EQ(AppendNew(200, 5), kOk);  // all of seqs_[0], then seqs_[2]'s leaf
  EXPECT_EQ(Matched(Big(), seqs_[0]), 0u);
  EXPECT_EQ(Matched(Big(), seqs_[2]), 3 * kBt);
  EXPECT_EQ(Matched(Big(), seqs_[3]), 4 * kBt);
  EXPECT_EQ(Matched(Big(), seqs_[1]), 2 * kBt);
  EXPECT_EQ(Fetched(Big(), NewSeq(200, 5)), 5 * kBt);
}

// Each model's blocks have a policy of their own; the cache evicts the
// coldest block of all the models (CapacityArbiter), also within one batch
// of evictions.
TEST_F(CacheTest, EvictsTheColdestBlocksOfAllTheModelsInOrder) {
  MakeCache(2);  // 16 blocks of 8 KiB
  const TestModel other{{"default", "big2"}, Big().layout, 44};
  Register(Big());
  Register(other);
  // Eight sequences of two blocks, alternating between the models; then
  // used again in another order: 1, 3 (other), 0, 2 (big) are the coldest.
  std::vector<std::vector<Token>> seqs;
  for (uint32_t s = 0; s < 8; ++s) {
    seqs.push_back(Seq({10 * s + 1, 10 * s + 2}));
    ASSERT_TRUE(Append(*cache_, s % 2 == 0 ? Big() : other, seqs.back()).ok());
  }
  auto model_of = [&](int s) { return s % 2 == 0 ? Big() : other; };
  for (int s : {1, 3, 0, 2, 5, 4, 7, 6}) Matched(model_of(s), seqs[s]);
  // Six new blocks: the leaves and parents of seqs 1, 3 and 0, in that order.
  ASSERT_TRUE(Append(*cache_, Big(), Seq({901, 902, 903, 904, 905, 906})).ok());
  for (int s : {1, 3, 0}) EXPECT_EQ(Matched(model_of(s), seqs[s]), 0u) << "seq " << s;
  for (int s : {2, 4, 5, 6, 7}) EXPECT_EQ(Fetched(model_of(s), seqs[s]), 2 * kBt) << "seq " << s;
  EXPECT_EQ(StatsOf(Big()).evicted_blocks, 2u);
  EXPECT_EQ(StatsOf(other).evicted_blocks, 4u);
}

// Evictions in batches (several blocks per exclusive section, the
// arbiter keeping each model's victim between picks) still take the
// coldest of all: what is left of sequences appended in turn to two models
// is always the newest ones.
TEST_F(CacheTest, BatchesOfEvictionsAcrossModelsKeepTheNewestBlocks) {
  pool_thread_cache_bytes_ = 0;
  MakeCache(16);  // 2,048 blocks of 512 B; a batch frees up to 4 KiB (8 blocks)
  const TestModel other{{"default", "small2"}, Small().layout, 55};
  Register(Small());
  Register(other);
  constexpr uint32_t kSeqs = 3000;
  auto model_of = [&](uint32_t s) { return s % 2 == 0 ? Small() : other; };
  for (uint32_t s = 0; s < kSeqs; ++s) {
    ASSERT_TRUE(Append(*cache_, model_of(s), Seq({s + 1})).ok()) << s;
  }
  EXPECT_GE(cache_->GetStats().capacity_evictions, kSeqs - 2048);
  uint32_t first_kept = kSeqs;
  for (uint32_t s = 0; s < kSeqs; ++s) {
    const bool kept = Matched(model_of(s), Seq({s + 1})) == kBt;
    if (kept && first_kept == kSeqs) first_kept = s;
    if (first_kept != kSeqs) {
      ASSERT_TRUE(kept) << "seq " << s << " evicted, " << first_kept << " kept";
    }
  }
  EXPECT_GT(first_kept, kSeqs - 2048 - 1);
  EXPECT_LT(first_kept, kSeqs - 1024);
}

// The same cache with LRU-K (K = 2, the defaults): a sequence used again a
// minute after its append outlives newer sequences used once, where LRU
// would evict it first.
TEST_F(CacheTest, LruKKeepsASequenceUsedTwice) {
  MakeCache(2, {}, NewLruKPolicy(LruKOptions{}, &clock_));
  Register(Big());
  std::vector<std::vector<Token>> seqs;
  for (uint32_t s = 0; s < 4; ++s)
    seqs.push_back(Seq({10 * s + 1, 10 * s + 2, 10 * s + 3, 10 * s + 4}));
  ASSERT_TRUE(Append(*cache_, Big(), seqs[0]).ok());
  clock_.Advance(absl::Minutes(1));
  EXPECT_EQ(Matched(Big(), seqs[0]), 4 * kBt);  // its second reference
  clock_.Advance(absl::Minutes(1));
  for (uint32_t s = 1; s < 4; ++s) ASSERT_TRUE(Append(*cache_, Big(), seqs[s]).ok());
  ASSERT_EQ(cache_->GetStats().blocks, 16u);  // full
  clock_.Advance(absl::Minutes(1));
  ASSERT_TRUE(Append(*cache_, Big(), Seq({100, 101})).ok());
  EXPECT_EQ(cache_->GetStats().capacity_evictions, 2u);
  EXPECT_EQ(Matched(Big(), seqs[0]), 4 * kBt);  // LRU's coldest, kept
  EXPECT_EQ(Matched(Big(), seqs[1]), 2 * kBt);  // used once, the least recently: its leaves went
  EXPECT_EQ(Matched(Big(), seqs[2]), 4 * kBt);
  EXPECT_EQ(Matched(Big(), seqs[3]), 4 * kBt);
}

TEST_F(CapacityTest, LeasedBlocksAreNeverEvicted) {
  const uint64_t l0 = Lease(seqs_[0]);
  Lease(seqs_[1]);
  for (int s : {2, 3}) Matched(Big(), seqs_[s]);  // the leased sequences are the coldest
  ASSERT_EQ(AppendNew(100, 8), kOk);              // so this takes seqs_[2] and seqs_[3]
  EXPECT_EQ(Fetched(Big(), seqs_[0]), 4 * kBt);
  EXPECT_EQ(Fetched(Big(), seqs_[1]), 4 * kBt);
  EXPECT_EQ(Matched(Big(), seqs_[2]) + Matched(Big(), seqs_[3]), 0u);
  EXPECT_TRUE(cache_->ReleaseLease(l0));
  EXPECT_FALSE(cache_->ReleaseLease(l0));
  EXPECT_EQ(Matched(Big(), NewSeq(100, 8)), 8 * kBt);
  ASSERT_EQ(AppendNew(200, 1), kOk);  // seqs_[0] is the coldest and no longer leased
  EXPECT_EQ(Matched(Big(), seqs_[0]), 3 * kBt);
  EXPECT_EQ(Fetched(Big(), seqs_[1]), 4 * kBt);
}

TEST_F(CapacityTest, ALeaseIsReleasedOnlyWhereItsModelIsAllowed) {
  const uint64_t id = Lease(seqs_[0]);
  ModelKey seen;
  EXPECT_FALSE(cache_->ReleaseLease(id, [&](const ModelKey& m) {
    seen = m;
    return false;
  }));
  EXPECT_EQ(seen, Big().key);
  EXPECT_FALSE(cache_->ReleaseLease(id + 1, [](const ModelKey&) { return true; }));
  EXPECT_TRUE(cache_->ReleaseLease(id, [](const ModelKey& m) { return m == Big().key; }));
  EXPECT_FALSE(cache_->ReleaseLease(id));
}

// Two tenants' namespaces, each with room for 4 of Big()'s 8 KiB blocks; the
// pool holds 16, so only the quota makes a tenant evict.
class NamespaceQuotaTest : public CacheTest {
 protected:
  void SetUp() override {
    MakeCache(2, {.max_namespace_bytes = 4 * Big().layout.BlockBytes()});
    for (const TestModel& m : {a_, b_}) Register(m);
  }
  TestModel a_{{"tenant-a", "big"}, Big().layout, 33};
  TestModel b_{{"tenant-b", "big"}, Big().layout, 44};
};

TEST_F(NamespaceQuotaTest, ANamespaceAtItsQuotaEvictsOnlyItsOwnColdestBlocks) {
  const std::vector<Token> b_seq = Seq({1, 2, 3, 4});
  ASSERT_TRUE(Append(*cache_, b_, b_seq).ok());
  const std::vector<Token> a_old = Seq({11, 12}), a_new = Seq({21, 22});
  ASSERT_TRUE(Append(*cache_, a_, a_old).ok());
  ASSERT_TRUE(Append(*cache_, a_, a_new).ok());
  Matched(b_, b_seq);  // b's blocks are now the most recently used
  ASSERT_TRUE(Append(*cache_, a_, Seq({31, 32, 33})).ok());
  // a stayed at 4 blocks by evicting its own coldest, a_old, then a_new's leaf.
  EXPECT_EQ(StatsOf(a_).blocks, 4u);
  EXPECT_EQ(Matched(a_, a_old), 0u);
  EXPECT_EQ(Matched(a_, a_new), kBt);
  EXPECT_EQ(cache_->GetStats().quota_evictions, 3u);
  EXPECT_EQ(cache_->GetStats().capacity_evictions, 0u);
  EXPECT_EQ(Fetched(b_, b_seq), 4 * kBt);  // untouched, though it was the coldest
}

TEST_F(NamespaceQuotaTest, AnAppendPastAQuotaOfLeasedBlocksIsRefusedAndChangesNothing) {
  const std::vector<Token> a_seq = Seq({11, 12, 13, 14});
  ASSERT_TRUE(Append(*cache_, a_, a_seq).ok());
  auto lease = cache_->Lookup(a_.key, a_seq, {.acquire = true});
  ASSERT_TRUE(lease.ok() && lease->lease_id != 0);
  auto refused = Append(*cache_, a_, Seq({21}));
  EXPECT_EQ(refused.status().code(), kResourceExhausted);
  EXPECT_THAT(refused.status().message(), HasSubstr("namespace \"tenant-a\" is at its quota"));
  EXPECT_EQ(Fetched(a_, a_seq), 4 * kBt);
  // Another namespace is not held back by a's quota.
  EXPECT_TRUE(Append(*cache_, b_, Seq({31, 32, 33, 34})).ok());
  // Once the lease is gone, a makes room of its own again.
  ASSERT_TRUE(cache_->ReleaseLease(lease->lease_id));
  EXPECT_TRUE(Append(*cache_, a_, Seq({21})).ok());
  EXPECT_EQ(StatsOf(a_).blocks, 4u);
}

TEST_F(CacheTest, ANamespacePastItsMetadataShareEvictsOnlyItsOwnBlocks) {
  const TestModel a{{"tenant-a", "big"}, Big().layout, 33};
  const TestModel b{{"tenant-b", "big"}, Big().layout, 44};
  // What one block's metadata costs, measured on a cache without budgets.
  MakeCache(16);
  Register(a);
  ASSERT_TRUE(Append(*cache_, a, Seq({1})).ok());
  const uint64_t per_block = cache_->GetStats().metadata_bytes;
  // A budget of 8.5 blocks' metadata, each namespace's share half of it.
  MakeCache(16, {.max_metadata_bytes = 8 * per_block + per_block / 2, .namespace_share = 0.5});
  for (const TestModel& m : {a, b}) Register(m);
  const std::vector<Token> theirs = Seq({1, 2, 3});
  ASSERT_TRUE(Append(*cache_, b, theirs).ok());  // b's blocks are the coldest from here on
  for (uint32_t id = 10; id < 20; ++id) ASSERT_TRUE(Append(*cache_, a, Seq({id})).ok());
  // a kept 4 blocks (4.25 blocks' metadata) by evicting its own oldest six.
  EXPECT_EQ(StatsOf(a).blocks, 4u);
  EXPECT_EQ(Matched(a, Seq({15})), 0u);
  EXPECT_EQ(Matched(a, Seq({19})), kBt);
  const CacheStats stats = cache_->GetStats();
  EXPECT_EQ(stats.namespace_metadata_evictions, 6u);
  EXPECT_EQ(stats.metadata_evictions, 6u);
  EXPECT_EQ(Fetched(b, theirs), 3 * kBt);  // untouched, though they were the coldest
}

TEST_F(CacheTest, RegistrationsAndLeasesPastANamespacesShareAreRefused) {
  MakeCache(16, {.max_models = 4, .max_leases = 4, .namespace_share = 0.5});
  const TestModel a1{{"tenant-a", "1"}, Big().layout, 33};
  const TestModel a2{{"tenant-a", "2"}, Big().layout, 34};
  const TestModel b1{{"tenant-b", "1"}, Big().layout, 44};
  Register(a1);
  Register(a2);
  auto third = cache_->RegisterModel({"tenant-a", "3"}, Big().layout);
  EXPECT_EQ(third.status().code(), kResourceExhausted);
  EXPECT_THAT(third.status().message(), HasSubstr("limits.max_models 4"));
  Register(b1);
  const std::vector<Token> seq = Seq({1});
  for (const TestModel& m : {a1, b1}) ASSERT_TRUE(Append(*cache_, m, seq).ok());
  for (int i = 0; i < 2; ++i) {
    auto leased = cache_->Lookup(a1.key, seq, {.acquire = true});
    ASSERT_TRUE(leased.ok()) << leased.status();
  }
  auto refused = cache_->Lookup(a1.key, seq, {.acquire = true});
  EXPECT_EQ(refused.status().code(), kResourceExhausted);
  EXPECT_THAT(refused.status().message(), HasSubstr("limits.max_leases 4"));
  for (int i = 0; i < 2; ++i) {
    auto leased = cache_->Lookup(b1.key, seq, {.acquire = true});
    ASSERT_TRUE(leased.ok()) << leased.status();
  }
}

TEST_F(CapacityTest, AppendFailsWhenEverythingIsLeased) {
  std::vector<uint64_t> leases;
  for (const auto& s : seqs_) leases.push_back(Lease(s));
  const uint64_t allocated = Allocated();
  EXPECT_EQ(AppendNew(100, 1), kResourceExhausted);
  EXPECT_EQ(cache_->GetStats().rejected_appends, 1u);
  EXPECT_EQ(cache_->GetStats().capacity_evictions, 0u);
  EXPECT_EQ(Allocated(), allocated);
  for (const auto& s : seqs_) EXPECT_EQ(Fetched(Big(), s), 4 * kBt);  // untouched
  EXPECT_EQ(Matched(Big(), NewSeq(100, 1)), 0u);
  EXPECT_TRUE(cache_->ReleaseLease(leases[3]));
  ASSERT_EQ(AppendNew(100, 1), kOk);
  EXPECT_EQ(Fetched(Big(), seqs_[3]), 3 * kBt);
}

TEST_F(CapacityTest, FetchPlansPinTheirBlocks) {
  std::vector<FetchPlan> plans;
  for (const auto& s : seqs_) plans.push_back(*cache_->PrepareFetch(Big().key, {.tokens = s}));
  EXPECT_EQ(AppendNew(100, 1), kResourceExhausted);
  for (const auto& s : seqs_) EXPECT_EQ(Matched(Big(), s), 4 * kBt);  // none was dropped
  plans.pop_back();
  EXPECT_EQ(AppendNew(100, 1), kOk);
  for (size_t s = 0; s < plans.size(); ++s) EXPECT_TRUE(PlanHolds(plans[s], Big(), seqs_[s]));
}

TEST_F(CapacityTest, ExpiredLeasesStopPinning) {
  std::vector<uint64_t> leases;
  for (const auto& s : seqs_) leases.push_back(Lease(s, absl::Seconds(5)));
  EXPECT_EQ(AppendNew(100, 1), kResourceExhausted);
  clock_.Advance(absl::Seconds(4));
  EXPECT_EQ(AppendNew(100, 1), kResourceExhausted);
  clock_.Advance(absl::Seconds(1));
  EXPECT_EQ(AppendNew(100, 1), kOk);
  EXPECT_FALSE(cache_->ReleaseLease(leases[1]));
  EXPECT_EQ(CodeOf(cache_->PrepareFetch(Big().key, {.lease_id = leases[2]})), kNotFound);
  CacheAccess::Locked(CacheAccess(cache_.get())).ExpireLeases();
  EXPECT_EQ(cache_->GetStats().active_leases, 0u);
}

// ---- Explicit eviction and expiry ---------------------------------------------------

TEST_F(CacheTest, FetchPlansOutliveEviction) {
  Register(Small());
  const std::vector<Token> tokens = Seq({1, 2, 3, 4});
  for (bool whole_model : {false, true}) {
    ASSERT_TRUE(Append(*cache_, Small(), tokens).ok());
    const uint64_t allocated = Allocated();
    auto plan = cache_->PrepareFetch(Small().key, {.tokens = tokens});
    ASSERT_TRUE(plan.ok());
    auto evicted =
        whole_model ? cache_->EvictModel(Small().key) : cache_->EvictPrefix(Small().key, Seq({1}));
    ASSERT_TRUE(evicted.ok());
    EXPECT_THAT(*evicted, FieldsAre(4u, 4 * 512u));
    EXPECT_EQ(Matched(Small(), tokens), 0u);
    EXPECT_EQ(Allocated(), allocated);               // the plan still holds the memory...
    EXPECT_TRUE(PlanHolds(*plan, Small(), tokens));  // ...and the same bytes
    plan = FetchPlan{};
    EXPECT_EQ(Allocated(), 0u);
  }
}

TEST_F(CacheTest, EvictPrefixRemovesTheSubtree) {
  Register(Small());
  ASSERT_TRUE(Append(*cache_, Small(), Seq({1, 2, 3, 4})).ok());
  ASSERT_TRUE(Append(*cache_, Small(), Seq({1, 2, 5, 6})).ok());
  ASSERT_TRUE(Append(*cache_, Small(), Seq({1, 7})).ok());
  auto r = cache_->EvictPrefix(Small().key, Seq({1, 2}));
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_THAT(*r, FieldsAre(5u, 5 * 512u));
  EXPECT_EQ(Fetched(Small(), Seq({1, 2, 3, 4})), kBt);
  EXPECT_EQ(Fetched(Small(), Seq({1, 7})), 2 * kBt);
  const ModelStats stats = StatsOf(Small());
  EXPECT_EQ(stats.blocks, 2u);
  EXPECT_EQ(stats.bytes, 2 * 512u);
  EXPECT_EQ(stats.evicted_blocks, 5u);
  EXPECT_EQ(cache_->GetStats().payload_bytes, 2 * 512u);

  EXPECT_THAT(cache_->EvictPrefix(Small().key, Seq({1, 2})).value_or(EvictResult{9, 9}),
              FieldsAre(0u, 0u));  // not cached: nothing to do
  EXPECT_EQ(CodeOf(cache_->EvictPrefix(Small().key, Seq({1}, 3))), kInvalidArgument);
  EXPECT_EQ(CodeOf(cache_->EvictPrefix(Small().key, {})), kInvalidArgument);
  EXPECT_EQ(CodeOf(cache_->EvictPrefix(kUnregistered, Seq({1}))), kNotFound);
}

TEST_F(CacheTest, EvictModelEmptiesOnlyThatModel) {
  Register(Small());
  Register(Mid());
  ASSERT_TRUE(Append(*cache_, Small(), Seq({1, 2, 3})).ok());
  ASSERT_TRUE(Append(*cache_, Mid(), Seq({1, 2})).ok());
  auto r = cache_->EvictModel(Small().key);
  ASSERT_TRUE(r.ok());
  EXPECT_THAT(*r, FieldsAre(3u, 3 * 512u));
  EXPECT_EQ(StatsOf(Small()).blocks, 0u);
  EXPECT_EQ(StatsOf(Small()).bytes, 0u);
  EXPECT_EQ(Fetched(Mid(), Seq({1, 2})), 2 * kBt);
  EXPECT_TRUE(LayoutOf(Small().key).has_value());  // still registered
  ASSERT_TRUE(Append(*cache_, Small(), Seq({1, 2, 3})).ok());
  EXPECT_EQ(Fetched(Small(), Seq({1, 2, 3})), 3 * kBt);
  EXPECT_EQ(CodeOf(cache_->EvictModel(kUnregistered)), kNotFound);
}

TEST_F(CacheTest, UnregisterRemovesBlocksLeasesAndTheRegistration) {
  Register(Small());
  Register(Mid());
  const std::vector<Token> tokens = Seq({1, 2, 3});
  ASSERT_TRUE(Append(*cache_, Small(), tokens).ok());
  ASSERT_TRUE(Append(*cache_, Mid(), Seq({1, 2})).ok());
  auto leased = cache_->Lookup(Small().key, tokens, {.acquire = true});
  ASSERT_TRUE(leased.ok());
  auto plan = cache_->PrepareFetch(Small().key, {.tokens = tokens});  // a fetch already streaming
  ASSERT_TRUE(plan.ok());

  auto r = cache_->UnregisterModel(Small().key);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_THAT(*r, FieldsAre(3u, 3 * 512u, 1u));
  EXPECT_EQ(LayoutOf(Small().key), std::nullopt);
  EXPECT_EQ(CodeOf(cache_->Lookup(Small().key, tokens)), kNotFound);
  EXPECT_EQ(CodeOf(cache_->PrepareFetch(Small().key, {.lease_id = leased->lease_id})), kNotFound);
  EXPECT_FALSE(cache_->ReleaseLease(leased->lease_id));  // released with the model
  EXPECT_EQ(cache_->GetStats().active_leases, 0u);
  EXPECT_EQ(cache_->GetStats().payload_bytes, 2 * 2048u);  // Mid's blocks only
  EXPECT_TRUE(PlanHolds(*plan, Small(), tokens));          // the fetch keeps its bytes
  EXPECT_EQ(Fetched(Mid(), Seq({1, 2})), 2 * kBt);         // other models untouched
  EXPECT_EQ(CodeOf(cache_->UnregisterModel(Small().key)), kNotFound);
  EXPECT_EQ(CodeOf(cache_->UnregisterModel(kUnregistered)), kNotFound);
  plan = FetchPlan{};
  EXPECT_EQ(Allocated(), 2 * 2048u);

  // The id is free again, for another layout.
  const TestModel relaid{Small().key, Layout(16, DType::kFp32), 12};
  auto again = cache_->RegisterModel(relaid.key, relaid.layout);
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_TRUE(again->created);
  ASSERT_TRUE(Append(*cache_, relaid, tokens).ok());
  EXPECT_EQ(Fetched(relaid, tokens), 3 * kBt);
  EXPECT_EQ(StatsOf(relaid).blocks, 3u);
}

TEST_F(CacheTest, AnAppendAcrossUnregisterAndReregisterWithAnotherLayoutAborts) {
  Register(Small());
  const std::vector<Token> tokens = Seq({1, 2});
  auto session = cache_->BeginAppend(Small().key, tokens, 0, {}, {});
  ASSERT_TRUE(session.ok()) << session.status();
  ASSERT_TRUE(WriteInChunks(**session, Kv(Small(), tokens, 0, 2)).ok());
  ASSERT_TRUE(cache_->UnregisterModel(Small().key).ok());
  const TestModel relaid{Small().key, Layout(16, DType::kFp32), 12};
  Register(relaid);
  auto committed = (*session)->Commit();
  EXPECT_EQ(CodeOf(committed), kAborted);
  EXPECT_THAT(committed.status().message(), HasSubstr("another layout"));
  EXPECT_EQ(StatsOf(relaid).blocks, 0u);
  EXPECT_EQ(Matched(relaid, tokens), 0u);
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

// Freed blocks of small classes park in the pool's per-CPU caches, each
// keeping its span reserved; a bulk removal returns them, so a cache whose
// models are gone reserves nothing (what the host tier reports as used).
TEST_F(CacheTest, RemovingModelsLeavesNothingReservedInThePool) {
  Register(Small());
  Register(Mid());
  for (uint32_t s = 0; s < 8; ++s) {
    ASSERT_TRUE(Append(*cache_, Small(), Seq({100 * s + 1, 100 * s + 2, 100 * s + 3})).ok());
    ASSERT_TRUE(Append(*cache_, Mid(), Seq({100 * s + 5, 100 * s + 6})).ok());
  }
  ASSERT_GT(cache_->GetStats().host_pool.reserved_bytes, 0u);
  ASSERT_TRUE(cache_->EvictModel(Small().key).ok());
  ASSERT_TRUE(cache_->UnregisterModel(Mid().key).ok());
  const SlabPoolStats pool = cache_->GetStats().host_pool;
  EXPECT_EQ(pool.allocated_bytes, 0u);
  EXPECT_EQ(pool.cached_bytes, 0u);
  EXPECT_EQ(pool.reserved_bytes, 0u);
}

// A begin and a commit that only read the index share the cache's lock; one
// that meets an expired block takes it exclusively (only a writer removes
// the block). Either way the answers are the same as before the lock was
// shared: a deduplicating append whose blocks expired while it streamed
// aborts, and a begin past an expired prefix is refused.
TEST_F(CacheTest, AppendsThatMeetExpiredBlocksAnswerAsBefore) {
  Register(Small());
  const std::vector<Token> seq = Seq({1, 2, 3});
  ASSERT_TRUE(Append(*cache_, Small(), seq, 0, {.ttl = absl::Seconds(10)}).ok());
  auto again = cache_->BeginAppend(Small().key, seq, 0, {}, {});
  ASSERT_TRUE(again.ok()) << again.status();
  ASSERT_TRUE(WriteInChunks(**again, Kv(Small(), seq, 0, 3)).ok());
  clock_.Advance(absl::Seconds(10));
  auto committed = (*again)->Commit();
  EXPECT_EQ(committed.status().code(), absl::StatusCode::kAborted) << committed.status();
  EXPECT_EQ(StatsOf(Small()).blocks, 0u);  // the exclusive retry removed them
  EXPECT_EQ(StatsOf(Small()).deduplicated_blocks, 0u);

  ASSERT_TRUE(Append(*cache_, Small(), seq, 0, {.ttl = absl::Seconds(10)}).ok());
  clock_.Advance(absl::Seconds(10));
  auto past = cache_->BeginAppend(Small().key, seq, 2 * kBt, {}, {});
  EXPECT_EQ(past.status().code(), absl::StatusCode::kFailedPrecondition) << past.status();
  // The same append from the start stores the blocks anew.
  auto stored = Append(*cache_, Small(), seq);
  ASSERT_TRUE(stored.ok()) << stored.status();
  EXPECT_EQ(stored->stored_blocks, 3u);
  EXPECT_EQ(stored->deduplicated_blocks, 0u);
}

// Hits share the cache's lock and leave their touches for the next exclusive
// section to apply (touch_buffer.h); a hit whose path does not fit its touch
// stripe takes the lock exclusively instead. Either way every hit counts
// once: uses and last access as the operator's view shows them.
TEST_F(CacheTest, EveryHitCountsOnceWhetherItSharedTheLockOrNot) {
  MakeCache(72);  // 4.5 MiB: the long sequence's 4.1 MiB and the short one
  Register(Small());
  Ids long_ids;
  for (uint32_t i = 1; i <= TouchBuffer::kStripeCapacity + 10; ++i) long_ids.push_back(i);
  const std::vector<Token> long_seq = Seq(long_ids);
  const std::vector<Token> short_seq = Seq({5001, 5002});
  ASSERT_TRUE(Append(*cache_, Small(), long_seq).ok());
  ASSERT_TRUE(Append(*cache_, Small(), short_seq).ok());
  auto uses = [&](const std::vector<Token>& seq) -> std::pair<uint64_t, absl::Time> {
    for (const PrefixSummary& p : CacheInspector(cache_.get()).TopPrefixes(10)) {
      if (p.key == PrefixKey(seq, 0)) return {p.references, p.last_access};
    }
    ADD_FAILURE() << "not cached";
    return {0, absl::InfinitePast()};
  };
  const uint64_t long_before = uses(long_seq).first;
  const uint64_t short_before = uses(short_seq).first;
  clock_.Advance(absl::Seconds(5));
  for (int i = 0; i < 3; ++i) EXPECT_EQ(Matched(Small(), short_seq), 2 * kBt);
  for (int i = 0; i < 2; ++i) EXPECT_EQ(Fetched(Small(), short_seq), 2 * kBt);
  const absl::Time short_hit = clock_.Now();
  clock_.Advance(absl::Seconds(5));
  for (int i = 0; i < 2; ++i) EXPECT_EQ(Matched(Small(), long_seq), long_seq.size());
  EXPECT_EQ(Fetched(Small(), long_seq), long_seq.size());
  EXPECT_EQ(uses(short_seq), std::make_pair(short_before + 5, short_hit));
  EXPECT_EQ(uses(long_seq), std::make_pair(long_before + 3, clock_.Now()));
}

TEST_F(CacheTest, AppendOverAPrefixThatExpiresMidStreamAborts) {
  Register(Small());
  ASSERT_TRUE(Append(*cache_, Small(), Seq({1, 2}), 0, {.ttl = absl::Seconds(5)}).ok());
  const std::vector<Token> tokens = Seq({1, 2, 3});
  auto session = cache_->BeginAppend(Small().key, tokens, 2 * kBt, {}, {});
  ASSERT_TRUE(session.ok()) << session.status();
  ASSERT_TRUE(WriteInChunks(**session, Kv(Small(), tokens, 2, 1)).ok());
  clock_.Advance(absl::Seconds(5));  // the prefix expires while the append streams
  EXPECT_EQ(CodeOf((*session)->Commit()), kAborted);
  EXPECT_EQ(Matched(Small(), tokens), 0u);
  EXPECT_EQ(StatsOf(Small()).blocks, 0u);
}

}  // namespace
}  // namespace cache_test
}  // namespace kvcache
