// The remote tier through real daemons: two kvcached processes share one
// real Redis Cluster (3 masters, each with a replica) and one key file. KV
// appended through daemon A is found and fetched byte for byte through
// daemon B; a value altered inside Redis is a miss; a master killed mid-run
// fails over with nothing served wrong; a daemon whose cluster is down
// serves its own hits; a misconfigured remote tier stops the start with a
// clear message. Every test skips when redis-server is not installed.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <sys/stat.h>

#include <filesystem>
#include <fstream>
#include <optional>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "server/remote/redis_cluster_fixture.h"
#include "tests/integration/remote_tier_harness.h"

namespace kvcache::testing {
namespace {

using ::testing::HasSubstr;

class RemoteTierTest : public ::testing::Test {
 protected:
  using H = RemoteTierHarness;
  static constexpr uint32_t kBt = H::kBt;

  static void SetUpTestSuite() {
    if (!RedisClusterFixture::Available()) return;
    cluster_ = new RedisClusterFixture();
    start_ = cluster_->Start(3, "", /*replicas=*/1);
  }
  static void TearDownTestSuite() {
    delete cluster_;
    cluster_ = nullptr;
  }
  void SetUp() override {
    if (cluster_ == nullptr) GTEST_SKIP() << "redis-server is not installed";
    ASSERT_TRUE(start_.ok()) << start_;
    ASSERT_TRUE(cluster_->WaitUntilOk().ok());
    // A clean cluster for each test: FLUSHALL on every node (the masters
    // take it, and their replicas follow; a replica refuses it).
    for (size_t i = 0; i < cluster_->ports().size(); ++i) {
      if (auto node = cluster_->Node(i); node != nullptr) (void)node->Run({"FLUSHALL"});
    }
  }
  void TearDown() override { harness_.StopAll(); }

  DaemonProcess* StartDaemon(const std::vector<std::string>& seeds, char digit = 'a',
                             const std::string& extra = "") {
    return harness_.StartDaemon(seeds, digit, {}, extra);
  }
  static std::vector<std::string> Seeds() {
    return {absl::StrCat("127.0.0.1:", cluster_->Port(0)),
            absl::StrCat("127.0.0.1:", cluster_->Port(1))};
  }

  static inline RedisClusterFixture* cluster_ = nullptr;
  static inline absl::Status start_;
  RemoteTierHarness harness_;
};

TEST_F(RemoteTierTest, KvAppendedOnOneDaemonIsFetchedByteExactFromAnother) {
  DaemonProcess* a = StartDaemon(Seeds());
  DaemonProcess* b = StartDaemon(Seeds());
  ASSERT_NE(a, nullptr);
  ASSERT_NE(b, nullptr);
  auto on_a = H::ClientOf(*a), on_b = H::ClientOf(*b);
  const std::vector<uint32_t> tokens = MakeTokens(11, 6 * kBt + kBt / 2);
  H::Append(*on_a, tokens);
  // Daemon B never saw the prompt: a lookup that waits finds it in the
  // cluster (once A's write-back is done) and B serves it.
  EXPECT_EQ(H::MatchWithin(*on_b, tokens, 6 * kBt, absl::Seconds(20)), 6 * kBt);
  H::ExpectExact(*on_b, tokens);
  EXPECT_GE(H::Metric(*b, "kvcached_remote_adopted_blocks_total", "outcome=\"adopted\""), 6);
  EXPECT_GE(H::Metric(*a, "kvcached_remote_writes_total", "outcome=\"done\""), 6);
  // The blocks B adopted are not written back again by B.
  EXPECT_EQ(H::Metric(*b, "kvcached_remote_writes_total", "outcome=\"done\""), 0);
  // The operator sees the tier: kvcachectl status and the status page.
  CommandResult status =
      RunCommand(absl::StrCat(KVCACHECTL_BINARY, " --target ", b->unix_target(), " status"));
  EXPECT_EQ(status.exit_code, 0) << status.output;
  EXPECT_THAT(status.output, HasSubstr("breaker closed"));
  EXPECT_THAT(status.output, HasSubstr("6 blocks adopted"));
  CommandResult page =
      RunCommand(absl::StrCat("curl -sf http://127.0.0.1:", b->metrics_port(), "/status"));
  EXPECT_THAT(page.output, HasSubstr("<h2>Remote tier</h2>"));
  EXPECT_THAT(page.output, HasSubstr("6 blocks adopted"));
  // Another namespace addresses other keys: nothing of A's prompt.
  auto stranger = H::ClientOf(*b, "other");
  EXPECT_EQ(H::MatchWithin(*stranger, tokens, 1, absl::Milliseconds(300)), 0u);
}

TEST_F(RemoteTierTest, AValueAlteredInsideRedisIsAMissNeverWrongKv) {
  DaemonProcess* a = StartDaemon(Seeds());
  DaemonProcess* b = StartDaemon(Seeds());
  ASSERT_NE(a, nullptr);
  ASSERT_NE(b, nullptr);
  auto on_a = H::ClientOf(*a), on_b = H::ClientOf(*b);
  const std::vector<uint32_t> tokens = MakeTokens(12, 4 * kBt);
  H::Append(*on_a, tokens);
  // Wait for A's four writes, then flip a byte inside every value.
  H::AwaitWrites(*a, 4);
  int altered = 0;
  for (int i = 0; i < 3; ++i) {
    std::unique_ptr<RedisNode> node = cluster_->Node(i);
    ASSERT_NE(node, nullptr);
    absl::StatusOr<RespValue> keys = node->Run({"KEYS", "kvc:*"});
    ASSERT_TRUE(keys.ok()) << keys.status();
    for (const RespValue& key : keys->elements) {
      absl::StatusOr<RespValue> byte = node->Run({"GETRANGE", key.str, "100", "100"});
      ASSERT_TRUE(byte.ok() && byte->str.size() == 1);
      const std::string flipped(1, static_cast<char>(byte->str[0] ^ 0x20));
      ASSERT_TRUE(node->Run({"SETRANGE", key.str, "100", flipped}).ok());
      ++altered;
    }
  }
  ASSERT_EQ(altered, 4);
  EXPECT_EQ(H::MatchWithin(*on_b, tokens, 1, absl::Milliseconds(500)), 0u);
  EXPECT_GE(H::Metric(*b, "kvcached_remote_reads_total", "outcome=\"unreadable\""), 1);
  EXPECT_EQ(H::Metric(*b, "kvcached_remote_adopted_blocks_total", "outcome=\"adopted\""), 0);
}

TEST_F(RemoteTierTest, ADaemonKeyedDifferentlyFindsNothing) {
  DaemonProcess* a = StartDaemon(Seeds(), 'a');
  DaemonProcess* b = StartDaemon(Seeds(), 'b');
  ASSERT_NE(a, nullptr);
  ASSERT_NE(b, nullptr);
  auto on_a = H::ClientOf(*a), on_b = H::ClientOf(*b);
  const std::vector<uint32_t> tokens = MakeTokens(13, 3 * kBt);
  H::Append(*on_a, tokens);
  H::AwaitWrites(*a, 3);
  EXPECT_EQ(H::MatchWithin(*on_b, tokens, 1, absl::Milliseconds(300)), 0u);
  EXPECT_GE(H::Metric(*b, "kvcached_remote_reads_total", "outcome=\"absent\""), 1);
}

TEST_F(RemoteTierTest, AMasterKilledMidRunFailsOverAndNothingServedIsWrong) {
  DaemonProcess* a = StartDaemon(Seeds());
  // B reads from replicas: what was written before the kill stays readable
  // while the dead master's slots wait for their failover.
  DaemonProcess* b = StartDaemon(Seeds(), 'a', ", \"read_from_replicas\": true");
  ASSERT_NE(a, nullptr);
  ASSERT_NE(b, nullptr);
  auto on_a = H::ClientOf(*a), on_b = H::ClientOf(*b);
  const std::vector<uint32_t> before = MakeTokens(99, 8 * kBt);  // blocks on every master
  H::Append(*on_a, before);
  H::AwaitWrites(*a, 8);
  for (int i = 0; i < 3; ++i) ASSERT_TRUE(cluster_->Node(i)->Run({"WAIT", "1", "2000"}).ok());
  // Prompts appended through A during and after the failover; B looks each
  // up and fetches what it matched. Whatever B serves must be the appended
  // bytes; after the failover the cluster serves again.
  cluster_->KillNode(0);
  const absl::Time killed = absl::Now();
  EXPECT_EQ(H::MatchWithin(*on_b, before, 8 * kBt, absl::Seconds(1)), 8 * kBt);
  H::ExpectExact(*on_b, before);
  EXPECT_LT(absl::Now() - killed, absl::Seconds(2)) << "served only once failed over";
  // The old master comes back (as a replica of its successor) whatever happens here.
  struct Restart {
    ~Restart() { EXPECT_TRUE(cluster_->RestartNode(0).ok()); }
  } restart;
  for (int p = 0; p < 12; ++p) {
    const std::vector<uint32_t> tokens = MakeTokens(100 + p, 4 * kBt);
    H::Append(*on_a, tokens);
    const uint64_t matched = H::MatchWithin(*on_b, tokens, 4 * kBt, absl::Milliseconds(400));
    if (matched > 0) {
      std::vector<uint32_t> prefix(tokens.begin(), tokens.begin() + matched);
      H::ExpectExact(*on_b, prefix);
    }
  }
  // Failed over (the others may not even have marked it failed yet: then a
  // block written to its slots now would be lost, as a write during the
  // failover is).
  ASSERT_TRUE(cluster_->WaitForFailover(0).ok());
  const std::vector<uint32_t> after = MakeTokens(200, 4 * kBt);
  H::Append(*on_a, after);
  EXPECT_EQ(H::MatchWithin(*on_b, after, 4 * kBt, absl::Seconds(20)), 4 * kBt);
  H::ExpectExact(*on_b, after);
}

TEST_F(RemoteTierTest, ADaemonWhoseClusterIsDownServesItsOwnHits) {
  // Nothing listens on the seed: the daemon starts, and serves locally.
  DaemonProcess* c = StartDaemon({"127.0.0.1:1"});
  ASSERT_NE(c, nullptr);
  auto client = H::ClientOf(*c);
  const std::vector<uint32_t> tokens = MakeTokens(14, 3 * kBt);
  H::Append(*client, tokens);
  const absl::Time start = absl::Now();
  EXPECT_EQ(H::MatchWithin(*client, tokens, 3 * kBt, absl::Seconds(5)), 3 * kBt);
  H::ExpectExact(*client, tokens);
  // A prompt it does not hold: a miss, answered within the node timeouts.
  const std::vector<uint32_t> unknown = MakeTokens(15, 3 * kBt);
  EXPECT_EQ(H::MatchWithin(*client, unknown, 1, absl::ZeroDuration()), 0u);
  EXPECT_LT(absl::Now() - start, absl::Seconds(5));
  EXPECT_GE(H::Metric(*c, "kvcached_remote_reads_total", "outcome=\"unavailable\""), 1);
}

TEST_F(RemoteTierTest, AMisconfiguredRemoteTierStopsTheStartWithAClearMessage) {
  const std::string dir = absl::StrCat(::testing::TempDir(), "/remote-tier-bad-", ::getpid());
  std::filesystem::create_directories(dir);
  const std::string no_key = dir + "/no-key.json", missing = dir + "/missing-key.json";
  std::ofstream(no_key) << R"({"remote_tier": {"seeds": ["127.0.0.1:7000"]}})";
  std::ofstream(missing) << R"({"remote_tier": {"seeds": ["127.0.0.1:7000"], "key_file": ")" << dir
                         << R"(/absent.key"}})";
  CommandResult r = RunCommand(absl::StrCat(KvcachedPath(), " --config ", no_key));
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_THAT(r.output, HasSubstr("remote_tier.key_file is empty"));
  r = RunCommand(absl::StrCat(KvcachedPath(), " --unix-socket ", dir, "/k.sock --listen none",
                              " --metrics-address none --config ", missing));
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_THAT(r.output, HasSubstr("remote_tier.key_file"));
}

}  // namespace
}  // namespace kvcache::testing
