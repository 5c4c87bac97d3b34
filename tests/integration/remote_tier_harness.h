// RemoteTierHarness: what the remote tier's integration tests share: kvcached
// daemons whose remote tier points at a real Redis Cluster, a model whose
// blocks carry the kv_pattern bytes, and the checks on what they serve.
#ifndef KVCACHE_TESTS_INTEGRATION_REMOTE_TIER_HARNESS_H_
#define KVCACHE_TESTS_INTEGRATION_REMOTE_TIER_HARNESS_H_

#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "tests/integration/daemon_process.h"
#include "tests/integration/kv_pattern.h"

namespace kvcache::testing {

class RemoteTierHarness {
 public:
  static constexpr uint32_t kBt = 16;

  ~RemoteTierHarness() { StopAll(); }

  // Stops every daemon still running; each must drain cleanly.
  void StopAll() {
    for (auto& d : daemons_) {
      if (d != nullptr && d->Running()) {
        EXPECT_EQ(d->Stop(), 0) << "kvcached did not drain cleanly; log " << d->log_path();
      }
    }
  }

  // Starts a daemon as `options` says, whose remote tier uses `seeds` and a
  // key file of `digit`s (equal digits: one deployment); `extra` adds
  // fields to the remote_tier section (JSON, starting with a comma).
  DaemonProcess* StartDaemon(const std::vector<std::string>& seeds, char digit = 'a',
                             DaemonOptions options = {}, const std::string& extra = "") {
    const std::string dir =
        absl::StrCat(::testing::TempDir(), "/remote-tier-", ::getpid(), "-", daemons_.size());
    std::filesystem::create_directories(dir);
    const std::string key = dir + "/shared.key";
    std::ofstream(key) << std::string(64, digit) << "\n";
    ::chmod(key.c_str(), 0600);
    const std::string config = dir + "/config.json";
    std::ofstream(config) << "{\"remote_tier\": {\"seeds\": [\"" << absl::StrJoin(seeds, "\", \"")
                          << "\"], \"key_file\": \"" << key << "\", \"io_timeout_ms\": 300" << extra
                          << "}}";
    options.metrics = true;
    options.extra_flags.insert(options.extra_flags.end(), {"--config", config});
    auto d = DaemonProcess::Start(options);
    EXPECT_TRUE(d.ok()) << d.status();
    if (!d.ok()) return nullptr;
    daemons_.push_back(*std::move(d));
    return daemons_.back().get();
  }

  // A client of `d` with the test model registered.
  static std::unique_ptr<Client> ClientOf(const DaemonProcess& d, const std::string& ns = "") {
    std::unique_ptr<Client> client = d.NewClient(ns);
    EXPECT_NE(client, nullptr);
    auto r = client->RegisterModel("m", Layout());
    EXPECT_TRUE(r.ok()) << r.status();
    return client;
  }
  static v1::ModelLayout Layout() { return MakeLayout(2, 2, 32, v1::DTYPE_FP16, kBt); }
  static uint64_t BlockBytes() { return 2 * 2 * 2 * 32 * 2 * kBt; }

  // Appends the KV of the whole blocks of `tokens` through `client`.
  static void Append(Client& client, const std::vector<uint32_t>& tokens) {
    const size_t blocks = tokens.size() / kBt;
    auto appended = client.Append("m", tokens, MakeKv(tokens, kBt, BlockBytes(), 0, blocks));
    ASSERT_TRUE(appended.ok()) << appended.status();
    ASSERT_EQ(appended->stored_blocks, blocks);
  }

  // Looks `tokens` up through `client` with PREFETCH_WAIT until `want`
  // tokens match or `patience` passes; the last match.
  static uint64_t MatchWithin(Client& client, const std::vector<uint32_t>& tokens, uint64_t want,
                              absl::Duration patience) {
    const absl::Time deadline = absl::Now() + patience;
    uint64_t matched = 0;
    do {
      auto found = client.Lookup(
          "m", tokens, {.prefetch = v1::PREFETCH_WAIT, .prefetch_timeout = absl::Seconds(5)});
      EXPECT_TRUE(found.ok()) << found.status();
      matched = found.ok() ? found->matched_tokens : 0;
      if (matched >= want) return matched;
      absl::SleepFor(absl::Milliseconds(50));
    } while (absl::Now() < deadline);
    return matched;
  }

  // Fetches `tokens` through `client`: the whole blocks' KV must be the
  // pattern's, byte for byte.
  static void ExpectExact(Client& client, const std::vector<uint32_t>& tokens) {
    const size_t blocks = tokens.size() / kBt;
    std::vector<std::byte> out(blocks * BlockBytes());
    auto fetched = client.Fetch("m", tokens, out);
    ASSERT_TRUE(fetched.ok()) << fetched.status();
    ASSERT_EQ(fetched->matched_tokens, blocks * kBt);
    EXPECT_TRUE(out == MakeKv(tokens, kBt, BlockBytes(), 0, blocks)) << "fetched bytes differ";
  }

  // The sum of the samples of `family` with `label` (e.g. outcome="hit")
  // in `d`'s metrics (scraped from inside its network namespace).
  static double Metric(const DaemonProcess& d, const std::string& family,
                       const std::string& label) {
    const std::string ns = d.network_namespace();
    CommandResult r =
        RunCommand(absl::StrCat(ns.empty() ? "" : absl::StrCat("ip netns exec ", ns, " "),
                                "curl -sf http://127.0.0.1:", d.metrics_port(), "/metrics"));
    double sum = 0;
    std::istringstream lines(r.output);
    for (std::string line; std::getline(lines, line);) {
      if (line.rfind(family, 0) != 0 || line.find(label) == std::string::npos) continue;
      sum += std::stod(line.substr(line.rfind(' ') + 1));
    }
    return sum;
  }

  // Waits (up to 20 s) until `d` has written at least `blocks` blocks.
  static void AwaitWrites(const DaemonProcess& d, double blocks) {
    const absl::Time deadline = absl::Now() + absl::Seconds(20);
    while (Metric(d, "kvcached_remote_writes_total", "outcome=\"done\"") < blocks &&
           absl::Now() < deadline) {
      absl::SleepFor(absl::Milliseconds(50));
    }
  }

 private:
  std::vector<std::unique_ptr<DaemonProcess>> daemons_;
};

}  // namespace kvcache::testing

#endif  // KVCACHE_TESTS_INTEGRATION_REMOTE_TIER_HARNESS_H_
