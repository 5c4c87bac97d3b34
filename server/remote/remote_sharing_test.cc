// RemoteSharing between two caches (two daemons' worth) over a real Redis
// Cluster of three masters: KV appended on one is fetched byte for byte on
// the other; only what is missing locally is adopted; a value altered in
// Redis, another namespace or a cluster gone adopts nothing wrong.
#include "server/remote/remote_sharing.h"

#include <gtest/gtest.h>

#include "server/core/cache_test_util.h"
#include "server/remote/cluster_suite.h"
#include "server/remote/remote_key.h"
#include "server/remote/remote_test_util.h"

namespace kvcache {
namespace {

using namespace cache_test;  // NOLINT: the cache tests' models and patterns

using remote_test::Secret;

// One daemon's worth: a cache, its store and its sharing.
struct Node {
  Node(const RedisClusterFixture& cluster, ManualClock* clock, uint8_t secret = 1) {
    auto pool = SlabPool::Create({.capacity_bytes = 64 * kSlab, .slab_bytes = kSlab});
    EXPECT_TRUE(pool.ok());
    cache = std::make_unique<Cache>(CacheOptions{}, *std::move(pool), NewLruPolicy(), clock);
    for (const TestModel& m : {Mid(), Other()})
      EXPECT_TRUE(cache->RegisterModel(m.key, m.layout).ok());
    RemoteStoreOptions options;
    options.cluster = {
        .seeds = {cluster.Address(0)},
        .node = {.connect_timeout = absl::Milliseconds(100), .io_timeout = absl::Milliseconds(300)},
        .max_redirects = 1};
    auto started = RemoteStore::Start(options, Secret(secret));
    EXPECT_TRUE(started.ok()) << started.status();
    if (started.ok()) store = *std::move(started);
    sharing = std::make_unique<RemoteSharing>(cache.get(), store.get(), Secret(secret));
  }
  // Mid's layout under another namespace.
  static TestModel Other() {
    TestModel m = Mid();
    m.key.ns = "tenant-b";
    return m;
  }
  std::unique_ptr<Cache> cache;
  std::unique_ptr<RemoteStore> store;
  std::unique_ptr<RemoteSharing> sharing;
};

class RemoteSharingTest : public remote_test::ClusterSuite {
 protected:
  void SetUp() override {
    remote_test::ClusterSuite::SetUp();
    if (IsSkipped() || HasFatalFailure()) return;
    a_ = std::make_unique<Node>(*cluster_, &clock_);
    b_ = std::make_unique<Node>(*cluster_, &clock_);
    ASSERT_TRUE(a_->store && b_->store);
  }
  // A prompt no other test uses.
  std::vector<Token> Prompt(uint32_t blocks) {
    std::vector<Token> tokens;
    for (uint32_t i = 0; i < blocks * kBt; ++i) tokens.push_back(next_token_++);
    return tokens;
  }
  // Appends `tokens` on node A and shares them.
  void AppendAndShare(const TestModel& m, const std::vector<Token>& tokens) {
    ASSERT_TRUE(Append(*a_->cache, m, tokens).ok());
    ASSERT_TRUE(a_->sharing->Share(m.key, tokens, 0));
    a_->sharing->Flush();
  }

  static inline Token next_token_ = 1000;
  ManualClock clock_;
  std::unique_ptr<Node> a_, b_;
};

TEST_F(RemoteSharingTest, WhatOneNodeAppendedAnotherFetchesByteForByte) {
  const std::vector<Token> tokens = Prompt(8);
  AppendAndShare(Mid(), tokens);
  EXPECT_EQ(a_->sharing->stats().blocks_put, 8u);
  EXPECT_EQ(a_->store->stats().writes_done, 8u);
  ASSERT_EQ(b_->cache->PrepareFetch(Mid().key, {.tokens = tokens})->blocks.size(), 0u);
  absl::StatusOr<uint64_t> adopted = b_->sharing->Discover(Mid().key, tokens);
  ASSERT_TRUE(adopted.ok()) << adopted.status();
  EXPECT_EQ(*adopted, 8 * kBt);
  absl::StatusOr<FetchPlan> plan = b_->cache->PrepareFetch(Mid().key, {.tokens = tokens});
  ASSERT_TRUE(plan.ok());
  EXPECT_EQ(plan->matched_tokens, 8 * kBt);
  EXPECT_TRUE(PlanHolds(*plan, Mid(), tokens));
  // Found again: nothing more to adopt.
  EXPECT_EQ(*b_->sharing->Discover(Mid().key, tokens), 0u);
  EXPECT_EQ(b_->sharing->stats().blocks_adopted, 8u);
}

TEST_F(RemoteSharingTest, ADiscoveryLaterAdoptsOnItsOwnThread) {
  const std::vector<Token> tokens = Prompt(4);
  AppendAndShare(Mid(), tokens);
  // A lookup's front door hands the prompt over and goes on; its ticket
  // says when the blocks are cached.
  std::shared_ptr<WorkTicket> ticket = b_->sharing->DiscoverLater(Mid().key, tokens);
  ASSERT_NE(ticket, nullptr);
  ASSERT_TRUE(ticket->WaitFor(absl::Seconds(30)));
  EXPECT_TRUE(PlanHolds(*b_->cache->PrepareFetch(Mid().key, {.tokens = tokens}), Mid(), tokens));
  EXPECT_EQ(b_->cache->PrepareFetch(Mid().key, {.tokens = tokens})->matched_tokens, 4 * kBt);
  EXPECT_EQ(b_->sharing->stats().blocks_adopted, 4u);
  EXPECT_EQ(b_->sharing->stats().discoveries_dropped, 0u);
}

TEST_F(RemoteSharingTest, OnlyWhatIsMissingLocallyIsAdopted) {
  const std::vector<Token> tokens = Prompt(6);
  AppendAndShare(Mid(), tokens);
  // B computed the first two blocks itself.
  ASSERT_TRUE(
      Append(*b_->cache, Mid(), std::vector<Token>(tokens.begin(), tokens.begin() + 2 * kBt)).ok());
  const uint64_t reads_before = b_->store->stats().reads;
  EXPECT_EQ(*b_->sharing->Discover(Mid().key, tokens), 4 * kBt);
  EXPECT_EQ(b_->store->stats().reads - reads_before, 4u);
  EXPECT_TRUE(PlanHolds(*b_->cache->PrepareFetch(Mid().key, {.tokens = tokens}), Mid(), tokens));
  // A longer prompt on B: its own new blocks are not in the store, so the
  // discovery stops where A's prompt ended.
  std::vector<Token> longer = tokens;
  for (Token t : Prompt(2)) longer.push_back(t);
  EXPECT_EQ(*b_->sharing->Discover(Mid().key, longer), 0u);
  EXPECT_EQ(b_->cache->PrepareFetch(Mid().key, {.tokens = longer})->matched_tokens, 6 * kBt);
}

TEST_F(RemoteSharingTest, AValueAlteredInRedisEndsTheAdoptionBeforeIt) {
  const std::vector<Token> tokens = Prompt(5);
  AppendAndShare(Mid(), tokens);
  const std::vector<std::string> keys =
      RemoteKeyChain(Secret(1), Mid().key, Mid().layout).KeysOf(tokens);
  auto client = ClusterClient::Connect({.seeds = {cluster_->Address(0)}});
  ASSERT_TRUE(client.ok());
  ASSERT_TRUE((*client)->Run({keys[3], {"SETRANGE", keys[3], "100", "x"}}).ok());
  EXPECT_EQ(*b_->sharing->Discover(Mid().key, tokens), 3 * kBt);
  absl::StatusOr<FetchPlan> plan = b_->cache->PrepareFetch(Mid().key, {.tokens = tokens});
  EXPECT_EQ(plan->matched_tokens, 3 * kBt);
  EXPECT_TRUE(PlanHolds(*plan, Mid(), tokens));
  EXPECT_EQ(b_->store->stats().misses_unreadable, 1u);
}

TEST_F(RemoteSharingTest, AnotherNamespaceOrSecretFindsNothing) {
  const std::vector<Token> tokens = Prompt(3);
  AppendAndShare(Mid(), tokens);
  // The same tokens and layout under tenant-b: other keys, nothing found.
  EXPECT_EQ(*b_->sharing->Discover(Node::Other().key, tokens), 0u);
  // A daemon of another deployment (another shared secret).
  Node stranger(*cluster_, &clock_, /*secret=*/2);
  EXPECT_EQ(*stranger.sharing->Discover(Mid().key, tokens), 0u);
  EXPECT_EQ(stranger.cache->PrepareFetch(Mid().key, {.tokens = tokens})->matched_tokens, 0u);
}

TEST_F(RemoteSharingTest, AnUnknownModelIsNotFound) {
  const TestModel unknown{{"default", "never-registered"}, Mid().layout, 5};
  EXPECT_EQ(b_->sharing->Discover(unknown.key, Prompt(1)).status().code(),
            absl::StatusCode::kNotFound);
}

TEST_F(RemoteSharingTest, AsASharedTierItSharesStoredAppendsAndSearchesOnlyShortMatches) {
  SharedTier& a = *a_->sharing;
  SharedTier& b = *b_->sharing;
  const std::vector<Token> tokens = Prompt(4);
  // Told that an append stored the blocks from token 2 * kBt on (an append
  // that started there): only blocks 2 and 3 are shared.
  ASSERT_TRUE(Append(*a_->cache, Mid(), tokens).ok());
  a.Stored(Mid().key, tokens, 2 * kBt);
  a_->sharing->Flush();
  EXPECT_EQ(a_->sharing->stats().blocks_put, 2u);
  // B's lookup matched nothing of a model whose block size B has not seen:
  // it searches, adopts nothing (blocks 0 and 1 are not in the store, and
  // the run must start at B's own prefix), and learns the block size.
  std::shared_ptr<WorkTicket> searched = b.Missed(Mid().key, tokens, SharedTier::kUnknownMatch);
  ASSERT_NE(searched, nullptr);
  ASSERT_TRUE(searched->WaitFor(absl::Seconds(30)));
  EXPECT_EQ(b_->sharing->stats().blocks_adopted, 0u);
  // With the first two blocks cached on B, a search adopts the other two.
  ASSERT_TRUE(
      Append(*b_->cache, Mid(), std::vector<Token>(tokens.begin(), tokens.begin() + 2 * kBt)).ok());
  searched = b.Missed(Mid().key, tokens, 2 * kBt);
  ASSERT_NE(searched, nullptr);
  ASSERT_TRUE(searched->WaitFor(absl::Seconds(30)));
  EXPECT_EQ(b_->sharing->stats().blocks_adopted, 2u);
  EXPECT_TRUE(PlanHolds(*b_->cache->PrepareFetch(Mid().key, {.tokens = tokens}), Mid(), tokens));
  // A match that covers every whole block (a partial one past it) searches
  // nothing.
  std::vector<Token> longer = tokens;
  longer.push_back(1);
  const uint64_t discoveries = b_->sharing->stats().discoveries;
  EXPECT_EQ(b.Missed(Mid().key, longer, 4 * kBt), nullptr);
  EXPECT_EQ(b_->sharing->stats().discoveries, discoveries);
  // A PREFETCH_WAIT lookup tells before it matched: the search finds every
  // whole block cached here and asks the store nothing (not counted).
  searched = b.Missed(Mid().key, longer, SharedTier::kUnknownMatch);
  ASSERT_NE(searched, nullptr);
  ASSERT_TRUE(searched->WaitFor(absl::Seconds(30)));
  EXPECT_EQ(b_->sharing->stats().discoveries, discoveries);
}

}  // namespace
}  // namespace kvcache
