// The daemon's own memory under load from both data paths (docs/operations.md,
// "Memory"): a real kvcached with a host tier over an SSD tier and
// checkpoints every 2 s, kvcache-bench workers on shared memory and on gRPC at
// once. Twice a second the test reads GetStats' memory breakdown and the
// daemon's /proc/<pid>/status itself, and insists that
//   - the daemon's own memory (VmRSS minus RssShmem) stays under the bound,
//     1.1 x host capacity + 64 MiB, in every sample;
//   - the breakdown's parts add up to its own figure, and that figure is
//     within a tolerance of what the test measures;
//   - the parts explain the memory: what is unattributed stays small.
// Lean: about 20 s.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>

#include "absl/strings/str_cat.h"
#include "tests/integration/daemon_process.h"

namespace kvcache::testing {
namespace {

#ifdef KVCACHE_BENCH_BINARY
constexpr uint64_t kMiB = uint64_t{1} << 20;
constexpr uint64_t kCapacity = 128 * kMiB;

// The soak's layout (128 KiB blocks, 4-block sequences), shorter.
constexpr char kLayout[] =
    "--model m --layers 8 --kv-heads 4 --head-dim 64 --block-tokens 16 --blocks-per-seq 4 "
    "--working-set 16 --duration 15";

std::pair<int, std::string> Bench(const std::string& target, const std::string& args) {
  return RunShell(absl::StrCat(KVCACHE_BENCH_BINARY, " --target ", target, " ", args, " 2>&1"));
}

// VmRSS minus RssShmem of `pid`, in bytes; 0 when it cannot be read.
uint64_t OwnBytesOf(pid_t pid) {
  std::ifstream in(absl::StrCat("/proc/", pid, "/status"));
  std::string key;
  uint64_t rss = 0, shmem = 0, value = 0;
  std::string line;
  while (std::getline(in, line)) {
    std::istringstream fields(line);
    if (!(fields >> key >> value)) continue;
    if (key == "VmRSS:") rss = value << 10;
    if (key == "RssShmem:") shmem = value << 10;
  }
  return rss > shmem ? rss - shmem : 0;
}

uint64_t PartOf(const v1::MemoryStats& m, const std::string& name) {
  for (const v1::MemoryStats::Part& p : m.parts()) {
    if (p.name() == name) return p.bytes();
  }
  return 0;
}

TEST(MemoryBoundTest, UnderLoadFromBothPathsTheDaemonStaysUnderItsBoundAndExplainsItsMemory) {
  const std::string dir = ::testing::TempDir() + "/memory_bound_test_" + std::to_string(::getpid());
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  const std::string config = dir + "/config.json";
  {
    std::ofstream f(config);
    f << R"({"checkpoint": {"dir": ")" << dir << R"(/ckpt", "interval_seconds": 2, "keep": 2}})";
  }
  auto daemon =
      DaemonProcess::Start({.capacity_bytes = kCapacity,
                            .tcp = true,
                            .extra_flags = {"--config", config, "--ssd-path", dir + "/ssd.bin",
                                            "--ssd-capacity-bytes", std::to_string(256 * kMiB)}});
  ASSERT_TRUE(daemon.ok()) << daemon.status();
  std::unique_ptr<Client> client = (*daemon)->NewClient("", DataPath::kGrpc);

  std::atomic<int> running{2};
  std::pair<int, std::string> shm, grpc;
  std::thread shm_workers([&] {
    shm = Bench((*daemon)->unix_target(),
                absl::StrCat("mixed --transport shm --clients 8 ", kLayout));
    --running;
  });
  std::thread grpc_workers([&] {
    grpc = Bench((*daemon)->tcp_target(),
                 absl::StrCat("mixed --transport grpc --clients 8 ", kLayout));
    --running;
  });
  uint64_t peak = 0, peak_reported = 0, bound = 0;
  int samples = 0;
  v1::MemoryStats last;
  while (running.load() > 0) {
    std::this_thread::sleep_for(std::chrono::milliseconds(500));
    auto stats = client->GetStats();
    ASSERT_TRUE(stats.ok()) << stats.status();
    ASSERT_TRUE(stats->has_memory());
    const v1::MemoryStats& m = stats->memory();
    const uint64_t measured = OwnBytesOf((*daemon)->pid());
    last = m;
    bound = m.bound_bytes();
    ++samples;
    peak = std::max(peak, measured);
    peak_reported = std::max(peak_reported, m.own_bytes());
    uint64_t sum = 0;
    for (const v1::MemoryStats::Part& p : m.parts()) sum += p.bytes();
    EXPECT_EQ(sum, m.own_bytes()) << "the parts do not add up";
    EXPECT_EQ(m.own_bytes(), m.rss_bytes() - m.shared_bytes());
    // GetStats' figure and the test's own, read moments apart.
    EXPECT_LE(m.own_bytes(), measured + measured / 10 + 8 * kMiB);
    EXPECT_GE(m.own_bytes() + m.own_bytes() / 10 + 8 * kMiB, measured);
    // What no part explains: within 10% of the total plus 16 MiB.
    EXPECT_LE(PartOf(m, "unattributed"), m.own_bytes() / 10 + 16 * kMiB)
        << "unattributed " << PartOf(m, "unattributed") << " of " << m.own_bytes();
    EXPECT_LE(measured, m.bound_bytes()) << "over the bound at sample " << samples;
  }
  shm_workers.join();
  grpc_workers.join();
  std::fprintf(stderr,
               "memory_bound_test: %d samples, own memory peaked at %.1f MiB (reported %.1f MiB), "
               "bound %.1f MiB; last breakdown:",
               samples, peak / double(kMiB), peak_reported / double(kMiB), bound / double(kMiB));
  for (const v1::MemoryStats::Part& p : last.parts()) {
    std::fprintf(stderr, " %s %.1f", p.name().c_str(), p.bytes() / double(kMiB));
  }
  std::fprintf(stderr, " (MiB)\n");
  ASSERT_EQ(shm.first, 0) << shm.second;
  ASSERT_EQ(grpc.first, 0) << grpc.second;
  EXPECT_THAT(shm.second, ::testing::Not(::testing::HasSubstr("WRONG BYTES")));
  EXPECT_THAT(grpc.second, ::testing::Not(::testing::HasSubstr("WRONG BYTES")));
  EXPECT_GE(samples, 10);
  EXPECT_EQ(bound, kCapacity + kCapacity / 10 + 64 * kMiB);
  EXPECT_GT(PartOf(last, "host_pool"), kCapacity / 2) << "the load never filled the host tier";
  EXPECT_EQ((*daemon)->Stop(), 0);
  std::filesystem::remove_all(dir);
}
#else
TEST(MemoryBoundTest, NeedsKvcacheBench) { GTEST_SKIP() << "built without kvcache-bench"; }
#endif

}  // namespace
}  // namespace kvcache::testing
