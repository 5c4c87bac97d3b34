// The SSD tier with checkpoints on, through the real daemon and a real
// workload (kvcache-bench mixed over shared memory): a host tier and an SSD
// tier far smaller than what the workers append, a checkpoint every 2 s, and
// the SSD tier checked twice a second while the workers run. Space that
// checkpoints retain must not crowd out demotions: the tier stays at least
// half full and refuses under 1% of the writes (docs/checkpoints.md, "How
// retention and the SSD tier interact"). Then the daemon is SIGKILLed and
// restarted on the same files, after a checkpoint taken once the workers
// stopped: every SSD copy it lists re-attaches, and the workers' blocks are
// exactly what they appended. (A checkpoint taken under this churn lists
// copies whose retained space is soon reused; those fail to re-attach and
// are dropped, which checkpoint_test and ssd_store_test cover.)
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <string>
#include <thread>

#include "absl/strings/str_cat.h"
#include "tests/integration/daemon_process.h"
#include "tests/integration/kv_pattern.h"

namespace kvcache::testing {
namespace {

#ifdef KVCACHE_BENCH_BINARY
// Runs kvcache-bench against `target`; its exit code and output.
std::pair<int, std::string> Bench(const std::string& target, const std::string& args) {
  return RunShell(absl::StrCat(KVCACHE_BENCH_BINARY, " --target ", target, " ", args, " 2>&1"));
}

// The reproduction's workload, shorter: 128 KiB blocks, 4-block sequences.
constexpr char kLayout[] =
    "--model s --layers 8 --kv-heads 4 --head-dim 64 --block-tokens 16 --blocks-per-seq 4 "
    "--working-set 16 --seed 41";

class SsdRetentionTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = ::testing::TempDir() + "/ssd_retention_test_" + std::to_string(::getpid());
    std::filesystem::remove_all(dir_);
    std::filesystem::create_directories(dir_);
  }
  void TearDown() override {
    daemon_.reset();
    if (HasFailure()) {
      std::fprintf(stderr, "ssd_retention_test: files kept in %s\n", dir_.c_str());
    } else {
      std::filesystem::remove_all(dir_);
    }
  }

  // 32 MiB of host memory over a 64 MiB SSD file (496 slots of 132 KiB),
  // checkpoints every 2 s; both files in dir_, kept across daemons.
  void StartDaemon() {
    const std::string config = dir_ + "/config.json";
    std::FILE* f = std::fopen(config.c_str(), "w");
    ASSERT_NE(f, nullptr);
    std::fprintf(f, R"({"checkpoint": {"dir": "%s/ckpt", "interval_seconds": 2, "keep": 2}})",
                 dir_.c_str());
    std::fclose(f);
    auto d =
        DaemonProcess::Start({.capacity_bytes = 32 << 20,
                              .extra_flags = {"--config", config, "--ssd-path", dir_ + "/ssd.bin",
                                              "--ssd-capacity-bytes", std::to_string(64 << 20)}});
    ASSERT_TRUE(d.ok()) << d.status();
    daemon_ = *std::move(d);
  }

  std::string dir_;
  std::unique_ptr<DaemonProcess> daemon_;
};

TEST_F(SsdRetentionTest, WithCheckpointsTheSsdTierStaysUsefulAndARestartIsExact) {
  ASSERT_NO_FATAL_FAILURE(StartDaemon());
  std::unique_ptr<Client> client = daemon_->NewClient("", DataPath::kGrpc);

  std::atomic<bool> done{false};
  std::pair<int, std::string> bench;
  std::thread worker([&] {
    bench = Bench(daemon_->unix_target(),
                  absl::StrCat("mixed --transport shm --clients 4 --duration 15 ", kLayout));
    done = true;
  });
  // The SSD tier's use, twice a second, from the first time it is full.
  double peak = 0;
  double low_after_full = 1;
  int samples_after_full = 0;
  v1::TierStats ssd;
  while (!done.load()) {
    std::this_thread::sleep_for(std::chrono::milliseconds(500));
    auto stats = client->GetStats();
    ASSERT_TRUE(stats.ok()) << stats.status();
    const v1::TierStats* tier = FindTier(*stats, "ssd");
    ASSERT_NE(tier, nullptr);
    ssd = *tier;
    const double used = static_cast<double>(tier->used_bytes()) / tier->capacity_bytes();
    peak = std::max(peak, used);
    if (peak >= 0.9) {
      low_after_full = std::min(low_after_full, used);
      ++samples_after_full;
    }
  }
  worker.join();
  ASSERT_EQ(bench.first, 0) << bench.second;
  EXPECT_THAT(bench.second, ::testing::Not(::testing::HasSubstr("WRONG BYTES")));
  auto listed = client->ListCheckpoints();
  ASSERT_TRUE(listed.ok()) << listed.status();
  const uint64_t attempts = ssd.demotions() + ssd.write_failures();
  std::fprintf(stderr,
               "ssd_retention_test: %llu demotions, %llu refused writes, %llu SSD evictions, "
               "SSD used %.3f at the end, lowest %.3f over %d samples after it filled; "
               "%llu checkpoints committed\n",
               static_cast<unsigned long long>(ssd.demotions()),
               static_cast<unsigned long long>(ssd.write_failures()),
               static_cast<unsigned long long>(ssd.evictions()),
               static_cast<double>(ssd.used_bytes()) / ssd.capacity_bytes(), low_after_full,
               samples_after_full,
               static_cast<unsigned long long>(listed->status().checkpoints_ok()));
  ASSERT_GE(peak, 0.9) << "the workload never filled the SSD tier";
  ASSERT_GE(samples_after_full, 4);
  EXPECT_GE(listed->status().checkpoints_ok(), 2u) << "retention was never exercised";
  EXPECT_GE(ssd.demotions(), 3u * 496) << "the SSD tier did not turn over";
  EXPECT_GE(low_after_full, 0.5) << "retained space crowded out the SSD tier's blocks";
  EXPECT_LT(ssd.write_failures() * 100, attempts) << "1% or more of the demotions were refused";

  // A checkpoint taken wholly after the workload stopped lists SSD copies
  // that nothing reuses any more (the one in flight when it stopped may list
  // copies already overwritten: those fail to re-attach by design, and under
  // a loaded machine that may be all of them).
  const uint64_t quiet_after = listed->status().checkpoints_ok() + 2;
  for (int i = 0; i < 150; ++i) {
    auto l = client->ListCheckpoints();
    ASSERT_TRUE(l.ok()) << l.status();
    if (l->status().checkpoints_ok() >= quiet_after) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }

  // A crash, and a restart on the same files.
  client.reset();
  ASSERT_EQ(::kill(daemon_->pid(), SIGKILL), 0);
  daemon_.reset();
  ASSERT_NO_FATAL_FAILURE(StartDaemon());
  client = daemon_->NewClient("", DataPath::kGrpc);
  v1::CheckpointStatus restored;
  for (int i = 0; i < 600; ++i) {
    auto l = client->ListCheckpoints();
    ASSERT_TRUE(l.ok()) << l.status();
    restored = l->status();
    if (restored.restore_state() != "reattaching" && restored.restore_state() != "restoring") break;
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  std::fprintf(stderr,
               "ssd_retention_test: restart from checkpoint %llu: %s, %llu SSD copies "
               "re-attached, %llu did not verify, %llu blocks restored, %llu skipped\n",
               static_cast<unsigned long long>(restored.restore_sequence()),
               restored.restore_state().c_str(),
               static_cast<unsigned long long>(restored.reattached_copies()),
               static_cast<unsigned long long>(restored.reattach_failures()),
               static_cast<unsigned long long>(restored.restored_blocks()),
               static_cast<unsigned long long>(restored.restore_skipped_blocks()));
  EXPECT_EQ(restored.restore_state(), "done") << restored.restore_error();
  EXPECT_GT(restored.reattached_copies(), 0u);
  EXPECT_EQ(restored.reattach_failures(), 0u) << "a copy nothing overwrote did not verify";
  // The workers' working sets (same seed) come back with exactly their
  // bytes: every block re-appended is a duplicate without conflict, and every
  // byte fetched is checked.
  auto again = Bench(daemon_->unix_target(),
                     absl::StrCat("fetch --transport grpc --clients 4 --duration 1 ", kLayout));
  EXPECT_EQ(again.first, 0) << again.second;
  EXPECT_THAT(again.second, ::testing::Not(::testing::HasSubstr("WRONG BYTES")));
  auto stats = client->GetStats();
  ASSERT_TRUE(stats.ok()) << stats.status();
  EXPECT_EQ(stats->conflicting_appends(), 0u) << "a restored block holds other bytes";
  EXPECT_EQ(daemon_->Stop(), 0);
}
#endif  // KVCACHE_BENCH_BINARY

}  // namespace
}  // namespace kvcache::testing
