// ClusterClient against a real Redis Cluster (three masters of Debian's
// redis-server on loopback): slots as the cluster computes them, batches
// spread over the masters, a slot moved behind the client's back (MOVED), a
// slot caught mid-migration (ASK), and a master killed.
#include "server/remote/cluster_client.h"

#include <gtest/gtest.h>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "server/remote/cluster_suite.h"
#include "server/remote/key_slot.h"

namespace kvcache {
namespace {

class ClusterClientTest : public remote_test::ClusterSuite {
 protected:
  void SetUp() override {
    remote_test::ClusterSuite::SetUp();
    if (IsSkipped() || HasFatalFailure()) return;
    absl::StatusOr<std::unique_ptr<ClusterClient>> client =
        ClusterClient::Connect({.seeds = {cluster_->Address(1)}});
    ASSERT_TRUE(client.ok()) << client.status();
    client_ = *std::move(client);
  }

  // The index of the node serving `slot` (as the cluster says), or -1.
  static int Owner(uint16_t slot) {
    for (int i = 0; i < 3; ++i) {
      auto node = cluster_->Node(i);
      absl::StatusOr<RespValue> slots = node->Run({"CLUSTER", "SLOTS"});
      if (!slots.ok()) continue;
      for (const RespValue& range : slots->elements) {
        if (range.elements[0].integer <= slot && slot <= range.elements[1].integer &&
            range.elements[2].elements[1].integer == cluster_->Port(i)) {
          return i;
        }
      }
    }
    return -1;
  }
  static std::string IdOf(int i) { return cluster_->Node(i)->Run({"CLUSTER", "MYID"})->str; }
  // Runs `command` on node i, expecting a status or integer reply.
  static void On(int i, const RedisCommand& command) {
    absl::StatusOr<RespValue> r = cluster_->Node(i)->Run(command);
    ASSERT_TRUE(r.ok()) << r.status();
    ASSERT_FALSE(r->is_error()) << absl::StrJoin(command, " ") << ": " << r->str;
  }

  std::unique_ptr<ClusterClient> client_;
};

TEST_F(ClusterClientTest, KeySlotAgreesWithTheCluster) {
  auto node = cluster_->Node(0);
  for (int i = 0; i < 300; ++i) {
    const std::string key = i % 3 == 0   ? absl::StrCat("kv:", i * 7919)
                            : i % 3 == 1 ? absl::StrCat("{tenant", i % 17, "}:block:", i)
                                         : absl::StrCat("x{}{", i, "}");
    absl::StatusOr<RespValue> slot = node->Run({"CLUSTER", "KEYSLOT", key});
    ASSERT_TRUE(slot.ok()) << slot.status();
    EXPECT_EQ(KeySlot(key), slot->integer) << key;
  }
}

TEST_F(ClusterClientTest, ABatchReachesEveryMasterAndReadsBackWhatItWrote) {
  EXPECT_EQ(client_->topology().covered_slots(), kClusterSlots);
  EXPECT_EQ(client_->topology().masters().size(), 3u);
  std::vector<KeyedCommand> sets, gets;
  for (int i = 0; i < 300; ++i) {
    const std::string key = absl::StrCat("batch:", i);
    sets.push_back({key, {"SET", key, absl::StrCat("value ", i, std::string(i, '\0'))}});
    gets.push_back({key, {"GET", key}});
  }
  for (const absl::StatusOr<RespValue>& r : client_->Run(sets)) {
    ASSERT_TRUE(r.ok()) << r.status();
    EXPECT_EQ(r->str, "OK");
  }
  std::vector<absl::StatusOr<RespValue>> got = client_->Run(gets);
  for (int i = 0; i < 300; ++i) {
    ASSERT_TRUE(got[i].ok()) << got[i].status();
    EXPECT_EQ(got[i]->str, absl::StrCat("value ", i, std::string(i, '\0'))) << i;
  }
  for (int n = 0; n < 3; ++n) EXPECT_GT(cluster_->Node(n)->Run({"DBSIZE"})->integer, 0) << n;
  EXPECT_EQ(client_->stats().moved, 0u);
  EXPECT_EQ(client_->stats().connects, 3u);  // one per master, the seed's reused
  // A command's own error is its reply, not a failure.
  absl::StatusOr<RespValue> wrong = client_->Run({"batch:1", {"LPUSH", "batch:1", "x"}});
  ASSERT_TRUE(wrong.ok()) << wrong.status();
  EXPECT_TRUE(wrong->is_error());
  EXPECT_TRUE(wrong->str.starts_with("WRONGTYPE")) << wrong->str;
}

TEST_F(ClusterClientTest, ASlotMovedBehindTheClientsBackIsFollowedAndLearnt) {
  const std::string key = "moved:key";
  const uint16_t slot = KeySlot(key);
  ASSERT_TRUE(client_->Run({key, {"SET", key, "before the move"}}).ok());
  const int from = Owner(slot);
  ASSERT_GE(from, 0);
  const int to = (from + 1) % 3;
  const std::string from_id = IdOf(from), to_id = IdOf(to);
  On(to, {"CLUSTER", "SETSLOT", absl::StrCat(slot), "IMPORTING", from_id});
  On(from, {"CLUSTER", "SETSLOT", absl::StrCat(slot), "MIGRATING", to_id});
  On(from,
     {"MIGRATE", "127.0.0.1", absl::StrCat(cluster_->Port(to)), "", "0", "5000", "KEYS", key});
  for (int n = 0; n < 3; ++n) On(n, {"CLUSTER", "SETSLOT", absl::StrCat(slot), "NODE", to_id});
  ASSERT_EQ(*client_->topology().MasterOf(slot), cluster_->Address(from));  // stale

  absl::StatusOr<RespValue> got = client_->Run({key, {"GET", key}});
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(got->str, "before the move");
  EXPECT_EQ(client_->stats().moved, 1u);
  EXPECT_EQ(*client_->topology().MasterOf(slot), cluster_->Address(to));
  // Learnt: the next command goes straight there.
  ASSERT_TRUE(client_->Run({key, {"GET", key}}).ok());
  EXPECT_EQ(client_->stats().moved, 1u);
}

TEST_F(ClusterClientTest, AKeyThatLeftAMigratingSlotIsAskedOfTheImportingNode) {
  const std::string gone = "{ask}:gone", stayed = "{ask}:stayed";
  const uint16_t slot = KeySlot(gone);
  ASSERT_EQ(slot, KeySlot(stayed));
  ASSERT_TRUE(client_->Run({gone, {"SET", gone, "moved on"}}).ok());
  ASSERT_TRUE(client_->Run({stayed, {"SET", stayed, "still here"}}).ok());
  const int from = Owner(slot);
  ASSERT_GE(from, 0);
  const int to = (from + 2) % 3;
  On(to, {"CLUSTER", "SETSLOT", absl::StrCat(slot), "IMPORTING", IdOf(from)});
  On(from, {"CLUSTER", "SETSLOT", absl::StrCat(slot), "MIGRATING", IdOf(to)});
  On(from,
     {"MIGRATE", "127.0.0.1", absl::StrCat(cluster_->Port(to)), "", "0", "5000", "KEYS", gone});

  std::vector<absl::StatusOr<RespValue>> got =
      client_->Run(std::vector<KeyedCommand>{{gone, {"GET", gone}}, {stayed, {"GET", stayed}}});
  ASSERT_TRUE(got[0].ok()) << got[0].status();
  ASSERT_TRUE(got[1].ok()) << got[1].status();
  EXPECT_EQ(got[0]->str, "moved on");
  EXPECT_EQ(got[1]->str, "still here");
  EXPECT_EQ(client_->stats().asked, 1u);
  EXPECT_EQ(client_->stats().moved, 0u);
  // ASK teaches nothing: the slot is still the migrating node's.
  EXPECT_EQ(*client_->topology().MasterOf(slot), cluster_->Address(from));
  // A command on both keys, half moved: TRYAGAIN, waited out up to
  // max_redirects times, then UNAVAILABLE (the migration never ends here).
  absl::StatusOr<RespValue> both = client_->Run({stayed, {"MGET", gone, stayed}});
  EXPECT_EQ(both.status().code(), absl::StatusCode::kUnavailable) << both.status();
  EXPECT_EQ(client_->stats().try_again,
            static_cast<uint64_t>(ClusterClientOptions{}.max_redirects));
}

TEST(ClusterClientSeedsTest, NoSeedThatAnswersIsUnavailable) {
  EXPECT_EQ(ClusterClient::Connect({}).status().code(), absl::StatusCode::kInvalidArgument);
  // Port 1 on loopback: refused at once.
  absl::StatusOr<std::unique_ptr<ClusterClient>> client =
      ClusterClient::Connect({.seeds = {{.host = "127.0.0.1", .port = 1}}});
  EXPECT_EQ(client.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_NE(client.status().message().find("127.0.0.1:1"), std::string::npos) << client.status();
}

TEST(ClusterClientFailureTest, AKilledMasterFailsOnlyItsSlotsAndInBoundedTime) {
  if (!RedisClusterFixture::Available()) GTEST_SKIP() << "redis-server is not installed";
  RedisClusterFixture cluster;
  ASSERT_TRUE(cluster.Start(3).ok());
  absl::StatusOr<std::unique_ptr<ClusterClient>> client = ClusterClient::Connect(
      {.seeds = {cluster.Address(0)},
       .node = {.connect_timeout = absl::Milliseconds(100), .io_timeout = absl::Milliseconds(200)},
       .max_redirects = 2});
  ASSERT_TRUE(client.ok()) << client.status();
  // Connected to every master first, so the dead one's connection breaks
  // mid-batch (dropped, then refused on the retry).
  std::vector<KeyedCommand> warm;
  for (int i = 0; i < 30; ++i) {
    const std::string key = absl::StrCat("warm:", i);
    warm.push_back({key, {"SET", key, "v"}});
  }
  for (const auto& r : (*client)->Run(warm)) ASSERT_TRUE(r.ok()) << r.status();
  ASSERT_EQ((*client)->stats().connects, 3u);
  cluster.KillNode(2);
  const NodeAddress dead = cluster.Address(2);
  std::vector<KeyedCommand> sets;
  for (int i = 0; i < 60; ++i) {
    const std::string key = absl::StrCat("down:", i);
    sets.push_back({key, {"SET", key, "v"}});
  }
  const absl::Time start = absl::Now();
  std::vector<absl::StatusOr<RespValue>> results = (*client)->Run(sets);
  const absl::Duration took = absl::Now() - start;
  int failed = 0;
  for (size_t i = 0; i < sets.size(); ++i) {
    const NodeAddress* owner = (*client)->topology().MasterOf(KeySlot(sets[i].key));
    ASSERT_NE(owner, nullptr);
    if (*owner == dead) {
      EXPECT_EQ(results[i].status().code(), absl::StatusCode::kUnavailable) << sets[i].key;
      ++failed;
    } else {
      ASSERT_TRUE(results[i].ok()) << sets[i].key << ": " << results[i].status();
      EXPECT_EQ(results[i]->str, "OK");
    }
  }
  EXPECT_GT(failed, 0);
  EXPECT_LT(failed, 60);
  EXPECT_GT((*client)->stats().node_failures, 0u);
  EXPECT_EQ((*client)->stats().unavailable, static_cast<uint64_t>(failed));
  // Three tries at most of a refused connection and a map re-read each: far
  // below a second on loopback, and bounded by the timeouts anyway.
  EXPECT_LT(took, absl::Seconds(3)) << took;
}

TEST(ClusterClientFailureTest, MastersThatStopAnsweringCostNoMoreThanTheDeadline) {
  if (!RedisClusterFixture::Available()) GTEST_SKIP() << "redis-server is not installed";
  RedisClusterFixture cluster;
  ASSERT_TRUE(cluster.Start(3).ok());
  absl::StatusOr<std::unique_ptr<ClusterClient>> client = ClusterClient::Connect(
      {.seeds = {cluster.Address(0), cluster.Address(1), cluster.Address(2)},
       .node = {.connect_timeout = absl::Milliseconds(100), .io_timeout = absl::Milliseconds(200)},
       .max_redirects = 5});
  ASSERT_TRUE(client.ok()) << client.status();
  std::vector<KeyedCommand> gets;
  for (int i = 0; i < 30; ++i) {
    const std::string key = absl::StrCat("hung:", i);
    gets.push_back({key, {"GET", key}});
  }
  for (const auto& r : (*client)->Run(gets)) ASSERT_TRUE(r.ok()) << r.status();
  // Every master silent, its connections open: without a deadline each of
  // five retries would wait out its timeouts on every node, and re-read the
  // slot map from each of them.
  for (int i = 0; i < 3; ++i) cluster.PauseNode(i, true);
  const absl::Time start = absl::Now();
  std::vector<absl::StatusOr<RespValue>> results =
      (*client)->Run(gets, absl::Now() + absl::Milliseconds(300));
  const absl::Duration took = absl::Now() - start;
  for (int i = 0; i < 3; ++i) cluster.PauseNode(i, false);
  for (const auto& r : results) EXPECT_EQ(r.status().code(), absl::StatusCode::kUnavailable);
  // The deadline, and at most the step under way when it passed (a read's
  // timeout, a connect's and a slot-map read's).
  EXPECT_LT(took, absl::Milliseconds(300 + 200 + 100 + 200 + 200)) << took;
  // Answering again: the same client serves.
  for (const auto& r : (*client)->Run(gets)) EXPECT_TRUE(r.ok()) << r.status();
}

TEST(ClusterClientReplicaTest, ReadsGoToReplicasAndOutliveTheirMaster) {
  if (!RedisClusterFixture::Available()) GTEST_SKIP() << "redis-server is not installed";
  RedisClusterFixture cluster;
  ASSERT_TRUE(cluster.Start(3, "", /*replicas=*/1).ok());
  absl::StatusOr<std::unique_ptr<ClusterClient>> client = ClusterClient::Connect(
      {.seeds = {cluster.Address(0)},
       .node = {.connect_timeout = absl::Milliseconds(100), .io_timeout = absl::Milliseconds(300)},
       .max_redirects = 3,
       .read_from_replicas = true});
  ASSERT_TRUE(client.ok()) << client.status();
  std::vector<KeyedCommand> sets, gets;
  for (int i = 0; i < 60; ++i) {
    const std::string key = absl::StrCat("replicated:", i);
    sets.push_back({key, {"SET", key, absl::StrCat("v", i)}});
    gets.push_back({.key = key, .command = {"GET", key}, .read_only = true});
  }
  for (const auto& r : (*client)->Run(sets)) ASSERT_TRUE(r.ok() && r->str == "OK");
  for (int i = 0; i < 3; ++i) ASSERT_TRUE(cluster.Node(i)->Run({"WAIT", "1", "2000"}).ok());
  // Redis lists a replica in CLUSTER SLOTS once it has replicated something
  // (and the masters have heard so): the map, read again, has them.
  const absl::Time deadline = absl::Now() + absl::Seconds(10);
  int with_replicas = 0;
  while (with_replicas < 3 && absl::Now() < deadline) {
    ASSERT_TRUE((*client)->Refresh().ok());
    with_replicas = 0;
    for (uint16_t slot : {0, 8000, 16000}) {
      with_replicas += (*client)->topology().ReplicasOf(slot).empty() ? 0 : 1;
    }
    if (with_replicas < 3) absl::SleepFor(absl::Milliseconds(100));
  }
  ASSERT_EQ(with_replicas, 3) << "the masters did not list their replicas";
  // Every read went to a replica, and found what the masters took.
  const uint64_t before = (*client)->stats().replica_reads;
  std::vector<absl::StatusOr<RespValue>> got = (*client)->Run(gets);
  EXPECT_EQ((*client)->stats().replica_reads - before, 60u);
  for (int i = 0; i < 60; ++i) {
    ASSERT_TRUE(got[i].ok()) << got[i].status();
    EXPECT_EQ(got[i]->str, absl::StrCat("v", i));
  }
  // A master killed: before any failover, its slots' reads are still
  // answered by its replica.
  cluster.KillNode(0);
  got = (*client)->Run(gets);
  for (int i = 0; i < 60; ++i) {
    ASSERT_TRUE(got[i].ok()) << gets[i].key << ": " << got[i].status();
    EXPECT_EQ(got[i]->str, absl::StrCat("v", i));
  }
}

TEST(ClusterClientAuthTest, ThePasswordOpensTheClusterAndNothingElseDoes) {
  if (!RedisClusterFixture::Available()) GTEST_SKIP() << "redis-server is not installed";
  RedisClusterFixture cluster;
  ASSERT_TRUE(cluster.Start(3, "opensesame42").ok());
  // Without a password, or with another, no slot map: the seed refuses.
  for (const std::string password : {"", "wrong"}) {
    absl::StatusOr<std::unique_ptr<ClusterClient>> refused =
        ClusterClient::Connect({.seeds = {cluster.Address(0)}, .node = {.password = password}});
    EXPECT_FALSE(refused.ok()) << "password \"" << password << "\"";
  }
  absl::StatusOr<std::unique_ptr<RedisNode>> wrong =
      RedisNode::Connect(cluster.Address(0), {.password = "wrong"});
  EXPECT_EQ(wrong.status().code(), absl::StatusCode::kPermissionDenied) << wrong.status();
  // The client says why: the seed refused the password, not "unreachable".
  absl::StatusOr<std::unique_ptr<ClusterClient>> refused =
      ClusterClient::Connect({.seeds = {cluster.Address(0)}, .node = {.password = "wrong"}});
  EXPECT_NE(refused.status().message().find("AUTH refused"), std::string::npos) << refused.status();
  // With it: every master, each connection authenticated.
  absl::StatusOr<std::unique_ptr<ClusterClient>> client =
      ClusterClient::Connect({.seeds = {cluster.Address(0)}, .node = {.password = "opensesame42"}});
  ASSERT_TRUE(client.ok()) << client.status();
  std::vector<KeyedCommand> sets;
  for (int i = 0; i < 30; ++i) {
    const std::string key = absl::StrCat("auth:", i);
    sets.push_back({key, {"SET", key, "v"}});
  }
  for (const auto& r : (*client)->Run(sets)) {
    ASSERT_TRUE(r.ok()) << r.status();
    EXPECT_EQ(r->str, "OK");
  }
  EXPECT_EQ((*client)->stats().connects, 3u);
}

}  // namespace
}  // namespace kvcache
