// Checkpoints and restart through the real daemon: a cache over host memory
// and an SSD file is checkpointed, the daemon stops (SIGTERM) or is killed
// (SIGKILL at random moments, in the middle of appends, of SSD writes and of
// checkpoints), a new daemon starts on the same directory and SSD file, and
// every block fetched afterwards is checked byte for byte against what was
// appended; every block acknowledged before the last checkpoint that
// committed must be back.
//
// KVCACHE_CRASH_ROUNDS sets the number of kill/restart rounds of CrashLoop
// (default 3; the long run in docs/testing.md uses 50).
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>
#include <set>
#include <thread>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "server/checkpoint/checkpoint_format.h"
#include "server/checkpoint/manifest.h"
#include "server/security/daemon_secret.h"
#include "tests/integration/daemon_process.h"
#include "tests/integration/kv_pattern.h"

namespace kvcache::testing {
namespace {

constexpr uint32_t kBlockTokens = 16;
constexpr uint32_t kBlocksPerSequence = 4;

class CheckpointTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = ::testing::TempDir() + "/checkpoint_test_" + std::to_string(::getpid()) + "_" +
           ::testing::UnitTest::GetInstance()->current_test_info()->name();
    std::filesystem::remove_all(dir_);
    std::filesystem::create_directories(dir_);
  }
  void TearDown() override {
    client_.reset();
    daemon_.reset();
    // A failed test leaves its files (checkpoints, SSD file, daemon logs).
    if (HasFailure()) {
      std::fprintf(stderr, "checkpoint_test: files kept in %s\n", dir_.c_str());
    } else {
      std::filesystem::remove_all(dir_);
    }
  }

  // A daemon with a 4 MiB host tier over a `ssd_mib` MiB SSD file and
  // checkpoints every `interval_s` seconds, both in dir_ (kept across daemons).
  void StartDaemon(int interval_s, uint64_t ssd_mib = 128, bool metrics = false) {
    const std::string config = dir_ + "/config.json";
    std::FILE* f = std::fopen(config.c_str(), "w");
    ASSERT_NE(f, nullptr);
    // No metadata budget: with a 4 MiB host tier it would evict blocks once
    // about 1,600 are cached, and the crash loop counts on nothing leaving.
    std::fprintf(f, R"({"checkpoint": {"dir": "%s/ckpt", "interval_seconds": %d, "keep": 2,
                         "full_every": 3},
                        "host_tier": {"metadata_fraction": 0}})",
                 dir_.c_str(), interval_s);
    std::fclose(f);
    auto d = DaemonProcess::Start(
        {.capacity_bytes = 4 << 20,
         .slab_bytes = 1 << 20,
         .metrics = metrics,
         .extra_flags = {"--config", config, "--ssd-path", dir_ + "/ssd.bin",
                         "--ssd-capacity-bytes", std::to_string(ssd_mib << 20)}});
    ASSERT_TRUE(d.ok()) << d.status();
    daemon_ = *std::move(d);
    client_ = daemon_->NewClient();
    // 32 KiB blocks: 2 layers x 4 heads x 64 dims x fp16 x 2 x 16 tokens.
    auto r = client_->RegisterModel("m", MakeLayout(2, 4, 64, v1::DTYPE_FP16, kBlockTokens));
    ASSERT_TRUE(r.ok()) << r.status();
    block_bytes_ = r->block_bytes();
  }

  // Waits (up to 60 s) for the restore at start-up to finish.
  v1::CheckpointStatus WaitForRestore() {
    for (int i = 0; i < 6000; ++i) {
      auto listed = client_->ListCheckpoints();
      EXPECT_TRUE(listed.ok()) << listed.status();
      if (!listed.ok()) return {};
      const std::string& state = listed->status().restore_state();
      if (state != "reattaching" && state != "restoring") return listed->status();
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    ADD_FAILURE() << "the restore did not finish in 60 s";
    return {};
  }

  std::vector<uint32_t> Sequence(int s) const {
    return MakeTokens(7000 + s, kBlocksPerSequence * kBlockTokens);
  }
  absl::Status Append(Client& client, int s) {
    const std::vector<uint32_t> tokens = Sequence(s);
    return client
        .Append("m", tokens, MakeKv(tokens, kBlockTokens, block_bytes_, 0, kBlocksPerSequence))
        .status();
  }
  // Fetches sequence `s`, checks every byte it got, returns the blocks matched.
  size_t FetchVerified(int s) {
    return testing::FetchVerified(*client_, "m", Sequence(s), kBlockTokens, block_bytes_,
                                  kBlocksPerSequence, absl::StrCat("sequence ", s));
  }

  std::string dir_;
  std::unique_ptr<DaemonProcess> daemon_;
  std::unique_ptr<Client> client_;
  uint64_t block_bytes_ = 0;
};

// Far more than the host holds is appended, so most blocks are on SSD; a
// clean stop takes the final checkpoint; the next daemon serves every block
// again, its host payloads restored from the checkpoint and its SSD copies
// re-attached in place.
TEST_F(CheckpointTest, ARestartServesEveryBlockAgain) {
  ASSERT_NO_FATAL_FAILURE(StartDaemon(/*interval_s=*/0));
  constexpr int kSequences = 96;  // 12 MiB of KV over a 4 MiB host tier
  for (int s = 0; s < kSequences; ++s) ASSERT_TRUE(Append(*client_, s).ok()) << s;
  auto taken = client_->Checkpoint();
  ASSERT_TRUE(taken.ok()) << taken.status();
  EXPECT_EQ(taken->checkpoint().blocks(), kSequences * kBlocksPerSequence);
  EXPECT_TRUE(taken->checkpoint().full());
  auto stats = client_->GetStats();
  ASSERT_TRUE(stats.ok());
  ASSERT_EQ(stats->tiers_size(), 2);
  EXPECT_GT(stats->tiers(1).blocks(), 0u) << "nothing reached the SSD tier";
  // Block keys are keyed with the daemon's secret, which a restart keeps.
  auto keys = [&] {
    std::vector<uint64_t> out;
    auto r = client_->Lookup("m", Sequence(kSequences - 1));
    if (r.ok()) {
      for (const v1::BlockDescriptor& b : r->blocks) out.push_back(b.key());
    }
    return out;
  };
  const std::vector<uint64_t> keys_before = keys();
  ASSERT_EQ(keys_before.size(), kBlocksPerSequence);
  client_.reset();
  ASSERT_EQ(daemon_->Stop(), 0) << "log " << daemon_->log_path();

  ASSERT_NO_FATAL_FAILURE(StartDaemon(0));
  const v1::CheckpointStatus restored = WaitForRestore();
  EXPECT_EQ(keys(), keys_before);
  EXPECT_EQ(restored.restore_state(), "done") << restored.restore_error();
  EXPECT_GT(restored.reattached_copies(), 0u);
  EXPECT_EQ(restored.reattach_failures(), 0u);
  EXPECT_EQ(restored.restored_blocks(), kSequences * kBlocksPerSequence);
  for (int s = 0; s < kSequences; ++s) {
    EXPECT_EQ(FetchVerified(s), kBlocksPerSequence) << "sequence " << s << " was not restored";
  }
  // The incremental checkpoint after it refers to the payloads it did not change.
  auto next = client_->Checkpoint();
  ASSERT_TRUE(next.ok()) << next.status();
  EXPECT_FALSE(next->checkpoint().full());
  auto verified = client_->VerifyCheckpoint(0);
  ASSERT_TRUE(verified.ok()) << verified.status();
  EXPECT_EQ(verified->checkpoint().status(), "complete");
}

// What an operator sees: kvcachectl checkpoint now / list / verify / status,
// and the checkpoint metrics (linted by promtool).
TEST_F(CheckpointTest, OperatorsSeeCheckpointsInKvcachectlAndMetrics) {
  ASSERT_NO_FATAL_FAILURE(StartDaemon(0, 128, /*metrics=*/true));
  for (int s = 0; s < 8; ++s) ASSERT_TRUE(Append(*client_, s).ok());
  const std::string ctl =
      absl::StrCat(KVCACHECTL_BINARY, " --target ", daemon_->unix_target(), " --timeout 60 ");
  auto [now_code, now] = RunShell(ctl + "checkpoint now");
  EXPECT_EQ(now_code, 0) << now;
  EXPECT_THAT(now, ::testing::HasSubstr("checkpoint 1 committed (full): 32 blocks"));
  auto [list_code, list] = RunShell(ctl + "checkpoint list");
  EXPECT_EQ(list_code, 0) << list;
  EXPECT_THAT(list, ::testing::HasSubstr("1 taken, 0 failed"));
  EXPECT_THAT(list, ::testing::ContainsRegex("1 +complete"));
  auto [json_code, json] = RunShell(ctl + "--json checkpoint list");
  EXPECT_EQ(json_code, 0) << json;
  EXPECT_THAT(json, ::testing::HasSubstr(R"("status":"complete")"));
  auto [verify_code, verify] = RunShell(ctl + "checkpoint verify 1");
  EXPECT_EQ(verify_code, 0) << verify;
  EXPECT_THAT(verify, ::testing::HasSubstr("checkpoint 1: complete"));
  auto [missing_code, missing] = RunShell(ctl + "checkpoint verify 99");
  EXPECT_EQ(missing_code, 1) << missing;
  EXPECT_THAT(missing, ::testing::HasSubstr("NOT_FOUND"));
  auto [status_code, status] = RunShell(ctl + "status");
  EXPECT_EQ(status_code, 0) << status;
  EXPECT_THAT(status, ::testing::HasSubstr("restore:      off"));

  const std::string url = absl::StrCat("http://127.0.0.1:", daemon_->metrics_port(), "/metrics");
  auto [scraped, text] = RunShell("curl -sf " + url);
  ASSERT_EQ(scraped, 0);
  EXPECT_THAT(text, ::testing::HasSubstr(R"(kvcached_checkpoints_total{outcome="ok"} 1)"));
  EXPECT_THAT(text, ::testing::HasSubstr("kvcached_checkpoint_age_seconds "));
  EXPECT_THAT(text, ::testing::HasSubstr(R"(kvcached_checkpoint_restore_state{state="off"} 1)"));
  auto [lint, lint_output] = RunShell("curl -sf " + url + " | promtool check metrics");
  EXPECT_EQ(lint, 0) << lint_output;
}

// Checkpoints off: the calls say how to turn them on.
TEST(CheckpointOffTest, TheCallsSayHowToTurnThemOn) {
  auto d = DaemonProcess::Start({});
  ASSERT_TRUE(d.ok()) << d.status();
  std::unique_ptr<Client> client = (*d)->NewClient();
  auto taken = client->Checkpoint();
  EXPECT_EQ(taken.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(taken.status().message(), ::testing::HasSubstr("checkpoint.dir"));
  auto listed = client->ListCheckpoints();
  ASSERT_TRUE(listed.ok()) << listed.status();
  EXPECT_FALSE(listed->status().enabled());
  client.reset();
  EXPECT_EQ((*d)->Stop(), 0);
}

// A checkpoint's data file with a flipped byte is reported corrupt, and the
// restart restores from the one before it.
TEST_F(CheckpointTest, ACorruptCheckpointFallsBackToThePreviousOne) {
  ASSERT_NO_FATAL_FAILURE(StartDaemon(0));
  for (int s = 0; s < 8; ++s) ASSERT_TRUE(Append(*client_, s).ok());
  auto first = client_->Checkpoint();
  ASSERT_TRUE(first.ok()) << first.status();
  for (int s = 8; s < 16; ++s) ASSERT_TRUE(Append(*client_, s).ok());
  client_.reset();
  ASSERT_EQ(daemon_->Stop(), 0);  // the final checkpoint: the newest

  // Flip a byte in the middle of the newest data file.
  std::string newest;
  for (const auto& e : std::filesystem::directory_iterator(dir_ + "/ckpt")) {
    const std::string name = e.path().filename().string();
    if (name.ends_with(".data") && name > std::filesystem::path(newest).filename().string()) {
      newest = e.path().string();
    }
  }
  ASSERT_FALSE(newest.empty());
  {
    std::FILE* f = std::fopen(newest.c_str(), "r+b");
    ASSERT_NE(f, nullptr);
    std::fseek(f, 0, SEEK_END);
    const long size = std::ftell(f);
    std::fseek(f, size / 2, SEEK_SET);
    const int c = std::fgetc(f);
    std::fseek(f, size / 2, SEEK_SET);
    std::fputc(c ^ 0x5a, f);
    std::fclose(f);
  }
  ASSERT_NO_FATAL_FAILURE(StartDaemon(0));
  const v1::CheckpointStatus restored = WaitForRestore();
  EXPECT_EQ(restored.restore_state(), "done");
  EXPECT_NE(restored.restore_error(), "");
  for (int s = 0; s < 8; ++s) {
    EXPECT_EQ(FetchVerified(s), kBlocksPerSequence) << "sequence " << s << " was lost";
  }
  for (int s = 8; s < 16; ++s) FetchVerified(s);  // whatever is back is exact
}

mode_t ModeOf(const std::string& path) {
  struct stat st;
  EXPECT_EQ(::stat(path.c_str(), &st), 0) << path;
  return st.st_mode & 07777;
}

// Checkpoints hold every tenant's prompts: their folder is the daemon's alone
// and they restore only under the secret they were written under. Here the
// daemon runs under umask 0 (which would make files 0666): still 0700 and
// 0600. A checkpoint written under one secret does not restore under another.
TEST_F(CheckpointTest, CheckpointsAreTheDaemonsAloneAndNeedItsSecret) {
  const mode_t old_umask = ::umask(0);  // the daemon inherits it
  StartDaemon(0);
  ::umask(old_umask);
  ASSERT_FALSE(HasFatalFailure());
  for (int s = 0; s < 8; ++s) ASSERT_TRUE(Append(*client_, s).ok());
  ASSERT_TRUE(client_->Checkpoint().ok());
  client_.reset();
  ASSERT_EQ(daemon_->Stop(), 0);
  EXPECT_EQ(ModeOf(dir_ + "/ckpt"), 0700u);
  EXPECT_EQ(ModeOf(dir_ + "/ckpt.secret"), 0600u);
  EXPECT_EQ(ModeOf(dir_ + "/ssd.bin"), 0600u);
  int files = 0;
  for (const auto& e : std::filesystem::directory_iterator(dir_ + "/ckpt")) {
    EXPECT_EQ(ModeOf(e.path().string()), 0600u) << e.path();
    ++files;
  }
  EXPECT_GE(files, 4);  // two checkpoints: on demand and at the stop

  // Another secret: the checkpoints are refused, nothing is restored.
  const std::string secret = dir_ + "/ckpt.secret";
  std::filesystem::rename(secret, secret + ".kept");
  ASSERT_NO_FATAL_FAILURE(StartDaemon(0));  // creates a new secret
  const v1::CheckpointStatus refused = WaitForRestore();
  EXPECT_EQ(refused.restored_blocks(), 0u);
  EXPECT_THAT(refused.restore_error(), ::testing::HasSubstr("MAC mismatch"));
  for (int s = 0; s < 8; ++s) EXPECT_EQ(FetchVerified(s), 0u) << s;
  client_.reset();
  daemon_.reset();  // SIGKILL: no final checkpoint, the old ones stay

  // The right secret again: everything is back.
  std::filesystem::rename(secret + ".kept", secret);
  ASSERT_NO_FATAL_FAILURE(StartDaemon(0));
  const v1::CheckpointStatus restored = WaitForRestore();
  EXPECT_EQ(restored.restore_state(), "done") << restored.restore_error();
  for (int s = 0; s < 8; ++s) EXPECT_EQ(FetchVerified(s), kBlocksPerSequence) << s;
}

// A newest checkpoint whose manifest summary has the wrong JSON types, under a
// valid MAC (what a writer's bug could leave), over an SSD tier whose copies
// it lists: the daemon used to throw at start-up and crash-loop; it refuses
// that checkpoint and restores the one before it.
TEST_F(CheckpointTest, AMalformedManifestSummaryFallsBackInsteadOfCrashing) {
  ASSERT_NO_FATAL_FAILURE(StartDaemon(0));
  constexpr int kSequences = 48;  // 6 MiB of KV over a 4 MiB host tier: some on SSD
  for (int s = 0; s < kSequences; ++s) ASSERT_TRUE(Append(*client_, s).ok()) << s;
  client_.reset();
  ASSERT_EQ(daemon_->Stop(), 0);  // the final checkpoint: 1
  ASSERT_NO_FATAL_FAILURE(StartDaemon(0));
  ASSERT_EQ(WaitForRestore().restore_state(), "done");
  client_.reset();
  ASSERT_EQ(daemon_->Stop(), 0);  // checkpoint 2, the newest

  // Rewrite checkpoint 2's summary under the daemon's own key.
  std::FILE* f = std::fopen((dir_ + "/ckpt.secret").c_str(), "r");
  ASSERT_NE(f, nullptr);
  char hex[65] = {};
  ASSERT_EQ(std::fread(hex, 1, 64, f), 64u);
  std::fclose(f);
  const std::string raw = absl::HexStringToBytes(absl::string_view(hex, 64));
  SecretKey secret;
  std::memcpy(secret.data(), raw.data(), secret.size());
  const SecretKey key = DaemonSecret::FromBytes(secret).Derive("checkpoint-mac");
  const std::string path = dir_ + "/ckpt/" + checkpoint::ManifestFileName(2);
  std::ifstream in(path, std::ios::binary);
  const std::string text((std::istreambuf_iterator<char>(in)), {});
  in.close();
  auto m = checkpoint::DecodeManifest(text, 2, key, "test");
  ASSERT_TRUE(m.ok()) << m.status();
  ASSERT_FALSE(m->summary["lower_index"].empty()) << "checkpoint 2 lists no SSD copies";
  m->summary["model_keys"] = nlohmann::json::parse("[[1, 2]]");
  std::ofstream(path, std::ios::binary | std::ios::trunc) << checkpoint::EncodeManifest(*m, key);

  ASSERT_NO_FATAL_FAILURE(StartDaemon(0));
  const v1::CheckpointStatus restored = WaitForRestore();
  EXPECT_EQ(restored.restore_state(), "done") << restored.restore_error();
  EXPECT_EQ(restored.restore_sequence(), 1u);
  EXPECT_THAT(restored.restore_error(), ::testing::HasSubstr("manifest summary"));
  for (int s = 0; s < kSequences; ++s) EXPECT_EQ(FetchVerified(s), kBlocksPerSequence) << s;
}

// The daemon refuses a checkpoint folder that others may enter (here mode
// 0770, what the unit's UMask=0007 gave folders before), naming it and the fix.
TEST_F(CheckpointTest, AFolderOthersMayEnterStopsTheStart) {
  ASSERT_TRUE(std::filesystem::create_directory(dir_ + "/ckpt"));
  ASSERT_EQ(::chmod((dir_ + "/ckpt").c_str(), 0770), 0);
  const std::string config = dir_ + "/config.json";
  std::FILE* f = std::fopen(config.c_str(), "w");
  ASSERT_NE(f, nullptr);
  std::fprintf(f, R"({"checkpoint": {"dir": "%s/ckpt"}})", dir_.c_str());
  std::fclose(f);
  const CommandResult run = RunCommand(absl::StrCat(
      "timeout 30 ", KvcachedPath(), " --config ", config, " --unix-socket ", dir_,
      "/kvcached.sock --listen none", " --metrics-address none --capacity-bytes 4194304 2>&1"));
  EXPECT_EQ(run.exit_code, 2) << run.output;
  EXPECT_THAT(run.output, ::testing::HasSubstr(dir_ + "/ckpt has mode 0770"));
  EXPECT_THAT(run.output, ::testing::HasSubstr("chmod 700"));
  EXPECT_EQ(ModeOf(dir_ + "/ckpt"), 0770u);  // refused, not changed behind the operator's back
}

// Workers append while the daemon checkpoints every second; it is SIGKILLed
// at a random moment (sometimes while an on-demand checkpoint is being
// written), restarted on the same files, checked, and killed again.
TEST_F(CheckpointTest, CrashLoop) {
  const char* env = std::getenv("KVCACHE_CRASH_ROUNDS");
  const int rounds = env != nullptr ? std::atoi(env) : 3;
  std::mt19937 rng(::testing::UnitTest::GetInstance()->random_seed());
  int next_sequence = 0;
  // Sequences a committed checkpoint holds (the worker's, appended after the
  // last checkpoint the test waited for, may or may not be back).
  std::set<int> committed;
  for (int round = 0; round < rounds; ++round) {
    SCOPED_TRACE(absl::StrCat("round ", round));
    ASSERT_NO_FATAL_FAILURE(StartDaemon(/*interval_s=*/1, /*ssd_mib=*/1024));
    const v1::CheckpointStatus restored = WaitForRestore();
    ASSERT_NE(restored.restore_state(), "failed") << restored.restore_error();
    for (int s = 0; s < next_sequence; ++s) {
      const size_t blocks = FetchVerified(s);
      if (committed.contains(s)) {
        EXPECT_EQ(blocks, kBlocksPerSequence)
            << "sequence " << s << " was in a committed checkpoint and is gone; restored "
            << restored.ShortDebugString();
      }
    }
    // Some sequences, then a checkpoint the test waits for.
    const int burst = 8 + static_cast<int>(rng() % 24);
    const int first = next_sequence;
    for (int i = 0; i < burst; ++i) ASSERT_TRUE(Append(*client_, next_sequence++).ok());
    auto taken = client_->Checkpoint();
    ASSERT_TRUE(taken.ok()) << taken.status();
    for (int s = first; s < next_sequence; ++s) committed.insert(s);
    // Then a worker appends until the kill, and one round in two an
    // on-demand checkpoint is in flight when it lands.
    std::atomic<bool> stop{false};
    std::thread worker([&, start = next_sequence] {
      std::unique_ptr<Client> c = daemon_->NewClient();
      for (int s = start; !stop.load() && s < start + 100; ++s) {
        if (!Append(*c, s).ok()) break;
      }
    });
    std::thread checkpointer;
    if (round % 2 == 1) {
      checkpointer = std::thread([&] {
        std::unique_ptr<Client> c = daemon_->NewClient();
        (void)c->Checkpoint();
      });
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(50 + rng() % 1500));
    ASSERT_EQ(::kill(daemon_->pid(), SIGKILL), 0);
    stop = true;
    worker.join();
    if (checkpointer.joinable()) checkpointer.join();
    next_sequence += 100;  // whatever the worker reached; fetched exactly next round
    client_.reset();
    std::filesystem::copy_file(daemon_->log_path(), absl::StrCat(dir_, "/round", round, ".log"));
    daemon_.reset();
    if (HasFailure()) return;
  }
  // A last restart checks the final round.
  ASSERT_NO_FATAL_FAILURE(StartDaemon(0, 1024));
  const v1::CheckpointStatus restored = WaitForRestore();
  ASSERT_NE(restored.restore_state(), "failed") << restored.restore_error();
  for (int s = 0; s < next_sequence; ++s) {
    const size_t blocks = FetchVerified(s);
    if (committed.contains(s)) {
      EXPECT_EQ(blocks, kBlocksPerSequence)
          << "sequence " << s << "; restored " << restored.ShortDebugString();
    }
  }
}

}  // namespace
}  // namespace kvcache::testing
