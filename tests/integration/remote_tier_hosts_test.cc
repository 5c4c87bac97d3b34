// The remote tier across hosts: two kvcached daemons, each in a network
// namespace of its own joined to this one by a veth pair on a bridge (the
// hosts), share a real Redis Cluster (3 masters, 3 replicas) listening on
// the bridge's address. KV appended on host A is fetched byte for byte on
// host B; host B cut off from the network keeps serving its own hits and
// answers misses within its timeouts, and finds new KV again once the
// network is back; host B restarted from its checkpoint serves what it had
// and rejoins. Needs root (network namespaces) and redis-server; skips
// without them.
#include <gtest/gtest.h>
#include <unistd.h>

#include <string>

#include "absl/strings/str_cat.h"
#include "server/common/status_macros.h"
#include "server/remote/redis_cluster_fixture.h"
#include "tests/integration/remote_tier_harness.h"

namespace kvcache::testing {
namespace {

using H = RemoteTierHarness;
constexpr uint32_t kBt = H::kBt;

// A bridge in this namespace and hosts behind it, each a network namespace
// with one veth end (the other end on the bridge). Names and the subnet
// carry the test's pid, so that runs at once do not collide.
class Hosts {
 public:
  Hosts() : tag_(absl::StrCat(::getpid() % 100000)), subnet_(20 + ::getpid() % 200) {}
  ~Hosts() { TearDown(); }

  absl::Status SetUp(int hosts) {
    TearDown();
    KVCACHE_RETURN_IF_ERROR(
        Run(absl::StrCat("ip link add ", Bridge(), " type bridge && ", "ip addr add ", Address(0),
                         "/24 dev ", Bridge(), " && ip link set ", Bridge(), " up")));
    for (int h = 1; h <= hosts; ++h) {
      KVCACHE_RETURN_IF_ERROR(Run(absl::StrCat(
          "ip netns add ", Namespace(h), " && ip link add ", Outer(h), " type veth peer name ",
          Inner(h), " && ip link set ", Inner(h), " netns ", Namespace(h), " && ip link set ",
          Outer(h), " master ", Bridge(), " up && ip -n ", Namespace(h), " addr add ", Address(h),
          "/24 dev ", Inner(h), " && ip -n ", Namespace(h), " link set ", Inner(h), " up && ip -n ",
          Namespace(h), " link set lo up")));
      ++hosts_;
    }
    return absl::OkStatus();
  }
  void TearDown() {
    for (int h = 1; h <= 8; ++h) {
      (void)RunCommand(absl::StrCat("ip netns del ", Namespace(h), " 2>/dev/null"));
    }
    (void)RunCommand(absl::StrCat("ip link del ", Bridge(), " 2>/dev/null"));
    hosts_ = 0;
  }

  // Host `h`'s link to the bridge down (cut off) or up.
  absl::Status Link(int h, bool up) {
    return Run(absl::StrCat("ip link set ", Outer(h), up ? " up" : " down"));
  }

  // The bridge's address (0: this namespace's) or host h's.
  std::string Address(int h) const { return absl::StrCat("10.203.", subnet_, ".", h + 1); }
  std::string Namespace(int h) const { return absl::StrCat("kvc-", tag_, "-", h); }

 private:
  static absl::Status Run(const std::string& command) {
    CommandResult r = RunCommand(command + " 2>&1");
    if (r.exit_code != 0) {
      return absl::InternalError(absl::StrCat(command, ": ", r.output));
    }
    return absl::OkStatus();
  }
  std::string Bridge() const { return absl::StrCat("kvcbr", tag_); }
  std::string Outer(int h) const { return absl::StrCat("kvc", tag_, "o", h); }
  std::string Inner(int h) const { return absl::StrCat("kvc", tag_, "i", h); }

  const std::string tag_;
  const int subnet_;
  int hosts_ = 0;
};

class RemoteTierHostsTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    if (::geteuid() != 0) {
      skip_ = "needs root for network namespaces";
    } else if (!RedisClusterFixture::Available()) {
      skip_ = "redis-server is not installed";
    } else if (RunCommand("command -v ip").exit_code != 0) {
      skip_ = "ip (iproute2) is not installed";
    }
    if (!skip_.empty()) return;
    hosts_ = new Hosts();
    start_ = hosts_->SetUp(2);
    if (!start_.ok()) return;
    cluster_ = new RedisClusterFixture();
    start_ = cluster_->Start(3, "", /*replicas=*/1, hosts_->Address(0));
  }
  static void TearDownTestSuite() {
    delete cluster_;
    cluster_ = nullptr;
    delete hosts_;
    hosts_ = nullptr;
  }
  void SetUp() override {
    if (!skip_.empty()) GTEST_SKIP() << skip_;
    ASSERT_TRUE(start_.ok()) << start_;
  }
  void TearDown() override { harness_.StopAll(); }

  DaemonProcess* StartOnHost(int h, std::vector<std::string> flags = {}) {
    return harness_.StartDaemon(
        {absl::StrCat(hosts_->Address(0), ":", cluster_->Port(0))}, 'c',
        {.extra_flags = std::move(flags), .network_namespace = hosts_->Namespace(h)});
  }

  static inline std::string skip_;
  static inline Hosts* hosts_ = nullptr;
  static inline RedisClusterFixture* cluster_ = nullptr;
  static inline absl::Status start_;
  RemoteTierHarness harness_;
};

TEST_F(RemoteTierHostsTest, KvCrossesHostsAndACutOffHostServesItsOwnHits) {
  DaemonProcess* a = StartOnHost(1);
  DaemonProcess* b = StartOnHost(2);
  ASSERT_NE(a, nullptr);
  ASSERT_NE(b, nullptr);
  auto on_a = H::ClientOf(*a), on_b = H::ClientOf(*b);
  const std::vector<uint32_t> first = MakeTokens(301, 5 * kBt);
  H::Append(*on_a, first);
  EXPECT_EQ(H::MatchWithin(*on_b, first, 5 * kBt, absl::Seconds(20)), 5 * kBt);
  H::ExpectExact(*on_b, first);

  // Host B cut off: its own hits are served as before, and a miss is
  // answered within its timeouts (a miss, not an error).
  ASSERT_TRUE(hosts_->Link(2, false).ok());
  const std::vector<uint32_t> second = MakeTokens(302, 5 * kBt);
  H::Append(*on_a, second);
  H::AwaitWrites(*a, 10);
  const absl::Time start = absl::Now();
  EXPECT_EQ(H::MatchWithin(*on_b, first, 5 * kBt, absl::ZeroDuration()), 5 * kBt);
  H::ExpectExact(*on_b, first);
  EXPECT_EQ(H::MatchWithin(*on_b, second, 1, absl::ZeroDuration()), 0u);
  EXPECT_LT(absl::Now() - start, absl::Seconds(3));
  EXPECT_GE(H::Metric(*b, "kvcached_remote_reads_total", "outcome=\"unavailable\""), 1);

  // Back on the network: B finds what A appended meanwhile.
  ASSERT_TRUE(hosts_->Link(2, true).ok());
  EXPECT_EQ(H::MatchWithin(*on_b, second, 5 * kBt, absl::Seconds(20)), 5 * kBt);
  H::ExpectExact(*on_b, second);
}

TEST_F(RemoteTierHostsTest, AHostRestartedFromItsCheckpointServesWhatItHadAndRejoins) {
  const std::string checkpoints =
      absl::StrCat(::testing::TempDir(), "/remote-tier-hosts-checkpoints-", ::getpid());
  std::filesystem::remove_all(checkpoints);
  DaemonProcess* a = StartOnHost(1);
  DaemonProcess* b = StartOnHost(2, {"--checkpoint-dir", checkpoints});
  ASSERT_NE(a, nullptr);
  ASSERT_NE(b, nullptr);
  auto on_a = H::ClientOf(*a);
  const std::vector<uint32_t> first = MakeTokens(311, 4 * kBt);
  H::Append(*on_a, first);
  {
    auto on_b = H::ClientOf(*b);
    ASSERT_EQ(H::MatchWithin(*on_b, first, 4 * kBt, absl::Seconds(20)), 4 * kBt);
  }
  ASSERT_EQ(b->Stop(), 0) << "log " << b->log_path();  // its last checkpoint holds `first`

  // A's write-backs gone from the cluster: what B serves now is its own.
  for (size_t i = 0; i < cluster_->ports().size(); ++i) {
    if (auto node = cluster_->Node(static_cast<int>(i)); node != nullptr) {
      (void)node->Run({"FLUSHALL"});
    }
  }
  b = StartOnHost(2, {"--checkpoint-dir", checkpoints});
  ASSERT_NE(b, nullptr);
  auto on_b = H::ClientOf(*b);
  EXPECT_EQ(H::MatchWithin(*on_b, first, 4 * kBt, absl::Seconds(20)), 4 * kBt);
  H::ExpectExact(*on_b, first);
  EXPECT_EQ(H::Metric(*b, "kvcached_remote_adopted_blocks_total", "outcome=\"adopted\""), 0);
  // And it shares again.
  const std::vector<uint32_t> next = MakeTokens(312, 4 * kBt);
  H::Append(*on_a, next);
  EXPECT_EQ(H::MatchWithin(*on_b, next, 4 * kBt, absl::Seconds(20)), 4 * kBt);
  H::ExpectExact(*on_b, next);
  std::filesystem::remove_all(checkpoints);
  std::filesystem::remove(checkpoints + ".secret");
}

}  // namespace
}  // namespace kvcache::testing
