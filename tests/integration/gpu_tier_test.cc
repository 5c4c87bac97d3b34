// The GPU tier through the real daemon, on the host-memory stand-in for a
// device: workers in this process open a DeviceSession over their own
// stand-in, map the daemon's arenas through the stand-in's IPC (the daemon's
// memfds, opened through /proc) and copy blocks device to device; every byte
// is compared with what was appended. Also the start-up path for a device
// that is not usable, kvcachectl tiers and the metrics.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <atomic>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <random>
#include <sstream>
#include <thread>

#include "absl/strings/str_cat.h"
#include "kvcache/device_session.h"
#include "kvcache/gpu/device_memory.h"
#include "tests/integration/daemon_process.h"
#include "tests/integration/kv_pattern.h"

namespace kvcache::testing {
namespace {

using ::testing::HasSubstr;

constexpr uint32_t kBlockTokens = 16;
constexpr uint32_t kBlocksPerSequence = 8;

std::string WriteConfig(const std::string& name, const std::string& json) {
  const std::string path = ::testing::TempDir() + "/" + name;
  std::FILE* f = std::fopen(path.c_str(), "w");
  EXPECT_NE(f, nullptr);
  if (f != nullptr) {
    std::fputs(json.c_str(), f);
    std::fclose(f);
  }
  return path;
}

// A worker: its own client, its own stand-in device with an arena for the KV
// it fetches, and a session over the daemon's GPU tier.
struct Worker {
  std::unique_ptr<Client> client;
  std::unique_ptr<gpu::DeviceMemory> device = gpu::NewHostStandInMemory();
  gpu::Arena kv;  // the worker's own KV buffer, on its device
  std::unique_ptr<DeviceSession> session;
};

class GpuTierDaemonTest : public ::testing::Test {
 protected:
  // Host memory 16 MiB over a GPU tier of `gpu_bytes` in 1 MiB slabs.
  void StartDaemon(uint64_t gpu_bytes) {
    const std::string config = WriteConfig(
        "gpu_tier_test.json",
        absl::StrCat(R"({"gpu_tier": {"kind": "host_stand_in", "capacity_bytes": )", gpu_bytes,
                     R"(, "slab_bytes": 1048576, "arena_bytes": 1048576}})"));
    auto d = DaemonProcess::Start(
        {.capacity_bytes = 16 << 20, .metrics = true, .extra_flags = {"--config", config}});
    ASSERT_TRUE(d.ok()) << d.status();
    daemon_ = *std::move(d);
    client_ = daemon_->NewClient();
    // 64 KiB blocks: 2 layers x 8 heads x 64 dims x fp16 x 2 (K and V) x 16 tokens.
    auto r = client_->RegisterModel("m", MakeLayout(2, 8, 64, v1::DTYPE_FP16, kBlockTokens));
    ASSERT_TRUE(r.ok()) << r.status();
    block_bytes_ = r->block_bytes();
  }
  void TearDown() override {
    client_.reset();
    if (daemon_ != nullptr) {
      EXPECT_EQ(daemon_->Stop(), 0) << "log " << daemon_->log_path();
    }
  }

  std::vector<uint32_t> Sequence(int s) const {
    return MakeTokens(5000 + s, kBlocksPerSequence * kBlockTokens);
  }
  void AppendSequence(Client& client, int s) {
    const std::vector<uint32_t> tokens = Sequence(s);
    auto r = client.Append("m", tokens,
                           MakeKv(tokens, kBlockTokens, block_bytes_, 0, kBlocksPerSequence));
    ASSERT_TRUE(r.ok()) << "sequence " << s << ": " << r.status();
  }
  std::unique_ptr<Worker> NewWorker() {
    auto w = std::make_unique<Worker>();
    w->client = daemon_->NewClient();
    EXPECT_TRUE(w->device->AllocateArena(kBlocksPerSequence * block_bytes_, &w->kv).ok());
    auto session = DeviceSession::Open(w->client.get(), w->device.get());
    EXPECT_TRUE(session.ok()) << session.status();
    if (session.ok()) w->session = *std::move(session);
    return w;
  }
  // The worker's KV buffer holds exactly the appended bytes of sequence `s`'s
  // first `blocks` blocks (stand-in device memory is host-addressable).
  ::testing::AssertionResult Holds(const Worker& w, int s, uint64_t blocks) {
    const std::vector<std::byte> want =
        MakeKv(Sequence(s), kBlockTokens, block_bytes_, 0, static_cast<uint32_t>(blocks));
    if (std::memcmp(w.kv.base, want.data(), want.size()) != 0) {
      return ::testing::AssertionFailure() << "sequence " << s << " differs on the device";
    }
    return ::testing::AssertionSuccess();
  }
  std::span<std::byte> Buffer(Worker& w) { return {w.kv.base, w.kv.bytes}; }

  std::unique_ptr<DaemonProcess> daemon_;
  std::unique_ptr<Client> client_;
  uint64_t block_bytes_ = 0;
};

TEST_F(GpuTierDaemonTest, AWorkerCopiesCachedBlocksFromTheDaemonsDeviceMemory) {
  StartDaemon(8 << 20);
  for (int s = 0; s < 4; ++s) AppendSequence(*client_, s);
  std::unique_ptr<Worker> w = NewWorker();
  ASSERT_NE(w->session, nullptr);
  for (int s = 0; s < 4; ++s) {
    std::memset(w->kv.base, 0, w->kv.bytes);
    auto r = w->session->FetchToDevice("m", Sequence(s), Buffer(*w), {.verify = true});
    ASSERT_TRUE(r.ok()) << r.status();
    EXPECT_EQ(r->matched_tokens, kBlocksPerSequence * kBlockTokens);
    EXPECT_EQ(r->copied_into_tier, kBlocksPerSequence);
    EXPECT_TRUE(Holds(*w, s, kBlocksPerSequence));
  }
  // Again: the blocks are in the GPU tier already.
  auto again = w->session->FetchToDevice("m", Sequence(2), Buffer(*w));
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(again->copied_into_tier, 0u);
  EXPECT_TRUE(Holds(*w, 2, kBlocksPerSequence));
  EXPECT_EQ(w->session->mapped_arenas(), 2u);  // 32 blocks of 64 KiB in 1 MiB arenas

  // A prefix longer than the cache matches what is cached; a buffer too
  // small is refused; an unknown model is NOT_FOUND.
  std::vector<uint32_t> longer = Sequence(1);
  longer.insert(longer.end(), kBlockTokens * 2, 7);
  auto partial = w->session->FetchToDevice("m", longer, Buffer(*w));
  ASSERT_TRUE(partial.ok());
  EXPECT_EQ(partial->matched_tokens, kBlocksPerSequence * kBlockTokens);
  EXPECT_EQ(
      w->session->FetchToDevice("m", Sequence(1), Buffer(*w).first(block_bytes_)).status().code(),
      absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(w->session->FetchToDevice("nope", Sequence(1), Buffer(*w)).status().code(),
            absl::StatusCode::kNotFound);

  auto stats = client_->GetStats();
  ASSERT_TRUE(stats.ok());
  const v1::TierStats* gpu = FindTier(*stats, "gpu");
  ASSERT_NE(gpu, nullptr);
  EXPECT_EQ(gpu->blocks(), 4u * kBlocksPerSequence);
  EXPECT_EQ(gpu->promotions(), 4u * kBlocksPerSequence);
  EXPECT_GE(gpu->placement_hits(), kBlocksPerSequence);
  EXPECT_EQ(gpu->capacity_bytes(), 8u << 20);
  EXPECT_EQ(stats->active_leases(), 0u);  // every lease released
  // The host tier's memory the blocks were placed from is registered with
  // the device (gpu_tier.pin_host_memory, on by default).
  const v1::TierStats* host = FindTier(*stats, "host");
  ASSERT_NE(host, nullptr);
  EXPECT_GE(host->pinned_bytes(), host->used_bytes());
  EXPECT_GT(host->pinned_bytes(), 0u);
  EXPECT_EQ(host->pin_failures(), 0u);

  auto [tiers_code, tiers] =
      RunShell(absl::StrCat(KVCACHECTL_BINARY, " --target ", daemon_->unix_target(), " tiers"));
  EXPECT_EQ(tiers_code, 0) << tiers;
  EXPECT_THAT(tiers, HasSubstr("gpu"));
  auto [curl_code, metrics] =
      RunShell(absl::StrCat("curl -sf http://127.0.0.1:", daemon_->metrics_port(), "/metrics"));
  EXPECT_EQ(curl_code, 0);
  EXPECT_THAT(metrics, HasSubstr("kvcached_gpu_placements_total 32"));
  EXPECT_THAT(metrics, HasSubstr("kvcached_tier_blocks{tier=\"gpu\"} 32"));
}

TEST_F(GpuTierDaemonTest, SixteenWorkersOverATinyGpuTierGetOnlyAppendedBytes) {
  StartDaemon(2 << 20);  // 32 blocks: four sequences at a time
  constexpr int kSequences = 24;
  for (int s = 0; s < kSequences; ++s) AppendSequence(*client_, s);
  std::vector<std::unique_ptr<Worker>> workers;
  for (int t = 0; t < 16; ++t) {
    workers.push_back(NewWorker());
    ASSERT_NE(workers.back()->session, nullptr);
  }
  std::atomic<int> wrong{0}, errors{0};
  std::atomic<uint64_t> fetched{0}, unplaced{0};
  const absl::Time until = absl::Now() + absl::Seconds(10);
  std::vector<std::thread> threads;
  for (int t = 0; t < 16; ++t) {
    threads.emplace_back([&, t] {
      Worker& w = *workers[t];
      std::mt19937 rng(t);
      while (absl::Now() < until) {
        const int s = static_cast<int>(rng() % kSequences);
        std::memset(w.kv.base, 0, w.kv.bytes);
        auto r = w.session->FetchToDevice("m", Sequence(s), Buffer(w));
        if (!r.ok()) {
          ++errors;
          ADD_FAILURE() << r.status();
          continue;
        }
        const uint64_t blocks = r->matched_tokens / kBlockTokens;
        if (blocks > 0 && !Holds(w, s, blocks)) ++wrong;
        fetched += blocks;
        if (r->unplaced_tokens > 0) ++unplaced;
      }
    });
  }
  for (std::thread& t : threads) t.join();
  EXPECT_EQ(wrong.load(), 0);
  EXPECT_EQ(errors.load(), 0);
  EXPECT_GT(fetched.load(), 1000u);
  auto stats = client_->GetStats();
  ASSERT_TRUE(stats.ok());
  const v1::TierStats* gpu = FindTier(*stats, "gpu");
  ASSERT_NE(gpu, nullptr);
  EXPECT_GT(gpu->clean_drops(), 0u) << "the tiny tier never gave a copy up";
  EXPECT_LE(gpu->used_bytes(), gpu->capacity_bytes());
  EXPECT_EQ(stats->active_leases(), 0u);
  std::printf("%llu blocks copied device to device, %llu placements cut short (tier full)\n",
              static_cast<unsigned long long>(fetched.load()),
              static_cast<unsigned long long>(unplaced.load()));
}

TEST(GpuTierStartupTest, AnUnusableDeviceStopsStartupUnlessSkipped) {
  // No GPU here (or a build without CUDA): "cuda" is not usable. Where a
  // device is present the daemon starts with it instead, and says so.
  auto [code, output] = RunShell(absl::StrCat(
      "timeout -s KILL 20 ", KvcachedPath(), " --gpu-tier cuda --listen none --metrics-address ",
      "none --unix-socket ", ::testing::TempDir(), "/gpu-refused.sock"));
  if (code != 2) {
    auto daemon = DaemonProcess::Start({.extra_flags = {"--gpu-tier", "cuda"}});
    ASSERT_TRUE(daemon.ok()) << daemon.status() << "; a first start said: " << output;
    auto client = (*daemon)->NewClient();
    auto arenas = client->GetDeviceArenas();
    ASSERT_TRUE(arenas.ok());
    EXPECT_EQ(arenas->device_kind(), "cuda");
    client.reset();
    EXPECT_EQ((*daemon)->Stop(), 0);
    return;
  }
  EXPECT_THAT(output, HasSubstr("gpu tier: "));

  auto skipped = DaemonProcess::Start(
      {.extra_flags = {
           "--gpu-tier", "cuda", "--config",
           WriteConfig("gpu_skip.json", R"({"gpu_tier": {"on_unavailable": "skip"}})")}});
  ASSERT_TRUE(skipped.ok()) << skipped.status();
  std::ifstream log((*skipped)->log_path());
  std::stringstream text;
  text << log.rdbuf();
  EXPECT_THAT(text.str(), HasSubstr("running without it (gpu_tier.on_unavailable is skip)"));
  auto client = (*skipped)->NewClient();
  auto arenas = client->GetDeviceArenas();
  ASSERT_TRUE(arenas.ok());
  EXPECT_EQ(arenas->device_kind(), "");
  EXPECT_EQ(client->PlaceOnDevice("m", MakeTokens(1, kBlockTokens)).status().code(),
            absl::StatusCode::kFailedPrecondition);
  client.reset();
  EXPECT_EQ((*skipped)->Stop(), 0);
}

}  // namespace
}  // namespace kvcache::testing
