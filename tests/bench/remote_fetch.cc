// kvcache-remote-fetch: a prefix found through the remote tier, timed
// (tests/bench/remote_tier_bench.sh drives it; docs/benchmarks.md, "The
// remote tier").
//
//   kvcache-remote-fetch --append-target unix:///a.sock --fetch-target unix:///b.sock
//       --append-metrics http://127.0.0.1:PORT/metrics [--prefix-tokens 2016] [--runs 5]
//
// Two daemons of one deployment (the same Redis Cluster and key file). For
// each run, a prefix never seen before (default 2,016 tokens in SmolLM2-135M's
// layout: 30 layers x 3 KV heads x 64 dims, fp16, 32-token blocks, 46 MB) is
// appended through daemon A (untimed), and once A's metrics say its blocks
// are written to the cluster, it is timed on daemon B, from the request to
// verified bytes in the worker's shared-memory buffer:
//   remote      B's local miss: a PREFETCH_WAIT lookup (B searches the
//               cluster, reads, opens and checks the blocks, and caches
//               them), then a Fetch over shared memory
//   remote-lookup  the lookup part of `remote` alone
//   b-local     the same prefix fetched again from B, now a local hit
//   a-local     the prefix fetched from A, where it was appended: a local hit
// Every fetched byte is compared with what was appended, and both daemons
// evict the prefix after each run (their pools then hold warm memory for the
// next, as a long-lived daemon's do; a first run warms them). Prints one JSON
// object per path on stdout ({"path", "prefix_tokens", "bytes", "ms": [...],
// "median_ms", "gb_per_s"}). Exit 1 on a failed call or a wrong byte.
#include <CLI/CLI.hpp>
#include <algorithm>
#include <cstdio>
#include <cstring>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "kvcache/client.h"
#include "tests/bench/bench_common.h"

namespace kvcache::bench {
namespace {

struct Options {
  std::string append_target;
  std::string fetch_target;
  std::string append_metrics;
  uint32_t prefix_tokens = 2016;
  int runs = 5;
  uint32_t layers = 30, kv_heads = 3, head_dim = 64, block_tokens = 32;
  double write_wait_s = 60;
};

struct Path {
  std::string name;
  std::vector<double> ms;
};

double MsSince(absl::Time t0) { return absl::ToDoubleMilliseconds(absl::Now() - t0); }

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0 : v[v.size() / 2];
}

// kvcached_remote_writes_total{outcome="done"} as `url` serves it, or -1.
double WritesDone(const std::string& url) {
  std::FILE* p = ::popen(absl::StrCat("curl -sf '", url, "'").c_str(), "r");
  if (p == nullptr) return -1;
  std::string text;
  char buf[4096];
  for (size_t n; (n = std::fread(buf, 1, sizeof(buf), p)) > 0;) text.append(buf, n);
  if (::pclose(p) != 0) return -1;
  std::istringstream lines(text);
  for (std::string line; std::getline(lines, line);) {
    if (line.starts_with("kvcached_remote_writes_total{") &&
        line.find("outcome=\"done\"") != std::string::npos) {
      return std::stod(line.substr(line.rfind(' ') + 1));
    }
  }
  return -1;
}

absl::StatusOr<std::unique_ptr<Client>> Connect(const std::string& target) {
  BenchOptions b;
  b.target = target;
  b.transport = "shm";
  return ConnectClient(b);
}

int Run(const Options& o) {
  if (o.prefix_tokens == 0 || o.prefix_tokens % o.block_tokens != 0) {
    std::fprintf(stderr, "--prefix-tokens must be a positive multiple of %u\n", o.block_tokens);
    return 2;
  }
  absl::StatusOr<std::unique_ptr<Client>> a = Connect(o.append_target);
  absl::StatusOr<std::unique_ptr<Client>> b = Connect(o.fetch_target);
  if (!a.ok() || !b.ok()) {
    std::fprintf(stderr, "connect: %s\n", (a.ok() ? b.status() : a.status()).ToString().c_str());
    return 1;
  }
  v1::ModelLayout layout;
  layout.set_num_layers(o.layers);
  layout.set_num_kv_heads(o.kv_heads);
  layout.set_head_dim(o.head_dim);
  layout.set_dtype(v1::DTYPE_FP16);
  layout.set_block_tokens(o.block_tokens);
  const std::string model = "remote-bench";
  uint64_t block_bytes = 0;
  for (Client* c : {a->get(), b->get()}) {
    absl::StatusOr<v1::RegisterModelResponse> r = c->RegisterModel(model, layout);
    if (!r.ok()) {
      std::fprintf(stderr, "register: %s\n", r.status().ToString().c_str());
      return 1;
    }
    block_bytes = r->block_bytes();
  }
  const uint32_t blocks = o.prefix_tokens / o.block_tokens;
  const uint64_t bytes = uint64_t{blocks} * block_bytes;
  absl::StatusOr<std::shared_ptr<SharedRegion>> a_region = (*a)->CreateSharedRegion(2 * bytes);
  absl::StatusOr<std::shared_ptr<SharedRegion>> b_region = (*b)->CreateSharedRegion(bytes);
  if (!a_region.ok() || !b_region.ok()) {
    std::fprintf(stderr, "regions: %s\n",
                 (a_region.ok() ? b_region.status() : a_region.status()).ToString().c_str());
    return 1;
  }
  std::span<std::byte> src = (*a_region)->bytes().subspan(0, bytes);
  std::span<std::byte> a_dst = (*a_region)->bytes().subspan(bytes, bytes);
  std::span<std::byte> b_dst = (*b_region)->bytes().subspan(0, bytes);
  std::memset(a_dst.data(), 0, bytes);  // fault every page in before timing
  std::memset(b_dst.data(), 0, bytes);

  Path remote{"remote", {}}, lookup{"remote-lookup", {}}, b_local{"b-local", {}},
      a_local{"a-local", {}};
  const uint64_t seed = static_cast<uint64_t>(absl::ToUnixNanos(absl::Now()));
  for (int run = -1; run < o.runs; ++run) {  // run -1 warms up, not counted
    const uint64_t seq = seed + run + 1;
    const std::vector<uint32_t> tokens = SequenceTokens(seq, o.prefix_tokens);
    for (uint32_t i = 0; i < blocks; ++i) {
      FillBlock(seq, i, src.subspan(uint64_t{i} * block_bytes, block_bytes));
    }
    const double before = WritesDone(o.append_metrics);
    if (before < 0) {
      std::fprintf(stderr, "no kvcached_remote_writes_total at %s: is A's remote tier on?\n",
                   o.append_metrics.c_str());
      return 1;
    }
    absl::StatusOr<AppendResult> appended = (*a)->Append(model, tokens, src);
    if (!appended.ok() || appended->stored_blocks != blocks) {
      std::fprintf(stderr, "append: %s\n",
                   appended.ok() ? "stored fewer blocks than appended"
                                 : appended.status().ToString().c_str());
      return 1;
    }
    const absl::Time wait_until = absl::Now() + absl::Seconds(o.write_wait_s);
    while (WritesDone(o.append_metrics) < before + blocks) {
      if (absl::Now() > wait_until) {
        std::fprintf(stderr, "A did not write the prefix's %u blocks in %.0f s\n", blocks,
                     o.write_wait_s);
        return 1;
      }
      absl::SleepFor(absl::Milliseconds(20));
    }
    auto fetch = [&](Client& c, std::span<std::byte> dst, Path* path) -> bool {
      const absl::Time t0 = absl::Now();
      absl::StatusOr<FetchResult> f = c.Fetch(model, tokens, dst);
      path->ms.push_back(MsSince(t0));
      if (!f.ok() || f->matched_tokens != o.prefix_tokens ||
          std::memcmp(dst.data(), src.data(), bytes) != 0) {
        std::fprintf(
            stderr, "%s: %s\n", path->name.c_str(),
            f.ok() ? absl::StrCat("matched ", f->matched_tokens, " tokens or wrong bytes").c_str()
                   : f.status().ToString().c_str());
        return false;
      }
      return true;
    };
    const absl::Time t0 = absl::Now();
    absl::StatusOr<LookupResult> found = (*b)->Lookup(
        model, tokens, {.prefetch = v1::PREFETCH_WAIT, .prefetch_timeout = absl::Seconds(30)});
    lookup.ms.push_back(MsSince(t0));
    if (!found.ok() || found->matched_tokens != o.prefix_tokens) {
      std::fprintf(stderr, "remote lookup: %s\n",
                   found.ok() ? absl::StrCat("matched ", found->matched_tokens).c_str()
                              : found.status().ToString().c_str());
      return 1;
    }
    if (!fetch(**b, b_dst, &remote)) return 1;
    remote.ms.back() += lookup.ms.back();
    if (run < 0) {
      lookup.ms.clear();
      remote.ms.clear();
    }
    std::memset(b_dst.data(), 0, bytes);
    if (!fetch(**b, b_dst, &b_local) || !fetch(**a, a_dst, &a_local)) return 1;
    if (run < 0) {
      b_local.ms.clear();
      a_local.ms.clear();
    }
    // Both daemons drop the prefix, so the next one reuses their pool memory
    // warm, as a long-lived daemon's full pool does (the cluster keeps it).
    for (Client* c : {a->get(), b->get()}) {
      if (absl::StatusOr<EvictResult> e = c->EvictModel(model); !e.ok()) {
        std::fprintf(stderr, "evict: %s\n", e.status().ToString().c_str());
        return 1;
      }
    }
  }
  for (const Path* p : {&remote, &lookup, &b_local, &a_local}) {
    const double median = Median(p->ms);
    std::printf(
        "{\"path\": \"%s\", \"prefix_tokens\": %u, \"bytes\": %llu, \"ms\": [%s], "
        "\"median_ms\": %.3f, \"gb_per_s\": %.3f}\n",
        p->name.c_str(), o.prefix_tokens, static_cast<unsigned long long>(bytes),
        absl::StrJoin(p->ms, ", ", [](std::string* out, double v) { absl::StrAppend(out, v); })
            .c_str(),
        median, median > 0 ? static_cast<double>(bytes) / median / 1e6 : 0);
  }
  return 0;
}

}  // namespace
}  // namespace kvcache::bench

int main(int argc, char** argv) {
  kvcache::bench::Options o;
  CLI::App app{
      "kvcache-remote-fetch: a prefix appended on one daemon, timed on another "
      "through the remote tier, against local hits"};
  app.add_option("--append-target", o.append_target, "daemon A (unix:///path)")->required();
  app.add_option("--fetch-target", o.fetch_target, "daemon B (unix:///path)")->required();
  app.add_option("--append-metrics", o.append_metrics,
                 "daemon A's metrics URL (http://HOST:PORT/metrics)")
      ->required();
  app.add_option("--prefix-tokens", o.prefix_tokens, "tokens of the prefix (default 2016)");
  app.add_option("--runs", o.runs, "prefixes timed (default 5)")->check(CLI::PositiveNumber);
  app.add_option("--layers", o.layers, "layout: num_layers (default 30)");
  app.add_option("--kv-heads", o.kv_heads, "layout: num_kv_heads (default 3)");
  app.add_option("--head-dim", o.head_dim, "layout: head_dim (default 64)");
  app.add_option("--block-tokens", o.block_tokens, "layout: tokens per block (default 32)");
  CLI11_PARSE(app, argc, argv);
  return kvcache::bench::Run(o);
}
