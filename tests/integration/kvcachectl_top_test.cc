// kvcachectl against the real daemon, for what scripts and an operator in an
// incident rely on: `top` (its frames, its JSON lines and their rates while
// traffic flows), one line of valid JSON from every subcommand's --json, and
// the exit codes (0 ok, 1 the call failed, 2 bad command line).
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <atomic>
#include <nlohmann/json.hpp>
#include <thread>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "tests/integration/daemon_process.h"
#include "tests/integration/kv_pattern.h"

namespace kvcache::testing {
namespace {

using ::testing::HasSubstr;

class KvcachectlTopTest : public ::testing::Test {
 protected:
  void SetUp() override {
    // An SSD tier too, so that the migrations table has a tier to show.
    auto d = DaemonProcess::Start({.ssd_bytes = uint64_t{64} << 20});
    ASSERT_TRUE(d.ok()) << d.status();
    daemon_ = *std::move(d);
    // gRPC, so that the calls are counted under the Cache service's methods.
    client_ = daemon_->NewClient("", DataPath::kGrpc);
    auto r = client_->RegisterModel("top-model", MakeLayout(2, 2, 32, v1::DTYPE_BF16, 16));
    ASSERT_TRUE(r.ok()) << r.status();
    block_bytes_ = r->block_bytes();
    tokens_.resize(64);
    for (uint32_t i = 0; i < 64; ++i) tokens_[i] = i;
    ASSERT_TRUE(
        client_->Append("top-model", tokens_, MakeKv(tokens_, 16, block_bytes_, 0, 4)).ok());
    ASSERT_TRUE(client_->Lookup("top-model", tokens_).ok());
  }
  void TearDown() override {
    client_.reset();
    if (daemon_ != nullptr) {
      EXPECT_EQ(daemon_->Stop(), 0);
    }
  }
  std::pair<int, std::string> Ctl(const std::string& args, bool with_stderr = true) {
    return RunShell(absl::StrCat(KVCACHECTL_BINARY, " --target ", daemon_->unix_target(), " ", args,
                                 with_stderr ? " 2>&1" : " 2>/dev/null"));
  }

  std::unique_ptr<DaemonProcess> daemon_;
  std::unique_ptr<Client> client_;
  std::vector<uint32_t> tokens_;
  uint64_t block_bytes_ = 0;
};

TEST_F(KvcachectlTopTest, PrintsFramesWithEverySection) {
  auto [code, out] = Ctl("top --iterations 3 --interval 0.2");
  ASSERT_EQ(code, 0) << out;
  // Three frames, separated by a blank line, each opening with the header.
  const std::vector<std::string> frames = absl::StrSplit(out, "\n\nkvcached ");
  ASSERT_EQ(frames.size(), 3u) << out;
  EXPECT_THAT(frames[0], HasSubstr("first sample: totals only; rates from the next frame on"));
  for (const std::string& frame : frames) {
    for (const char* section :
         {"\nRPCs ", "\nHit ratio ", "\nBytes ", "\nTiers\n", "\nMigrations ", "\nCompression\n"}) {
      EXPECT_THAT(frame, HasSubstr(section)) << frame;
    }
    EXPECT_THAT(frame, HasSubstr("top-model"));
    EXPECT_THAT(frame, HasSubstr("host "));
    EXPECT_THAT(frame, HasSubstr("ssd "));
  }
  EXPECT_THAT(frames[1], HasSubstr("rates over the last 0.2"));
  EXPECT_THAT(frames[2], HasSubstr("rates over the last 0.2"));
  EXPECT_EQ(out.find("\x1b["), std::string::npos) << "no terminal escapes into a pipe";
}

// Every number under `j` that is a rate (a key ending in _per_second or a
// ratio) is >= 0.
void ExpectRatesNonNegative(const nlohmann::json& j, const std::string& where) {
  if (j.is_object()) {
    for (const auto& [key, value] : j.items()) {
      if (value.is_number() && (absl::EndsWith(key, "_per_second") ||
                                absl::EndsWith(key, "ratio") || absl::EndsWith(key, "_us"))) {
        EXPECT_GE(value.get<double>(), 0) << where << "." << key;
      }
      ExpectRatesNonNegative(value, absl::StrCat(where, ".", key));
    }
  } else if (j.is_array()) {
    for (size_t i = 0; i < j.size(); ++i)
      ExpectRatesNonNegative(j[i], absl::StrCat(where, "[", i, "]"));
  }
}

TEST_F(KvcachectlTopTest, JsonFramesCarryRatesOfTheTrafficBetweenThem) {
  // Lookups (hits) and fetches from another thread while top polls.
  std::atomic<bool> stop{false};
  std::thread traffic([&] {
    auto worker = daemon_->NewClient("", DataPath::kGrpc);
    std::vector<std::byte> out(4 * block_bytes_);
    while (!stop.load()) {
      EXPECT_TRUE(worker->Lookup("top-model", tokens_).ok());
      EXPECT_TRUE(worker->Fetch("top-model", tokens_, out).ok());
      absl::SleepFor(absl::Milliseconds(5));
    }
  });
  auto [code, out] = Ctl("--json top --iterations 4 --interval 0.3", /*with_stderr=*/false);
  stop = true;
  traffic.join();
  ASSERT_EQ(code, 0) << out;
  const std::vector<std::string> lines = absl::StrSplit(out, '\n', absl::SkipEmpty());
  ASSERT_EQ(lines.size(), 4u) << out;
  for (size_t i = 0; i < lines.size(); ++i) {
    SCOPED_TRACE(absl::StrCat("frame ", i, ": ", lines[i]));
    const nlohmann::json j = nlohmann::json::parse(lines[i], nullptr, /*allow_exceptions=*/false);
    ASSERT_TRUE(j.is_object());
    ExpectRatesNonNegative(j, "frame");
    ASSERT_EQ(j["models"].size(), 1u);
    const nlohmann::json& model = j["models"][0];
    EXPECT_EQ(model["model"], "top-model");
    ASSERT_FALSE(j["tiers"].empty());
    EXPECT_EQ(j["tiers"][0]["name"], "host");
    EXPECT_GT(j["tiers"][0]["capacity_bytes"].get<uint64_t>(), 0u);
    if (i == 0) {
      EXPECT_TRUE(j["interval_seconds"].is_null());
      EXPECT_TRUE(model["hit_tokens_per_second"].is_null());
      continue;
    }
    EXPECT_NEAR(j["interval_seconds"].get<double>(), 0.3, 0.25);
    EXPECT_GT(model["hit_tokens_per_second"].get<double>(), 0);
    EXPECT_DOUBLE_EQ(model["hit_ratio"].get<double>(), 1.0);
    // Per-method rates, from GetStatsResponse.rpcs.
    ASSERT_TRUE(j["rpcs_reported"].get<bool>()) << "the daemon reports no per-method counters";
    bool lookup = false, fetch = false;
    for (const nlohmann::json& r : j["rpcs"]) {
      if (r["method"] == "Lookup") {
        lookup = true;
        EXPECT_GT(r["calls_per_second"].get<double>(), 0);
        EXPECT_GT(r["mean_latency_us"].get<double>(), 0);
      }
      if (r["method"] == "Fetch") {
        fetch = true;
        EXPECT_GT(r["calls_per_second"].get<double>(), 0);
      }
    }
    EXPECT_TRUE(lookup && fetch);
    EXPECT_GT(j["bytes_out_per_second"].get<double>(), 0);
    EXPECT_GT(j["calls_per_second"].get<double>(), 0);
  }
}

// On a terminal (a pty from script(1)) top redraws in place and quits on q
// or Ctrl-C with exit 0, the terminal's modes and cursor put back.
TEST_F(KvcachectlTopTest, OnATerminalRedrawsInPlaceAndQuitsOnQOrCtrlC) {
  // script(1) is util-linux's (Essential on Debian).
  ASSERT_EQ(RunShell("command -v script").first, 0) << "script(1) is not installed";
  for (const auto& [key, name] :
       std::vector<std::pair<std::string, std::string>>{{"q", "q"}, {"\\003", "Ctrl-C"}}) {
    SCOPED_TRACE(name);
    // The shell ignores SIGINT so that it outlives Ctrl-C (top installs its
    // own handler). Only the key ends top: without it the session runs until
    // `timeout 30` kills it (exit 124, no "top-exit"). `stty -a` after top
    // shows the modes it left behind.
    const std::string inner =
        absl::StrCat("trap \"\" INT; ", KVCACHECTL_BINARY, " --target ", daemon_->unix_target(),
                     " top --interval 0.2; echo top-exit=$?; stty -a");
    auto [code, out] =
        RunShell(absl::StrCat("(sleep 1.5; printf '", key, "'; sleep 6) | timeout 30 script -qec '",
                              inner, "' /dev/null 2>&1"));
    EXPECT_EQ(code, 0) << out;
    EXPECT_THAT(out, HasSubstr("top-exit=0")) << out;
    EXPECT_THAT(out, HasSubstr("\x1b[2J"));  // cleared once
    EXPECT_THAT(out, HasSubstr("\x1b[H"));   // then redrawn from home
    EXPECT_THAT(out, HasSubstr("(q: quit)"));
    EXPECT_THAT(out, HasSubstr("rates over the last"));  // several frames drawn
    EXPECT_THAT(out, HasSubstr("\x1b[?25h"));            // cursor shown again
    EXPECT_THAT(out, HasSubstr(" icanon"));              // line editing back
    EXPECT_THAT(out, HasSubstr(" echo"));
  }
}

// One line of valid JSON from each subcommand's --json, exit 0.
TEST_F(KvcachectlTopTest, EverySubcommandPrintsOneJsonLine) {
  for (const char* args :
       {"status", "stats", "tiers", "models", "lookup -m top-model --tokens 0-63",
        "policy -m top-model", "checkpoint list", "verify", "dump --no-file",
        "evict -m top-model --prefix-tokens 32-63", "unregister -m top-model"}) {
    SCOPED_TRACE(args);
    auto [code, out] = Ctl(absl::StrCat("--json ", args), /*with_stderr=*/false);
    EXPECT_EQ(code, 0) << out;
    ASSERT_FALSE(out.empty());
    EXPECT_EQ(out.find('\n'), out.size() - 1) << "one line: " << out;
    EXPECT_TRUE(nlohmann::json::accept(out)) << out;
  }
}

// Exit 1 with the gRPC code when the daemon is not there; 2 for a bad
// command line; 0 for --help and completion (which need no daemon).
TEST_F(KvcachectlTopTest, ExitCodesScriptsCanTrust) {
  const std::string dead = absl::StrCat(KVCACHECTL_BINARY, " --timeout 1 --target unix://",
                                        daemon_->dir(), "/none.sock ");
  for (const auto& [args, cmd] : std::vector<std::pair<std::string, std::string>>{
           {"status", "status"},
           {"stats", "stats"},
           {"tiers", "tiers"},
           {"models", "models"},
           {"lookup -m m --tokens 1", "lookup"},
           {"evict -m m --all", "evict"},
           {"unregister -m m", "unregister"},
           {"policy -m m", "policy"},
           {"checkpoint list", "checkpoint list"},
           {"verify", "verify"},
           {"dump --no-file", "dump"},
           {"attention -m m --tokens 0-15", "attention"},
           {"top --iterations 2 --interval 0.1", "top"},
           {"--json top --iterations 1", "top"}}) {
    SCOPED_TRACE(args);
    auto [code, out] = RunShell(dead + args + " 2>&1");
    EXPECT_EQ(code, 1) << out;
    EXPECT_THAT(out, HasSubstr(absl::StrCat("kvcachectl: ", cmd, ": UNAVAILABLE")));
  }
  for (const char* args : {"", "nonsense", "top --interval 0", "top --iterations -1", "lookup -m m",
                           "completion fish", "checkpoint later"}) {
    SCOPED_TRACE(args);
    auto [code, out] = RunShell(absl::StrCat(dead, args, " 2>&1"));
    EXPECT_EQ(code, 2) << out;
  }
  for (const char* args : {"--help", "top --help", "completion bash", "completion zsh"}) {
    SCOPED_TRACE(args);
    auto [code, out] = RunShell(absl::StrCat(dead, args, " 2>&1"));
    EXPECT_EQ(code, 0) << out;
  }
}

}  // namespace
}  // namespace kvcache::testing
