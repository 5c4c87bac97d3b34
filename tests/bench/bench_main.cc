// kvcache-bench: a db_bench-style load generator for a running kvcached.
//
//   kvcache-bench MODE [options]     MODE: append | fetch | lookup | mixed | trace
//
// Load modes run --clients threads for --duration seconds and print ops/s,
// GB/s and p50/p99/max latency per operation; trace replays a Mooncake JSONL
// trace and prints the prefix hit ratio (see trace_replay.cc).
#include <CLI/CLI.hpp>
#include <cstdio>

#include "bench_common.h"

int main(int argc, char** argv) {
  kvcache::bench::BenchOptions o;
  CLI::App app(
      "kvcache-bench: load generator and trace replayer for kvcached.\n"
      "Exits 1 when a call fails fatally or any fetched byte is wrong, 2 on a bad command line.",
      "kvcache-bench");
  app.add_option("mode", o.mode,
                 "append: new sequences; fetch / lookup: of a per-client working set;\n"
                 "mixed: --mix of the three; trace: replay --trace and report hit ratios")
      ->required()
      ->check(CLI::IsMember({"append", "fetch", "lookup", "mixed", "trace"}));
  app.add_option("--target", o.target, "daemon address, HOST:PORT or unix:///path")
      ->capture_default_str();
  app.add_option("--namespace", o.ns, "namespace (empty: default)");
  app.add_option("--token", o.token,
                 "bearer token, for a daemon with authentication on (docs/security.md)");
  auto* model_opt = app.add_option("--model", o.model,
                                   "model id to register and use (trace default: trace-model)")
                        ->capture_default_str();
  app.add_option("--clients", o.clients, "client threads (load modes)")
      ->capture_default_str()
      ->check(CLI::Range(1, 1024));
  app.add_option("--transport", o.transport,
                 "grpc, shm (shared memory, buffers in SharedRegions; same host only), auto "
                 "(shared memory for unix:// targets, through the client's staging region) or "
                 "both (load modes: --clients/2 on shm and as many on grpc at once, reported "
                 "per path with the fairness ratios)")
      ->check(CLI::IsMember({"grpc", "shm", "auto", "both"}))
      ->capture_default_str();
  app.add_option("--grpc-target", o.grpc_target,
                 "--transport both: where the gRPC clients connect (default: --target)");
  app.add_flag("--shared-client", o.shared_client,
               "all threads share one Client (one channel) instead of one each");
  app.add_option("--duration", o.duration_s, "seconds to run (load modes)")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  app.add_option("--timeout", o.timeout_s, "per-call deadline in seconds")->capture_default_str();
  app.add_option("--seed", o.seed, "sequence key seed; 0 derives one from the clock")
      ->capture_default_str();
  app.add_option("--layers", o.layers, "layout: num_layers")->capture_default_str();
  app.add_option("--kv-heads", o.kv_heads, "layout: num_kv_heads")->capture_default_str();
  app.add_option("--head-dim", o.head_dim, "layout: head_dim")->capture_default_str();
  app.add_option("--dtype", o.dtype, "layout: fp16, bf16 or fp32")->capture_default_str();
  app.add_option("--block-tokens", o.block_tokens, "layout: tokens per block")
      ->capture_default_str();
  app.add_option("--blocks-per-seq", o.blocks_per_seq, "blocks in each sequence")
      ->capture_default_str()
      ->check(CLI::Range(1u, 1u << 20));
  app.add_option("--working-set", o.working_set,
                 "sequences each client appends before fetch/lookup (and keeps in mixed)")
      ->capture_default_str()
      ->check(CLI::Range(1u, 1u << 20));
  app.add_option("--mix", o.mix, "mixed: weights of append,lookup,fetch")->capture_default_str();
  app.add_flag("!--no-verify", o.verify, "fetch: skip checking the payload pattern");
  app.add_option("--compress", o.compress,
                 "fetch: switch the model to this compression mode after the setup appends and "
                 "wait for the daemon to compress the working set (start kvcached with a small "
                 "importance.cold_after_seconds); fetches then measure decoding. Implies "
                 "--no-verify (the bytes are a lossy transform; the client still checks every "
                 "block's checksum)")
      ->check(CLI::IsMember({"quantize", "prune"}));
  app.add_option(
      "--trace", o.trace,
      "trace: Mooncake JSONL file (required; e.g. ../shared/traces/*.jsonl beside the repository)");
  app.add_option("--limit", o.limit, "trace: replay only the first N requests (0: all)")
      ->capture_default_str();
  app.add_option("--bytes-per-token", o.bytes_per_token,
                 "trace: KV bytes per token (a multiple of 4); a block is 512x this")
      ->capture_default_str();
  app.add_flag("--fetch-hits", o.fetch_hits, "trace: fetch and verify every hit prefix");
  app.add_option("--speedup", o.speedup,
                 "trace: issue each request at its timestamp / N, N times faster than recorded "
                 "(0: as fast as possible); a policy's time constants should be N times smaller")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();
  app.add_flag("--keep-cache", o.keep_cache,
               "trace: keep what the model has cached instead of evicting it first");
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e) == 0 ? 0 : 2;
  }
  if (!o.compress.empty()) {
    if (o.mode != "fetch") {
      std::fprintf(stderr, "kvcache-bench: --compress applies to the fetch mode only\n");
      return 2;
    }
    o.verify = false;
  }
  if (o.transport == "both" && (o.mode == "trace" || o.clients < 2 || o.clients % 2 != 0)) {
    std::fprintf(stderr,
                 "kvcache-bench: --transport both needs a load mode and an even --clients\n");
    return 2;
  }
  // A trace's model has its own layout, so it must not collide with the load modes'.
  if (o.mode == "trace" && model_opt->count() == 0) o.model = "trace-model";
  return o.mode == "trace" ? kvcache::bench::RunTrace(o) : kvcache::bench::RunLoad(o);
}
