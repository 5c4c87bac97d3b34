// remote_sharing_benchmark: what a prefix computed on node A costs node B
// when B finds it in the shared tier, against a local hit on A, in the same
// run (issue 28's figure; docs/benchmarks.md, "Shared tier").
//
// Starts a cluster of three redis-server masters on loopback (as the tests
// do) and two caches in this process, A and B, each with its own
// RemoteStore and RemoteSharing over that cluster (two daemons' worth, on
// one machine: loopback, not a network). The layout defaults to the real
// model's (SmolLM2-135M: 30 layers x 3 KV heads x 64 dims, fp16, 32-token
// blocks, 23,040 bytes a token). Then --runs times, each with a prompt of
// its own:
//   append    A appends --prefix-tokens tokens of KV (untimed)
//   share     A's RemoteSharing::Share and Flush: the background write-back,
//             sealed and pipelined (timed, though no worker waits for it)
//   local     on A: PrepareFetch of the prefix and a memcpy of its blocks
//             into a worker's buffer (a local hit's in-process cost)
//   remote    on B, which has never seen the prompt: Discover (read from
//             the store, opened, checksummed, adopted by an append), then
//             the same PrepareFetch and memcpy
// Every byte B fetched is compared with what A appended. A first run warms
// up (not counted), and each run ends with both caches evicting the prompt,
// so that pool memory is reused warm as in a long-lived daemon. Prints each
// run and the medians (ms).
//
//   remote_sharing_benchmark --prefix-tokens 2016 --runs 5
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <vector>

#include "CLI/CLI.hpp"
#include "server/core/append_session.h"
#include "server/core/eviction_policy.h"
#include "server/remote/redis_cluster_fixture.h"
#include "server/remote/remote_sharing.h"
#include "server/remote/remote_test_util.h"

namespace kvcache {
namespace {

struct Flags {
  int prefix_tokens = 2016;
  int runs = 5;
  int layers = 30, kv_heads = 3, head_dim = 64, block_tokens = 32;
};

double MsSince(std::chrono::steady_clock::time_point t) {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t).count();
}
double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.size() % 2 == 1 ? v[v.size() / 2] : (v[v.size() / 2 - 1] + v[v.size() / 2]) / 2;
}

std::vector<std::byte> BlockBytes(size_t n, uint64_t seed) {
  return remote_test::SeededBytes(n, seed);
}

struct Node {
  std::unique_ptr<Cache> cache;
  std::unique_ptr<RemoteStore> store;
  std::unique_ptr<RemoteSharing> sharing;
};

Node MakeNode(const RedisClusterFixture& cluster, const ModelKey& model, const ModelLayout& layout,
              const DaemonSecret& shared) {
  Node n;
  auto pool = SlabPool::Create({.capacity_bytes = uint64_t{2} << 30});
  if (!pool.ok()) std::abort();
  n.cache =
      std::make_unique<Cache>(CacheOptions{}, *std::move(pool), NewLruPolicy(), SystemClock::Get());
  if (!n.cache->RegisterModel(model, layout).ok()) std::abort();
  RemoteStoreOptions options{.write_batch_blocks = 16};
  options.cluster = {
      .seeds = {cluster.Address(0)},
      .node = {.connect_timeout = absl::Seconds(1), .io_timeout = absl::Seconds(10)}};
  auto store = RemoteStore::Start(options, shared);
  if (!store.ok()) std::abort();
  n.store = *std::move(store);
  n.sharing = std::make_unique<RemoteSharing>(n.cache.get(), n.store.get(), shared);
  return n;
}

// PrepareFetch of `tokens` and a memcpy of its blocks into `buffer`;
// returns the blocks fetched.
size_t FetchInto(Cache& cache, const ModelKey& model, std::span<const Token> tokens,
                 std::vector<std::byte>& buffer) {
  absl::StatusOr<FetchPlan> plan = cache.PrepareFetch(model, {.tokens = tokens});
  if (!plan.ok()) return 0;
  size_t at = 0;
  for (const PinnedBlock& b : plan->blocks) {
    std::memcpy(buffer.data() + at, b->data().data(), b->size());
    at += b->size();
  }
  return plan->blocks.size();
}

int Main(int argc, char** argv) {
  Flags f;
  CLI::App app("A prefix found in the shared tier by another node, against a local hit");
  app.add_option("--prefix-tokens", f.prefix_tokens, "tokens of the cached prefix")
      ->check(CLI::Range(1, 1 << 20));
  app.add_option("--runs", f.runs, "prompts, one per run, after a warm-up one")
      ->check(CLI::Range(1, 100));
  app.add_option("--layers", f.layers)->check(CLI::Range(1, 1024));
  app.add_option("--kv-heads", f.kv_heads)->check(CLI::Range(1, 1024));
  app.add_option("--head-dim", f.head_dim)->check(CLI::Range(1, 1024));
  app.add_option("--block-tokens", f.block_tokens)->check(CLI::Range(1, 4096));
  CLI11_PARSE(app, argc, argv);
  if (!RedisClusterFixture::Available()) {
    std::fprintf(stderr, "remote_sharing_benchmark: redis-server and redis-cli are needed\n");
    return 2;
  }
  RedisClusterFixture cluster;
  if (absl::Status s = cluster.Start(3); !s.ok()) {
    std::fprintf(stderr, "remote_sharing_benchmark: %s\n", std::string(s.message()).c_str());
    return 1;
  }
  const ModelKey model{"default", "bench"};
  const ModelLayout layout{.num_layers = static_cast<uint32_t>(f.layers),
                           .num_kv_heads = static_cast<uint32_t>(f.kv_heads),
                           .head_dim = static_cast<uint32_t>(f.head_dim),
                           .dtype = DType::kFp16,
                           .block_tokens = static_cast<uint32_t>(f.block_tokens)};
  if (!layout.Validate().ok()) return 2;
  const DaemonSecret shared = remote_test::Secret(5);
  Node a = MakeNode(cluster, model, layout, shared);
  Node b = MakeNode(cluster, model, layout, shared);
  const size_t blocks = f.prefix_tokens / f.block_tokens;
  const size_t block_bytes = layout.BlockBytes();
  std::vector<std::byte> buffer(blocks * block_bytes);
  std::printf("prefix: %zu blocks of %zu bytes (%.2f MB)\n", blocks, block_bytes,
              blocks * block_bytes / 1e6);
  std::vector<double> share_ms, local_ms, discover_ms, remote_ms;
  for (int run = 0; run <= f.runs; ++run) {
    std::vector<Token> tokens(blocks * f.block_tokens);
    for (size_t i = 0; i < tokens.size(); ++i) tokens[i] = static_cast<Token>(run * 10000000 + i);
    std::vector<std::vector<std::byte>> kv;
    std::vector<uint64_t> checksums;
    for (size_t i = 0; i < blocks; ++i) {
      kv.push_back(BlockBytes(block_bytes, run * 100000 + i));
      checksums.push_back(Checksum(kv.back()));
    }
    auto session = a.cache->BeginAppend(model, tokens, 0, {}, checksums);
    if (!session.ok()) return 1;
    for (const auto& block : kv) {
      if (!(*session)->Write(block).ok()) return 1;
    }
    if (!(*session)->Commit().ok()) return 1;

    auto t = std::chrono::steady_clock::now();
    a.sharing->Share(model, tokens, 0);
    a.sharing->Flush();
    share_ms.push_back(MsSince(t));

    t = std::chrono::steady_clock::now();
    if (FetchInto(*a.cache, model, tokens, buffer) != blocks) return 1;
    local_ms.push_back(MsSince(t));

    std::fill(buffer.begin(), buffer.end(), std::byte{0});
    t = std::chrono::steady_clock::now();
    absl::StatusOr<uint64_t> adopted = b.sharing->Discover(model, tokens);
    discover_ms.push_back(MsSince(t));
    if (!adopted.ok() || *adopted != tokens.size()) {
      std::fprintf(stderr, "node B adopted %s of %zu tokens\n",
                   adopted.ok() ? std::to_string(*adopted).c_str() : "none", tokens.size());
      return 1;
    }
    if (FetchInto(*b.cache, model, tokens, buffer) != blocks) return 1;
    remote_ms.push_back(MsSince(t));
    for (size_t i = 0; i < blocks; ++i) {
      if (std::memcmp(buffer.data() + i * block_bytes, kv[i].data(), block_bytes) != 0) {
        std::fprintf(stderr, "node B fetched other bytes in block %zu\n", i);
        return 1;
      }
    }
    std::printf("run %d%s: share %.1f ms, local hit %.1f ms, remote (discover %.1f) %.1f ms\n", run,
                run == 0 ? " (warm-up, not counted)" : "", share_ms.back(), local_ms.back(),
                discover_ms.back(), remote_ms.back());
    if (run == 0) {
      for (std::vector<double>* v : {&share_ms, &local_ms, &discover_ms, &remote_ms}) v->clear();
    }
    // Both caches let the prompt go, so the next run's blocks reuse pool
    // memory already touched, as a daemon's long-lived pool does (a first
    // touch of fresh pages costs more than the copy itself).
    (void)a.cache->EvictModel(model);
    (void)b.cache->EvictModel(model);
  }
  std::printf("| %zu-token prefix, %.2f MB | ms (median of %d) |\n", blocks * f.block_tokens,
              blocks * block_bytes / 1e6, f.runs);
  std::printf("|---|---:|\n");
  std::printf("| local hit on A (PrepareFetch + memcpy) | %.1f |\n", Median(local_ms));
  std::printf("| found by B in the shared tier (Discover + PrepareFetch + memcpy) | %.1f |\n",
              Median(remote_ms));
  std::printf("| of which Discover (read, open, check, adopt) | %.1f |\n", Median(discover_ms));
  std::printf("| A's write-back (Share + Flush; no worker waits for it) | %.1f |\n",
              Median(share_ms));
  return 0;
}

}  // namespace
}  // namespace kvcache

int main(int argc, char** argv) { return kvcache::Main(argc, argv); }
