// remote_store_benchmark: what sealing and the block format cost on the way
// to and from Redis Cluster, against plain SET and GET of the same bytes
// through the same client, in the same run (docs/benchmarks.md, "Shared
// tier").
//
// Starts a cluster of --masters redis-server masters on loopback (as the
// tests do), then --runs times, alternating:
//   raw     ClusterClient: --blocks SETs of --block-kib KiB values in
//           pipelined batches of --batch, then as many GETs
//   sealed  RemoteStore: as many Puts (sealed on its writer thread) and a
//           Flush, then one Get of every key in batches of --batch (opened
//           and checksummed)
// (which goes first alternates from run to run) and prints each run's GB/s
// and the medians. Every byte read is compared
// with what was written. GB = 10^9 bytes of block payload (not counting the
// seal's 33 bytes and the 16-byte header).
//
//   remote_store_benchmark --blocks 256 --block-kib 2048 --runs 5
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "CLI/CLI.hpp"
#include "absl/strings/str_cat.h"
#include "server/core/block.h"
#include "server/remote/redis_cluster_fixture.h"
#include "server/remote/remote_store.h"
#include "server/remote/remote_test_util.h"

namespace kvcache {
namespace {

struct Flags {
  int masters = 3;
  int blocks = 256;
  int block_kib = 2048;
  int batch = 16;
  int runs = 5;
};

std::vector<std::byte> BlockBytes(size_t n, uint64_t seed) {
  return remote_test::SeededBytes(n, seed);
}

double Seconds(std::chrono::steady_clock::time_point since) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - since).count();
}

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 == 1 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

// GB/s of writing and reading every block as plain values.
std::pair<double, double> RunRaw(ClusterClient& client, const Flags& f,
                                 const std::vector<std::vector<std::byte>>& blocks, int run) {
  const double gb = static_cast<double>(blocks.size() * blocks[0].size()) / 1e9;
  std::vector<std::string> keys;
  for (size_t i = 0; i < blocks.size(); ++i) keys.push_back(absl::StrCat("raw:", run, ":", i));
  auto start = std::chrono::steady_clock::now();
  for (size_t at = 0; at < blocks.size(); at += f.batch) {
    std::vector<KeyedCommand> batch;
    for (size_t i = at; i < std::min(blocks.size(), at + f.batch); ++i) {
      batch.push_back(
          {keys[i],
           {"SET", keys[i],
            std::string(reinterpret_cast<const char*>(blocks[i].data()), blocks[i].size())}});
    }
    for (const auto& r : client.Run(batch)) {
      if (!r.ok() || r->is_error()) {
        std::fprintf(stderr, "raw SET failed\n");
        std::exit(1);
      }
    }
  }
  const double write = gb / Seconds(start);
  start = std::chrono::steady_clock::now();
  for (size_t at = 0; at < blocks.size(); at += f.batch) {
    std::vector<KeyedCommand> batch;
    for (size_t i = at; i < std::min(blocks.size(), at + f.batch); ++i) {
      batch.push_back({keys[i], {"GET", keys[i]}});
    }
    std::vector<absl::StatusOr<RespValue>> got = client.Run(batch);
    for (size_t i = at; i < std::min(blocks.size(), at + f.batch); ++i) {
      const auto& r = got[i - at];
      if (!r.ok() || r->str.size() != blocks[i].size() ||
          std::memcmp(r->str.data(), blocks[i].data(), blocks[i].size()) != 0) {
        std::fprintf(stderr, "raw GET returned other bytes\n");
        std::exit(1);
      }
    }
  }
  return {write, gb / Seconds(start)};
}

std::pair<double, double> RunSealed(RemoteStore& store, const Flags& f,
                                    const std::vector<std::vector<std::byte>>& blocks, int run) {
  const double gb = static_cast<double>(blocks.size() * blocks[0].size()) / 1e9;
  std::vector<std::string> keys;
  for (size_t i = 0; i < blocks.size(); ++i) keys.push_back(absl::StrCat("kvc:", run, ":", i));
  auto start = std::chrono::steady_clock::now();
  for (size_t i = 0; i < blocks.size(); ++i) {
    // The copy stands for the writer's pinned read of the block.
    while (!store.Put("bench", keys[i], Checksum(blocks[i]), blocks[i])) store.Flush();
  }
  store.Flush();
  const double write = gb / Seconds(start);
  start = std::chrono::steady_clock::now();
  for (size_t at = 0; at < blocks.size(); at += f.batch) {
    const size_t n = std::min<size_t>(f.batch, blocks.size() - at);
    std::vector<std::optional<RemoteBlock>> got =
        store.Get("bench", std::span<const std::string>(keys).subspan(at, n));
    for (size_t i = 0; i < n; ++i) {
      if (!got[i].has_value() || got[i]->bytes.size() != blocks[at + i].size() ||
          std::memcmp(got[i]->bytes.data(), blocks[at + i].data(), blocks[at + i].size()) != 0) {
        std::fprintf(stderr, "sealed Get missed or returned other bytes\n");
        std::exit(1);
      }
    }
  }
  return {write, gb / Seconds(start)};
}

int Main(int argc, char** argv) {
  Flags f;
  CLI::App app("Sealed blocks against plain SET/GET on a Redis Cluster of loopback masters");
  app.add_option("--masters", f.masters, "redis-server masters")->check(CLI::Range(1, 8));
  app.add_option("--blocks", f.blocks, "blocks per run")->check(CLI::Range(1, 100000));
  app.add_option("--block-kib", f.block_kib, "block size in KiB")->check(CLI::Range(1, 65536));
  app.add_option("--batch", f.batch, "commands per pipelined batch")->check(CLI::Range(1, 4096));
  app.add_option("--runs", f.runs, "runs of each")->check(CLI::Range(1, 100));
  CLI11_PARSE(app, argc, argv);
  if (!RedisClusterFixture::Available()) {
    std::fprintf(stderr, "remote_store_benchmark: redis-server and redis-cli are needed\n");
    return 2;
  }
  RedisClusterFixture cluster;
  if (absl::Status s = cluster.Start(f.masters); !s.ok()) {
    std::fprintf(stderr, "remote_store_benchmark: %s\n", std::string(s.message()).c_str());
    return 1;
  }
  const ClusterClientOptions cluster_options{
      .seeds = {cluster.Address(0)},
      .node = {.connect_timeout = absl::Seconds(1), .io_timeout = absl::Seconds(10)}};
  auto client = ClusterClient::Connect(cluster_options);
  auto store = RemoteStore::Start({.cluster = cluster_options,
                                   .write_queue_blocks = static_cast<uint32_t>(f.batch) * 4,
                                   .write_batch_blocks = static_cast<uint32_t>(f.batch)},
                                  remote_test::Secret(7));
  if (!client.ok() || !store.ok()) {
    std::fprintf(stderr, "remote_store_benchmark: cannot connect\n");
    return 1;
  }
  std::vector<std::vector<std::byte>> blocks;
  for (int i = 0; i < f.blocks; ++i) blocks.push_back(BlockBytes(size_t(f.block_kib) << 10, i));
  std::vector<double> raw_w, raw_r, sealed_w, sealed_r;
  for (int run = 0; run < f.runs; ++run) {
    // Alternating which goes first: neither always meets a fuller Redis.
    std::pair<double, double> raw, sealed;
    if (run % 2 == 0) {
      raw = RunRaw(**client, f, blocks, run);
      sealed = RunSealed(**store, f, blocks, run);
    } else {
      sealed = RunSealed(**store, f, blocks, run);
      raw = RunRaw(**client, f, blocks, run);
    }
    auto [rw, rr] = raw;
    auto [sw, sr] = sealed;
    std::printf("run %d: raw write %.2f read %.2f GB/s; sealed write %.2f read %.2f GB/s\n", run,
                rw, rr, sw, sr);
    raw_w.push_back(rw);
    raw_r.push_back(rr);
    sealed_w.push_back(sw);
    sealed_r.push_back(sr);
    // Each run writes its own keys: drop them so memory stays flat.
    for (int n = 0; n < f.masters; ++n) (void)cluster.Node(n)->Run({"FLUSHALL"});
  }
  std::printf("| %d blocks of %d KiB, batches of %d, %d masters | write GB/s | read GB/s |\n",
              f.blocks, f.block_kib, f.batch, f.masters);
  std::printf("|---|---:|---:|\n");
  std::printf("| raw SET / GET | %.2f | %.2f |\n", Median(raw_w), Median(raw_r));
  std::printf("| sealed Put / Get | %.2f (%.2fx) | %.2f (%.2fx) |\n", Median(sealed_w),
              Median(sealed_w) / Median(raw_w), Median(sealed_r), Median(sealed_r) / Median(raw_r));
  return 0;
}

}  // namespace
}  // namespace kvcache

int main(int argc, char** argv) { return kvcache::Main(argc, argv); }
