// What operators touch: kvcachectl against the real daemon, and a Prometheus
// scrape of the metrics endpoint checked by promtool.
#include <gmock/gmock.h>
#include <google/protobuf/util/json_util.h>
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <array>
#include <cstdio>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "tests/integration/daemon_process.h"
#include "tests/integration/kv_pattern.h"

namespace kvcache::testing {
namespace {

using ::testing::HasSubstr;

class OpsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto d = DaemonProcess::Start({.metrics = true});
    ASSERT_TRUE(d.ok()) << d.status();
    daemon_ = *std::move(d);
    client_ = daemon_->NewClient();
    const v1::ModelLayout layout = MakeLayout(2, 2, 32, v1::DTYPE_BF16, 16);
    auto r = client_->RegisterModel("llama-test", layout);
    ASSERT_TRUE(r.ok()) << r.status();
    tokens_.resize(64);
    for (uint32_t i = 0; i < 64; ++i) tokens_[i] = i;  // "0-63" on the command line
    ASSERT_TRUE(
        client_->Append("llama-test", tokens_, MakeKv(tokens_, 16, r->block_bytes(), 0, 4)).ok());
  }
  void TearDown() override {
    client_.reset();
    if (daemon_ != nullptr) {
      EXPECT_EQ(daemon_->Stop(), 0);
    }
  }
  CommandResult Ctl(const std::string& args) {
    return RunCommand(
        absl::StrCat(KVCACHECTL_BINARY, " --target ", daemon_->unix_target(), " ", args));
  }

  std::unique_ptr<DaemonProcess> daemon_;
  std::unique_ptr<Client> client_;
  std::vector<uint32_t> tokens_;
};

TEST_F(OpsTest, KvcachectlReadsAndEvicts) {
  CommandResult status = Ctl("status");
  EXPECT_EQ(status.exit_code, 0) << status.output;
  EXPECT_THAT(status.output, HasSubstr("SERVING"));

  CommandResult models = Ctl("models");
  EXPECT_EQ(models.exit_code, 0) << models.output;
  EXPECT_THAT(models.output, HasSubstr("llama-test"));

  CommandResult stats = Ctl("--json stats");
  ASSERT_EQ(stats.exit_code, 0) << stats.output;
  v1::GetStatsResponse parsed;
  ASSERT_TRUE(google::protobuf::util::JsonStringToMessage(stats.output, &parsed).ok())
      << stats.output;
  ASSERT_EQ(parsed.models_size(), 1);
  EXPECT_EQ(parsed.models(0).blocks(), 4u);
  EXPECT_EQ(parsed.tiers(0).name(), "host");

  CommandResult lookup = Ctl("--json lookup --model llama-test --tokens 0-63");
  ASSERT_EQ(lookup.exit_code, 0) << lookup.output;
  EXPECT_THAT(lookup.output, HasSubstr("\"matched_tokens\":\"64\""));

  CommandResult from_stdin =
      RunCommand(absl::StrCat(KVCACHECTL_BINARY, " --target ", daemon_->unix_target(),
                              " lookup --model llama-test --tokens-file -"),
                 "0-31");
  EXPECT_EQ(from_stdin.exit_code, 0) << from_stdin.output;
  EXPECT_THAT(from_stdin.output, HasSubstr("32"));

  CommandResult evict = Ctl("evict --model llama-test --prefix-tokens 0-31");
  ASSERT_EQ(evict.exit_code, 0) << evict.output;
  EXPECT_EQ(client_->Lookup("llama-test", tokens_)->matched_tokens, 16u);

  CommandResult evict_all = Ctl("--json evict --model llama-test --all");
  ASSERT_EQ(evict_all.exit_code, 0) << evict_all.output;
  EXPECT_EQ(client_->Lookup("llama-test", tokens_)->matched_tokens, 0u);
}

TEST_F(OpsTest, KvcachectlUnregistersAModelSoItCanBeRegisteredWithAnotherLayout) {
  auto leased = client_->Lookup("llama-test", tokens_, {.acquire_lease = true});
  ASSERT_TRUE(leased.ok()) << leased.status();

  CommandResult unknown = Ctl("unregister -m llama-test --namespace other");
  EXPECT_EQ(unknown.exit_code, 1) << unknown.output;
  EXPECT_THAT(unknown.output, HasSubstr("NOT_FOUND"));

  CommandResult unregistered = Ctl("unregister -m llama-test");
  ASSERT_EQ(unregistered.exit_code, 0) << unregistered.output;
  EXPECT_THAT(unregistered.output, HasSubstr("unregistered model 'llama-test': evicted 4 blocks"));
  EXPECT_THAT(unregistered.output, HasSubstr("released 1 leases"));
  EXPECT_EQ(client_->GetStats()->models_size(), 0);
  EXPECT_EQ(client_->GetStats()->active_leases(), 0u);

  // A worker with the right layout registers the id anew (a fresh client:
  // client_ remembers the old layout and would register that again).
  auto worker = daemon_->NewClient();
  const v1::ModelLayout layout = MakeLayout(4, 2, 64, v1::DTYPE_FP16, 32);
  auto reg = worker->RegisterModel("llama-test", layout);
  ASSERT_TRUE(reg.ok()) << reg.status();
  EXPECT_TRUE(reg->created());
  ASSERT_TRUE(
      worker->Append("llama-test", tokens_, MakeKv(tokens_, 32, reg->block_bytes(), 0, 2)).ok());
  std::vector<std::byte> out(2 * reg->block_bytes());
  auto fetched = worker->Fetch("llama-test", tokens_, out);
  ASSERT_TRUE(fetched.ok()) << fetched.status();
  EXPECT_EQ(fetched->matched_tokens, 64u);
  EXPECT_TRUE(out == MakeKv(tokens_, 32, reg->block_bytes(), 0, 2));

  CommandResult json = Ctl("--json unregister -m llama-test");
  ASSERT_EQ(json.exit_code, 0) << json.output;
  EXPECT_THAT(json.output, HasSubstr("\"evicted_blocks\":\"2\""));
}

TEST_F(OpsTest, KvcachectlReportsErrorsWithExitCodes) {
  CommandResult unknown = Ctl("lookup --model nope --tokens 1,2,3");
  EXPECT_EQ(unknown.exit_code, 1);
  EXPECT_THAT(unknown.output, HasSubstr("NOT_FOUND"));
  CommandResult unaligned = Ctl("evict --model llama-test --prefix-tokens 0-20");
  EXPECT_EQ(unaligned.exit_code, 1);
  EXPECT_THAT(unaligned.output, HasSubstr("INVALID_ARGUMENT"));
  CommandResult usage = Ctl("lookup");
  EXPECT_EQ(usage.exit_code, 2) << usage.output;
  CommandResult down = RunCommand(
      absl::StrCat(KVCACHECTL_BINARY, " --timeout 1 --target unix:///nonexistent.sock status"));
  EXPECT_NE(down.exit_code, 0);
}

TEST_F(OpsTest, MetricsEndpointServesValidPrometheusText) {
  // Some traffic, including an error, so the RPC families have samples. The
  // client reaches the daemon over its Unix socket, so its data calls take the
  // shared-memory path and are counted under the Shm* methods.
  ASSERT_TRUE(client_->Lookup("llama-test", tokens_).ok());
  EXPECT_FALSE(client_->Lookup("unknown-model", tokens_).ok());
  const std::string url = absl::StrCat("http://127.0.0.1:", daemon_->metrics_port(), "/metrics");
  CommandResult scrape = RunCommand("curl -sf " + url);
  ASSERT_EQ(scrape.exit_code, 0) << scrape.output;
  for (const char* name :
       {"kvcached_rpcs_total{code=\"OK\",method=\"ShmAppendFrom\"} 1",
        "kvcached_rpcs_total{code=\"NOT_FOUND\",method=\"ShmLookup\"} 1",
        "kvcached_rpcs_total{code=\"OK\",method=\"RegisterModel\"} 1",
        "kvcached_rpc_latency_seconds_bucket", "kvcached_rpc_payload_bytes_total",
        "kvcached_lookup_hit_tokens_total{namespace=\"default\",model=\"llama-test\"} 64",
        "kvcached_model_blocks{namespace=\"default\",model=\"llama-test\"} 4",
        "kvcached_tier_capacity_bytes{tier=\"host\"}", "kvcached_tier_used_bytes{tier=\"host\"}",
        "kvcached_capacity_evictions_total", "kvcached_rejected_appends_total",
        "kvcached_active_leases"}) {
    EXPECT_THAT(scrape.output, HasSubstr(name));
  }
  // promtool (Debian's prometheus package) is the independent judge of the format.
  CommandResult lint = RunCommand("curl -sf " + url + " | promtool check metrics");
  EXPECT_EQ(lint.exit_code, 0) << lint.output;
}

}  // namespace
}  // namespace kvcache::testing
