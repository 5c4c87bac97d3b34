// RemoteStore against a real Redis Cluster (three masters of redis-server on
// loopback): what one daemon writes another reads byte for byte; what Redis
// or its operator changes is a miss, counted by cause; a cluster gone costs
// misses and dropped writes, never errors, and the breaker stops the trying.
#include "server/remote/remote_store.h"

#include <gtest/gtest.h>

#include "absl/strings/str_cat.h"
#include "server/core/block.h"
#include "server/remote/cluster_suite.h"
#include "server/remote/remote_key.h"
#include "server/remote/remote_test_util.h"

namespace kvcache {
namespace {

using remote_test::Secret;

std::vector<std::byte> BlockBytes(size_t n, int seed) { return remote_test::SeededBytes(n, seed); }

class RemoteStoreTest : public remote_test::ClusterSuite {
 protected:
  static std::unique_ptr<RemoteStore> NewStore(uint8_t secret, RemoteStoreOptions options = {}) {
    options.cluster.seeds = {cluster_->Address(0)};
    absl::StatusOr<std::unique_ptr<RemoteStore>> store =
        RemoteStore::Start(options, Secret(secret));
    EXPECT_TRUE(store.ok()) << store.status();
    return store.ok() ? *std::move(store) : nullptr;
  }
  // `n` blocks of `bytes` each written through `store` under the keys of a
  // prompt of namespace `ns`; returns their keys.
  static std::vector<std::string> WriteBlocks(RemoteStore& store, uint8_t secret,
                                              const std::string& ns, int n, size_t bytes) {
    const ModelLayout layout{.num_layers = 1, .num_kv_heads = 1, .head_dim = 8, .block_tokens = 4};
    std::vector<Token> tokens;
    for (int i = 0; i < 4 * n; ++i) tokens.push_back(static_cast<Token>(i * 31 + bytes));
    std::vector<std::string> keys =
        RemoteKeyChain(Secret(secret), {ns, "m"}, layout).KeysOf(tokens);
    for (int i = 0; i < n; ++i) {
      std::vector<std::byte> block = BlockBytes(bytes, i);
      const uint64_t checksum = Checksum(block);
      EXPECT_TRUE(store.Put(ns, keys[i], checksum, std::move(block)));
    }
    store.Flush();
    return keys;
  }
};

TEST_F(RemoteStoreTest, WhatOneDaemonWritesAnotherReadsByteForByte) {
  auto writer = NewStore(1);
  auto reader = NewStore(1);
  ASSERT_TRUE(writer && reader);
  const size_t kBytes = 256 << 10;
  const std::vector<std::string> keys = WriteBlocks(*writer, 1, "tenant-a", 12, kBytes);
  EXPECT_EQ(writer->stats().writes_done, 12u);
  EXPECT_EQ(writer->stats().write_queue, 0u);
  std::vector<std::optional<RemoteBlock>> got = reader->Get("tenant-a", keys);
  for (int i = 0; i < 12; ++i) {
    ASSERT_TRUE(got[i].has_value()) << i;
    EXPECT_EQ(got[i]->bytes, BlockBytes(kBytes, i)) << i;
    EXPECT_EQ(got[i]->checksum, Checksum(BlockBytes(kBytes, i)));
  }
  const RemoteStore::Stats s = reader->stats();
  EXPECT_EQ(s.reads, 12u);
  EXPECT_EQ(s.hits, 12u);
  EXPECT_EQ(s.read_bytes, 12 * kBytes);
  // Keys nobody wrote: misses, not errors.
  const std::vector<std::string> absent = {"kvc:absent-1", "kvc:absent-2"};
  got = reader->Get("tenant-a", absent);
  EXPECT_FALSE(got[0].has_value());
  EXPECT_FALSE(got[1].has_value());
  EXPECT_EQ(reader->stats().misses_absent, 2u);
}

TEST_F(RemoteStoreTest, ValuesChangedInsideRedisOrReadAsAnotherTenantAreMisses) {
  auto store = NewStore(1);
  ASSERT_TRUE(store);
  const std::vector<std::string> keys = WriteBlocks(*store, 1, "tenant-b", 3, 4096);
  // An operator flips a byte of block 0's value, and copies block 1's value
  // over block 2's key.
  auto client = ClusterClient::Connect({.seeds = {cluster_->Address(0)}});
  ASSERT_TRUE(client.ok());
  ASSERT_TRUE((*client)->Run({keys[0], {"SETRANGE", keys[0], "40", "\x7f"}}).ok());
  absl::StatusOr<RespValue> one = (*client)->Run({keys[1], {"GET", keys[1]}});
  ASSERT_TRUE(one.ok());
  ASSERT_TRUE((*client)->Run({keys[2], {"SET", keys[2], one->str}}).ok());
  std::vector<std::optional<RemoteBlock>> got = store->Get("tenant-b", keys);
  EXPECT_FALSE(got[0].has_value());
  EXPECT_TRUE(got[1].has_value());
  EXPECT_FALSE(got[2].has_value());
  EXPECT_EQ(store->stats().misses_unreadable, 2u);
  // Another namespace asking for the same keys, or a daemon with another
  // secret: nothing opens.
  EXPECT_FALSE(store->Get("tenant-c", keys)[1].has_value());
  auto stranger = NewStore(9);
  ASSERT_TRUE(stranger);
  EXPECT_FALSE(stranger->Get("tenant-b", keys)[1].has_value());
  EXPECT_EQ(stranger->stats().misses_unreadable, 3u);  // all three keys
}

TEST_F(RemoteStoreTest, BytesThatDoNotMatchTheirChecksumAreAMiss) {
  auto store = NewStore(1);
  ASSERT_TRUE(store);
  // A writer with the secret that sealed a wrong checksum: the value opens,
  // its bytes are not the block it claims to be.
  const std::vector<std::byte> bytes = BlockBytes(4096, 3);
  ASSERT_TRUE(store->Put("ns", "kvc:wrong-sum", Checksum(bytes) ^ 1, bytes));
  store->Flush();
  const std::vector<std::string> keys = {"kvc:wrong-sum"};
  EXPECT_FALSE(store->Get("ns", keys)[0].has_value());
  EXPECT_EQ(store->stats().misses_checksum, 1u);
  EXPECT_EQ(store->stats().hits, 0u);
}

TEST_F(RemoteStoreTest, AFullQueueDropsWritesAndCountsThem) {
  auto store = NewStore(1, {.write_queue_blocks = 2, .write_batch_blocks = 1});
  ASSERT_TRUE(store);
  int accepted = 0;
  for (int i = 0; i < 200; ++i) {
    accepted += store->Put("ns", absl::StrCat("kvc:full-", i), 0, BlockBytes(64 << 10, i)) ? 1 : 0;
  }
  store->Flush();
  const RemoteStore::Stats s = store->stats();
  EXPECT_EQ(s.writes_queued, static_cast<uint64_t>(accepted));
  EXPECT_EQ(s.writes_dropped_full, static_cast<uint64_t>(200 - accepted));
  EXPECT_GT(s.writes_dropped_full, 0u);
  EXPECT_EQ(s.writes_done, s.writes_queued);
}

TEST(RemoteStoreFailureTest, AClusterGoneCostsMissesAndTheBreakerStopsTheTrying) {
  if (!RedisClusterFixture::Available()) GTEST_SKIP() << "redis-server is not installed";
  RedisClusterFixture cluster;
  ASSERT_TRUE(cluster.Start(3).ok());
  RemoteStoreOptions options{.breaker_failures = 2, .breaker_cooldown = absl::Seconds(30)};
  options.cluster = {
      .seeds = {cluster.Address(0)},
      .node = {.connect_timeout = absl::Milliseconds(100), .io_timeout = absl::Milliseconds(200)},
      .max_redirects = 1};
  absl::StatusOr<std::unique_ptr<RemoteStore>> store = RemoteStore::Start(options, Secret(1));
  ASSERT_TRUE(store.ok()) << store.status();
  for (int i = 0; i < 3; ++i) cluster.KillNode(i);
  const std::vector<std::string> keys = {"kvc:gone-1", "kvc:gone-2", "kvc:gone-3"};
  const absl::Time start = absl::Now();
  for (int attempt = 0; attempt < 2; ++attempt) {
    for (const auto& b : (*store)->Get("ns", keys)) EXPECT_FALSE(b.has_value());
  }
  EXPECT_TRUE((*store)->stats().breaker_open);
  EXPECT_EQ((*store)->stats().breaker_opens, 1u);
  // Open: reads miss at once, writes are dropped at once.
  const absl::Time open = absl::Now();
  for (const auto& b : (*store)->Get("ns", keys)) EXPECT_FALSE(b.has_value());
  EXPECT_FALSE((*store)->Put("ns", "kvc:gone-4", 0, BlockBytes(16, 0)));
  EXPECT_LT(absl::Now() - open, absl::Milliseconds(50));
  const RemoteStore::Stats s = (*store)->stats();
  EXPECT_EQ(s.misses_unavailable, 9u);
  EXPECT_EQ(s.writes_dropped_open, 1u);
  EXPECT_EQ(s.hits, 0u);
  EXPECT_LT(absl::Now() - start, absl::Seconds(5));
}

TEST(RemoteStoreFailureTest, AStoreStartedBeforeTheClusterIsUpWorksOnceItIs) {
  if (!RedisClusterFixture::Available()) GTEST_SKIP() << "redis-server is not installed";
  RedisClusterFixture cluster;
  ASSERT_TRUE(cluster.Start(3).ok());
  for (int i = 0; i < 3; ++i) cluster.KillNode(i);
  RemoteStoreOptions options{.breaker_failures = 2, .breaker_cooldown = absl::Milliseconds(200)};
  options.cluster = {
      .seeds = {cluster.Address(0), cluster.Address(1)},
      .node = {.connect_timeout = absl::Milliseconds(100), .io_timeout = absl::Milliseconds(300)},
      .max_redirects = 1};
  // A daemon starting while the cluster is down starts all the same.
  absl::StatusOr<std::unique_ptr<RemoteStore>> store = RemoteStore::Start(options, Secret(1));
  ASSERT_TRUE(store.ok()) << store.status();
  EXPECT_EQ((*store)->Connect().code(), absl::StatusCode::kUnavailable);
  const std::vector<std::string> keys = {"kvc:late-1"};
  EXPECT_FALSE((*store)->Get("ns", keys)[0].has_value());
  EXPECT_TRUE((*store)->Put("ns", keys[0], Checksum(BlockBytes(64, 1)), BlockBytes(64, 1)));
  (*store)->Flush();
  RemoteStore::Stats s = (*store)->stats();
  EXPECT_EQ(s.misses_unavailable, 1u);
  EXPECT_EQ(s.writes_failed, 1u);
  EXPECT_EQ(s.breaker_opens, 1u);
  // The cluster comes up: once the breaker lets a try through, the store
  // connects and works.
  for (int i = 0; i < 3; ++i) ASSERT_TRUE(cluster.RestartNode(i).ok());
  ASSERT_TRUE(cluster.WaitUntilOk().ok());
  absl::SleepFor(absl::Milliseconds(250));
  EXPECT_TRUE((*store)->Put("ns", keys[0], Checksum(BlockBytes(64, 1)), BlockBytes(64, 1)));
  (*store)->Flush();
  std::optional<RemoteBlock> got = (*store)->Get("ns", keys)[0];
  ASSERT_TRUE(got.has_value());
  EXPECT_EQ(got->bytes, BlockBytes(64, 1));
  s = (*store)->stats();
  EXPECT_EQ(s.writes_done, 1u);
  EXPECT_EQ(s.hits, 1u);
  EXPECT_FALSE(s.breaker_open);
}

}  // namespace
}  // namespace kvcache
