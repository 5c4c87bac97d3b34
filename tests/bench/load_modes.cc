// The closed-loop load modes of kvcache-bench: append, fetch, lookup, mixed.
//
// N client threads each run operations back to back for --duration seconds.
// append: every op appends a new sequence of --blocks-per-seq blocks.
// fetch / lookup: each thread first appends --working-set sequences, then
//   fetches (verifying every byte) or looks up a random one of them.
// mixed: each op is an append of a new sequence (replacing the thread's
//   oldest), a lookup or a fetch, drawn with the --mix weights.
// --transport both: threads [0, N/2) use shared memory, [N/2, N) gRPC, at
//   once; each path gets its own table, then the fairness lines: per-worker
//   throughput (all ops) of the slower path over the faster's, and the ratio
//   of their fetch p99s (the rule of issue 30: >= 0.5 and <= 3).
#include <algorithm>
#include <atomic>
#include <cstdio>
#include <random>
#include <thread>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/synchronization/barrier.h"
#include "absl/time/clock.h"
#include "bench_common.h"

namespace kvcache::bench {
namespace {

// The data path of client thread `thread`.
std::string_view ThreadTransport(const BenchOptions& opts, int thread) {
  if (opts.transport != "both") return opts.transport;
  return thread < opts.clients / 2 ? "shm" : "grpc";
}

struct ThreadResult {
  OpStats append, lookup, fetch;
  uint64_t partial = 0;  // lookups/fetches that found less than the whole sequence
  uint64_t corrupt = 0;  // fetched blocks whose bytes are not the pattern
  std::string setup_error;
};

class LoadRunner {
 public:
  LoadRunner(const BenchOptions& opts, uint64_t block_bytes, uint64_t run_key)
      : opts_(opts), block_bytes_(block_bytes), run_key_(run_key) {}

  // Blocks on `ready` after the setup appends and on `start` before measuring.
  void Run(Client& client, int thread, absl::Barrier* ready, absl::Barrier* start, ThreadResult* r);
  std::atomic<bool>& stop() { return stop_; }

 private:
  uint64_t SeqKey(int thread, uint64_t n) const { return run_key_ ^ (uint64_t(thread) << 40) ^ n; }
  // A thread's append source and fetch destination, each one sequence long:
  // in a SharedRegion with --transport shm, on the heap otherwise.
  struct Buffers {
    std::shared_ptr<SharedRegion> region;
    std::vector<std::byte> heap;
    std::span<std::byte> append;
    std::span<std::byte> fetch;
  };
  absl::StatusOr<Buffers> MakeBuffers(Client& client, int thread) const;
  absl::Status Append(Client& client, uint64_t seq_key, std::span<std::byte> kv, ThreadResult* r);
  void Lookup(Client& client, uint64_t seq_key, ThreadResult* r);
  void Fetch(Client& client, uint64_t seq_key, std::span<std::byte> out, ThreadResult* r);

  const BenchOptions& opts_;
  const uint64_t block_bytes_;
  const uint64_t run_key_;
  std::atomic<bool> stop_{false};
};

absl::StatusOr<LoadRunner::Buffers> LoadRunner::MakeBuffers(Client& client, int thread) const {
  const uint64_t seq_bytes = uint64_t{opts_.blocks_per_seq} * block_bytes_;
  Buffers b;
  std::span<std::byte> all;
  if (ThreadTransport(opts_, thread) == "shm") {
    absl::StatusOr<std::shared_ptr<SharedRegion>> region = client.CreateSharedRegion(2 * seq_bytes);
    if (!region.ok()) return region.status();
    b.region = *std::move(region);
    all = b.region->bytes();
  } else {
    b.heap.resize(2 * seq_bytes);
    all = b.heap;
  }
  b.append = all.subspan(0, seq_bytes);
  b.fetch = all.subspan(seq_bytes, seq_bytes);
  return b;
}

absl::Status LoadRunner::Append(Client& client, uint64_t seq_key, std::span<std::byte> kv,
                                ThreadResult* r) {
  const size_t n_tokens = size_t{opts_.blocks_per_seq} * opts_.block_tokens;
  const std::vector<uint32_t> tokens = SequenceTokens(seq_key, n_tokens);
  for (uint32_t b = 0; b < opts_.blocks_per_seq; ++b) {
    FillBlock(seq_key, b, std::span(kv).subspan(b * block_bytes_, block_bytes_));
  }
  const absl::Time t0 = absl::Now();
  absl::StatusOr<AppendResult> res = client.Append(opts_.model, tokens, kv);
  if (!res.ok()) {
    r->append.Error(res.status().code());
    return res.status();
  }
  r->append.Record(absl::Now() - t0, kv.size());
  return absl::OkStatus();
}

void LoadRunner::Lookup(Client& client, uint64_t seq_key, ThreadResult* r) {
  const size_t n_tokens = size_t{opts_.blocks_per_seq} * opts_.block_tokens;
  const std::vector<uint32_t> tokens = SequenceTokens(seq_key, n_tokens);
  const absl::Time t0 = absl::Now();
  absl::StatusOr<LookupResult> res = client.Lookup(opts_.model, tokens);
  if (!res.ok()) {
    r->lookup.Error(res.status().code());
    return;
  }
  r->lookup.Record(absl::Now() - t0, 0);
  if (res->matched_tokens != n_tokens) ++r->partial;
}

void LoadRunner::Fetch(Client& client, uint64_t seq_key, std::span<std::byte> out,
                       ThreadResult* r) {
  const size_t n_tokens = size_t{opts_.blocks_per_seq} * opts_.block_tokens;
  const std::vector<uint32_t> tokens = SequenceTokens(seq_key, n_tokens);
  const absl::Time t0 = absl::Now();
  absl::StatusOr<FetchResult> res = client.Fetch(opts_.model, tokens, out);
  if (!res.ok()) {
    r->fetch.Error(res.status().code());
    if (res.status().code() == absl::StatusCode::kDataLoss) {
      std::fprintf(stderr, "fetch: %s\n", res.status().ToString().c_str());
    }
    return;
  }
  r->fetch.Record(absl::Now() - t0, res->bytes);
  if (res->matched_tokens != n_tokens) ++r->partial;
  if (!opts_.verify) return;
  for (uint32_t b = 0; b < res->blocks; ++b) {
    const int64_t bad =
        CheckBlock(seq_key, b, std::span(out).subspan(b * block_bytes_, block_bytes_));
    if (bad >= 0) {
      ++r->corrupt;
      std::fprintf(stderr, "fetch: WRONG BYTES in block %u of sequence %016llx at offset %lld\n", b,
                   static_cast<unsigned long long>(seq_key), static_cast<long long>(bad));
    }
  }
}

void LoadRunner::Run(Client& client, int thread, absl::Barrier* ready, absl::Barrier* start,
                     ThreadResult* r) {
  std::mt19937_64 rng(run_key_ + thread);
  absl::StatusOr<Buffers> buffers = MakeBuffers(client, thread);
  if (!buffers.ok()) {
    r->setup_error = absl::StrCat("buffers: ", buffers.status().ToString());
    ready->Block();
    start->Block();
    return;
  }
  std::vector<uint64_t> ring;  // the thread's sequences, oldest replaced first
  uint64_t next_seq = 0;
  size_t ring_next = 0;
  if (opts_.mode != "append") {
    for (uint32_t i = 0; i < opts_.working_set; ++i) {
      const uint64_t key = SeqKey(thread, next_seq++);
      if (absl::Status s = Append(client, key, buffers->append, r); !s.ok()) {
        r->setup_error = absl::StrCat("setup append: ", s.ToString());
        break;
      }
      ring.push_back(key);
    }
    r->append = OpStats();  // setup appends are not measured
  }
  std::vector<int> weights = {100, 0, 0};
  if (opts_.mode == "fetch") weights = {0, 0, 100};
  if (opts_.mode == "lookup") weights = {0, 100, 0};
  if (opts_.mode == "mixed") {
    std::vector<std::string> parts = absl::StrSplit(opts_.mix, ',');
    for (size_t i = 0; i < 3 && i < parts.size(); ++i) {
      if (!absl::SimpleAtoi(parts[i], &weights[i])) weights[i] = 0;
    }
  }
  std::discrete_distribution<int> pick(weights.begin(), weights.end());
  ready->Block();
  start->Block();
  if (!r->setup_error.empty()) return;
  while (!stop_.load(std::memory_order_relaxed)) {
    const int op = pick(rng);
    if (op == 0) {
      const uint64_t key = SeqKey(thread, next_seq++);
      if (!Append(client, key, buffers->append, r).ok()) continue;
      if (ring.size() < std::max<uint32_t>(opts_.working_set, 1)) {
        ring.push_back(key);
      } else {
        ring[ring_next++ % ring.size()] = key;
      }
      continue;
    }
    if (ring.empty()) continue;
    const uint64_t key = ring[rng() % ring.size()];
    if (op == 1) {
      Lookup(client, key, r);
    } else {
      Fetch(client, key, buffers->fetch, r);
    }
  }
}

// Per path: its table, its per-worker throughput and fetch p99; then the
// ratios of the slower path to the faster.
void PrintFairness(ThreadResult (&paths)[2], int workers_per_path, double seconds) {
  const char* names[2] = {"shm", "grpc"};
  double per_worker[2], p99[2];
  for (int i = 0; i < 2; ++i) {
    ThreadResult& p = paths[i];
    std::printf("path %s (%d workers):\n", names[i], workers_per_path);
    PrintOpTable({{"append", &p.append}, {"lookup", &p.lookup}, {"fetch", &p.fetch}}, seconds);
    const double ops = p.append.count() + p.lookup.count() + p.fetch.count();
    per_worker[i] = ops / seconds / workers_per_path;
    p99[i] = p.fetch.PercentileMs(0.99);
  }
  for (int i = 0; i < 2; ++i) {
    std::printf("per-path %s: %.1f ops/s per worker, fetch p99 %.3f ms\n", names[i], per_worker[i],
                p99[i]);
  }
  const double hi = std::max(per_worker[0], per_worker[1]);
  const double p99_lo = std::min(p99[0], p99[1]);
  std::printf("fairness: per-worker throughput ratio (slower/faster) %.3f (rule >= 0.5)\n",
              hi > 0 ? std::min(per_worker[0], per_worker[1]) / hi : 0.0);
  std::printf("fairness: fetch p99 ratio (slower/faster) %.2fx (rule <= 3)\n",
              p99_lo > 0 ? std::max(p99[0], p99[1]) / p99_lo : 0.0);
}

}  // namespace

// Switches the model to opts.compress and waits (up to 60 s) until the
// daemon's compaction has compressed what it can of the working set. The
// daemon must count blocks as cold quickly (importance.cold_after_seconds).
void CompressWorkingSet(Client& client, const BenchOptions& opts) {
  v1::UpdateModelPolicyRequest req;
  req.set_model_id(opts.model);
  req.set_mode(opts.compress == "prune" ? v1::COMPRESSION_MODE_PRUNE
                                        : v1::COMPRESSION_MODE_QUANTIZE);
  if (auto r = client.UpdateModelPolicy(req); !r.ok()) {
    std::fprintf(stderr, "kvcache-bench: UpdateModelPolicy: %s\n", r.status().ToString().c_str());
    return;
  }
  uint64_t compressed = 0, blocks = 0, saved = 0, last = 0;
  absl::Time changed = absl::Now();
  for (const absl::Time deadline = absl::Now() + absl::Seconds(60); absl::Now() < deadline;) {
    absl::StatusOr<v1::GetStatsResponse> stats = client.GetStats();
    if (!stats.ok()) break;
    for (const v1::ModelStats& m : stats->models()) {
      if (m.model_id() != opts.model) continue;
      compressed = m.compressed_blocks();
      blocks = m.blocks();
      saved = m.bytes_saved();
    }
    if (compressed != last) {
      last = compressed;
      changed = absl::Now();
    } else if (compressed > 0 && absl::Now() - changed > absl::Seconds(3)) {
      break;  // compaction has done what it can (the recent windows stay raw)
    }
    absl::SleepFor(absl::Milliseconds(200));
  }
  std::printf("compression=%s: %llu of %llu blocks compressed, %.1f MiB saved\n",
              opts.compress.c_str(), static_cast<unsigned long long>(compressed),
              static_cast<unsigned long long>(blocks), saved / 1048576.0);
}

int RunLoad(const BenchOptions& opts) {
  absl::StatusOr<v1::DType> dtype = ParseDType(opts.dtype);
  if (!dtype.ok()) {
    std::fprintf(stderr, "kvcache-bench: %s\n", std::string(dtype.status().message()).c_str());
    return 2;
  }
  if (opts.mode == "mixed") {
    std::vector<std::string> parts = absl::StrSplit(opts.mix, ',');
    int w = 0, sum = 0;
    bool ok = parts.size() == 3;
    for (const auto& p : parts) ok = ok && absl::SimpleAtoi(p, &w) && w >= 0 && (sum += w) >= 0;
    if (!ok || sum == 0) {
      std::fprintf(stderr, "kvcache-bench: --mix '%s' must be three non-negative weights A,L,F\n",
                   opts.mix.c_str());
      return 2;
    }
  }
  absl::StatusOr<std::unique_ptr<Client>> main_client = ConnectClient(opts);
  if (!main_client.ok()) {
    std::fprintf(stderr, "kvcache-bench: %s\n", main_client.status().ToString().c_str());
    return 1;
  }
  v1::ModelLayout layout;
  layout.set_num_layers(opts.layers);
  layout.set_num_kv_heads(opts.kv_heads);
  layout.set_head_dim(opts.head_dim);
  layout.set_dtype(*dtype);
  layout.set_block_tokens(opts.block_tokens);
  absl::StatusOr<v1::RegisterModelResponse> reg = (*main_client)->RegisterModel(opts.model, layout);
  if (!reg.ok()) {
    std::fprintf(stderr, "kvcache-bench: RegisterModel(%s): %s\n", opts.model.c_str(),
                 reg.status().ToString().c_str());
    return 1;
  }
  const uint64_t block_bytes = reg->block_bytes();
  const uint64_t run_key =
      opts.seed != 0 ? opts.seed : static_cast<uint64_t>(absl::ToUnixNanos(absl::Now()));
  std::printf(
      "mode=%s target=%s clients=%d%s duration=%.1fs model=%s block=%u tokens x %llu "
      "bytes, %u blocks/seq (%.2f MiB per sequence)\n",
      opts.mode.c_str(), opts.target.c_str(), opts.clients,
      opts.shared_client ? " (one shared Client)" : "", opts.duration_s, opts.model.c_str(),
      reg->layout().block_tokens(), static_cast<unsigned long long>(block_bytes),
      opts.blocks_per_seq, opts.blocks_per_seq * block_bytes / 1048576.0);

  std::vector<std::unique_ptr<Client>> clients;
  const bool both = opts.transport == "both";
  for (int i = 0; i < opts.clients && (!opts.shared_client || both); ++i) {
    absl::StatusOr<std::unique_ptr<Client>> c = ConnectClient(opts, ThreadTransport(opts, i));
    if (!c.ok()) {
      std::fprintf(stderr, "kvcache-bench: %s\n", c.status().ToString().c_str());
      return 1;
    }
    // Idempotent; also gives the client the layout it splits appends by.
    if (auto r = (*c)->RegisterModel(opts.model, layout); !r.ok()) {
      std::fprintf(stderr, "kvcache-bench: %s\n", r.status().ToString().c_str());
      return 1;
    }
    clients.push_back(*std::move(c));
  }

  LoadRunner runner(opts, block_bytes, run_key);
  std::vector<ThreadResult> results(opts.clients);
  // Both outlive every thread that blocks on them.
  absl::Barrier ready(opts.clients + 1);
  absl::Barrier start(opts.clients + 1);
  std::vector<std::thread> threads;
  for (int i = 0; i < opts.clients; ++i) {
    Client& c = opts.shared_client && !both ? **main_client : *clients[i];
    threads.emplace_back([&, i, cptr = &c] { runner.Run(*cptr, i, &ready, &start, &results[i]); });
  }
  ready.Block();
  if (!opts.compress.empty()) CompressWorkingSet(**main_client, opts);
  start.Block();
  const absl::Time t0 = absl::Now();
  absl::SleepFor(absl::Seconds(opts.duration_s));
  runner.stop() = true;
  for (auto& t : threads) t.join();
  const double seconds = absl::ToDoubleSeconds(absl::Now() - t0);

  ThreadResult total;
  ThreadResult per_path[2];  // --transport both: shm, grpc
  for (size_t i = 0; i < results.size(); ++i) {
    const ThreadResult& r = results[i];
    if (!r.setup_error.empty()) {
      std::fprintf(stderr, "kvcache-bench: %s\n", r.setup_error.c_str());
      return 1;
    }
    if (both) {
      ThreadResult& p = per_path[ThreadTransport(opts, static_cast<int>(i)) == "shm" ? 0 : 1];
      p.append.Merge(r.append);
      p.lookup.Merge(r.lookup);
      p.fetch.Merge(r.fetch);
    }
    total.append.Merge(r.append);
    total.lookup.Merge(r.lookup);
    total.fetch.Merge(r.fetch);
    total.partial += r.partial;
    total.corrupt += r.corrupt;
  }
  std::printf("elapsed %.2fs\n", seconds);
  PrintOpTable({{"append", &total.append}, {"lookup", &total.lookup}, {"fetch", &total.fetch}},
               seconds);
  if (both) PrintFairness(per_path, opts.clients / 2, seconds);
  if (total.lookup.count() + total.fetch.count() > 0) {
    std::printf("partial hits (sequence partly evicted): %llu\n",
                static_cast<unsigned long long>(total.partial));
  }
  if (opts.verify && total.fetch.count() > 0) {
    std::printf("verified fetched blocks against the pattern: %s\n",
                total.corrupt == 0 ? "all correct" : absl::StrCat(total.corrupt, " WRONG").c_str());
  }
  PrintServerStats(**main_client, opts.model);
  uint64_t data_loss = 0;
  for (OpStats* s : {&total.append, &total.lookup, &total.fetch}) {
    auto it = s->errors().find(absl::StatusCode::kDataLoss);
    if (it != s->errors().end()) data_loss += it->second;
  }
  return total.corrupt == 0 && data_loss == 0 ? 0 : 1;
}

}  // namespace kvcache::bench
