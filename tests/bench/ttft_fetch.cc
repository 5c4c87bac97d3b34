// kvcache-ttft-fetch: the fetch side of the time-to-first-token benchmark
// (tests/eval/ttft_bench.py drives it; docs/benchmarks.md, "Time to first
// token on the real model").
//
//   kvcache-ttft-fetch --target unix:///path/kvcached.sock --prefix-tokens 480,992 [--runs 7]
//
// Contract. For each prefix length P (a multiple of --block-tokens) it appends
// P tokens of KV in the model's layout (default SmolLM2-135M: 30 layers x 3 KV
// heads x 64 dims, fp16, 32-token blocks) to a running kvcached under two
// models: "<model>-raw" (compression off) and "<model>-int8" (switched to
// quantize mode after the append; the daemon must count blocks as cold within
// a second or two: importance.cold_after_seconds 1). Appends are not timed.
// It then times, --runs times interleaved, each way a worker on the daemon's
// host can get that prefix into its own buffer, from the request to verified
// bytes in the buffer:
//   shm-raw     Fetch over shared memory into a SharedRegion (the daemon
//               copies, the client checks every block's XXH3): main's fastest
//               host path
//   grpc-raw    Fetch over gRPC into a heap buffer (the remote path)
//   shm-lossy   Fetch(accept_lossy) of the quantized copy over shared memory:
//               the daemon decodes INT8 to fp16 as it copies
//   grpc-int8   FetchBlocks(lossy_as_stored) over gRPC: the compressed bytes
//               move, then the client decodes them (decode_ms, included in ms)
//   memcpy      a memcpy of the prefix's bytes between two pre-faulted
//               buffers: what copying it into an engine's own tensors costs
// Each path's bytes are checked after its timing: raw paths byte for byte
// against what was appended; shm-lossy and grpc-int8 against each other (the
// same codec, so bit-identical) and raw blocks against the source.
//
// The KV is synthetic (finite fp16 values with random signs, exponents and
// mantissas), not the model's: the daemon never reads the values, and INT8
// sizes and codec speed do not depend on them. Prints one JSON object per
// (prefix, path) on stdout: {"prefix_tokens", "path", "bytes_moved",
// "bytes_out", "ms": [...], "median_ms", "decode_median_ms", "blocks",
// "compressed_blocks", "verified"}. Exit 1 on any failed call or wrong byte.
#include <CLI/CLI.hpp>
#include <algorithm>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "bench_common.h"
#include "server/common/splitmix64.h"
#include "server/importance/block_codec.h"

namespace kvcache::bench {
namespace {

struct TtftOptions {
  std::string target;
  std::string model = "smollm2-135m-ttft";
  std::vector<uint32_t> prefix_tokens;
  uint32_t layers = 30, kv_heads = 3, head_dim = 64, block_tokens = 32;
  int runs = 7;
  double compress_wait_s = 60;
};

struct PathResult {
  std::string path;
  uint64_t bytes_moved = 0;  // bytes that crossed from the daemon to the worker
  uint64_t bytes_out = 0;    // fp16 KV bytes in the worker's buffer
  std::vector<double> ms, decode_ms;
  uint32_t blocks = 0, compressed_blocks = 0;
  bool verified = true;
};

double Median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

double MsSince(absl::Time t0) { return absl::ToDoubleMilliseconds(absl::Now() - t0); }

// Finite fp16 values: random sign, exponent 2^-6..2^1, random mantissa.
void FillKv(uint64_t seed, std::span<std::byte> out) {
  uint64_t x = seed;
  for (size_t i = 0; i + 1 < out.size(); i += 2) {
    const uint64_t z = SplitMix64Next(x);
    const uint16_t h =
        static_cast<uint16_t>(((z & 1) << 15) | ((9 + (z >> 1) % 8) << 10) | ((z >> 8) & 0x3FF));
    std::memcpy(out.data() + i, &h, 2);
  }
}

void PrintJson(uint32_t prefix, const PathResult& r) {
  std::vector<std::string> ms;
  for (double m : r.ms) ms.push_back(absl::StrFormat("%.4f", m));
  std::printf(
      "{\"prefix_tokens\": %u, \"path\": \"%s\", \"bytes_moved\": %llu, \"bytes_out\": %llu, "
      "\"ms\": [%s], \"median_ms\": %.4f, \"decode_median_ms\": %.4f, \"blocks\": %u, "
      "\"compressed_blocks\": %u, \"verified\": %s}\n",
      prefix, r.path.c_str(), static_cast<unsigned long long>(r.bytes_moved),
      static_cast<unsigned long long>(r.bytes_out), absl::StrJoin(ms, ", ").c_str(), Median(r.ms),
      Median(r.decode_ms), r.blocks, r.compressed_blocks, r.verified ? "true" : "false");
  std::fflush(stdout);
}

// Waits until the daemon has compressed `want` blocks of `model` (or the wait ends).
uint64_t WaitForCompression(Client& client, const std::string& model, uint64_t want,
                            double wait_s) {
  uint64_t compressed = 0;
  for (const absl::Time end = absl::Now() + absl::Seconds(wait_s); absl::Now() < end;) {
    absl::StatusOr<v1::GetStatsResponse> stats = client.GetStats();
    if (!stats.ok()) break;
    for (const v1::ModelStats& m : stats->models()) {
      if (m.model_id() == model) compressed = m.compressed_blocks();
    }
    if (compressed >= want) break;
    absl::SleepFor(absl::Milliseconds(100));
  }
  return compressed;
}

class TtftFetch {
 public:
  explicit TtftFetch(const TtftOptions& o) : o_(o) {}
  int Run();

 private:
  absl::Status Setup();
  absl::Status MeasurePrefix(uint32_t prefix);

  const TtftOptions& o_;
  v1::ModelLayout layout_;
  uint64_t block_bytes_ = 0;
  std::unique_ptr<Client> shm_, grpc_;
  std::string raw_model_, int8_model_;
  uint64_t compressed_so_far_ = 0;  // the int8 model's compressed blocks before this prefix
};

absl::Status TtftFetch::Setup() {
  BenchOptions b;
  b.target = o_.target;
  b.transport = "shm";
  absl::StatusOr<std::unique_ptr<Client>> shm = ConnectClient(b);
  if (!shm.ok()) return shm.status();
  b.transport = "grpc";
  absl::StatusOr<std::unique_ptr<Client>> grpc = ConnectClient(b);
  if (!grpc.ok()) return grpc.status();
  shm_ = *std::move(shm);
  grpc_ = *std::move(grpc);
  layout_.set_num_layers(o_.layers);
  layout_.set_num_kv_heads(o_.kv_heads);
  layout_.set_head_dim(o_.head_dim);
  layout_.set_dtype(v1::DTYPE_FP16);
  layout_.set_block_tokens(o_.block_tokens);
  raw_model_ = o_.model + "-raw";
  int8_model_ = o_.model + "-int8";
  for (const std::string& m : {raw_model_, int8_model_}) {
    for (Client* c : {shm_.get(), grpc_.get()}) {
      absl::StatusOr<v1::RegisterModelResponse> reg = c->RegisterModel(m, layout_);
      if (!reg.ok()) return reg.status();
      block_bytes_ = reg->block_bytes();
    }
  }
  return absl::OkStatus();
}

absl::Status TtftFetch::MeasurePrefix(uint32_t prefix) {
  if (prefix == 0 || prefix % o_.block_tokens != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--prefix-tokens ", prefix, " is not a positive multiple of ", o_.block_tokens));
  }
  const uint32_t blocks = prefix / o_.block_tokens;
  const uint64_t bytes = uint64_t{blocks} * block_bytes_;
  const std::vector<uint32_t> tokens = SequenceTokens(0x77f7 + prefix, prefix);
  // One region: the appended source, the fetch destination, a second destination.
  absl::StatusOr<std::shared_ptr<SharedRegion>> region = shm_->CreateSharedRegion(3 * bytes);
  if (!region.ok()) return region.status();
  std::span<std::byte> all = (*region)->bytes();
  std::span<std::byte> src = all.subspan(0, bytes), dst = all.subspan(bytes, bytes),
                       dst2 = all.subspan(2 * bytes, bytes);
  FillKv(prefix, src);
  std::memset(dst.data(), 0, bytes);  // fault in every page before timing
  std::memset(dst2.data(), 0, bytes);
  std::vector<std::byte> heap(bytes), lossy(bytes), decoded(bytes);

  for (const std::string& m : {raw_model_, int8_model_}) {
    absl::StatusOr<AppendResult> a = shm_->Append(m, tokens, src);
    if (!a.ok()) return a.status();
  }
  v1::UpdateModelPolicyRequest policy;
  policy.set_model_id(int8_model_);
  policy.set_mode(v1::COMPRESSION_MODE_QUANTIZE);
  if (auto r = shm_->UpdateModelPolicy(policy); !r.ok()) return r.status();
  // Every block but those wholly inside the 64-token recent window.
  const uint32_t window_blocks = (64 + o_.block_tokens - 1) / o_.block_tokens;
  const uint32_t want = blocks > window_blocks ? blocks - window_blocks : 0;
  // compressed_blocks counts the model's whole cache, earlier prefixes included.
  const uint64_t total =
      WaitForCompression(*shm_, int8_model_, compressed_so_far_ + want, o_.compress_wait_s);
  const uint32_t compressed = static_cast<uint32_t>(total - compressed_so_far_);
  compressed_so_far_ = total;

  PathResult shm_raw{.path = "shm-raw"}, grpc_raw{.path = "grpc-raw"},
      shm_lossy{.path = "shm-lossy"}, grpc_int8{.path = "grpc-int8"}, copy{.path = "memcpy"};
  for (PathResult* r : {&shm_raw, &grpc_raw, &shm_lossy, &grpc_int8, &copy}) {
    r->blocks = blocks;
    r->bytes_out = bytes;
    r->bytes_moved = bytes;
  }
  shm_lossy.compressed_blocks = compressed;
  grpc_int8.compressed_blocks = compressed;
  auto check = [&](PathResult& r, absl::StatusOr<FetchResult>& f) -> absl::Status {
    if (!f.ok()) return f.status();
    if (f->matched_tokens != prefix) {
      r.verified = false;
      return absl::DataLossError(
          absl::StrCat(r.path, ": matched ", f->matched_tokens, " of ", prefix, " tokens"));
    }
    return absl::OkStatus();
  };
  for (int run = 0; run < o_.runs; ++run) {
    absl::Time t0 = absl::Now();
    absl::StatusOr<FetchResult> f = shm_->Fetch(raw_model_, tokens, dst);
    shm_raw.ms.push_back(MsSince(t0));
    if (absl::Status s = check(shm_raw, f); !s.ok()) return s;
    if (std::memcmp(dst.data(), src.data(), bytes) != 0) shm_raw.verified = false;

    t0 = absl::Now();
    f = grpc_->Fetch(raw_model_, tokens, heap);
    grpc_raw.ms.push_back(MsSince(t0));
    if (absl::Status s = check(grpc_raw, f); !s.ok()) return s;
    if (std::memcmp(heap.data(), src.data(), bytes) != 0) grpc_raw.verified = false;

    t0 = absl::Now();
    f = shm_->Fetch(int8_model_, tokens, dst2, {.accept_lossy = true});
    shm_lossy.ms.push_back(MsSince(t0));
    if (absl::Status s = check(shm_lossy, f); !s.ok()) return s;
    std::memcpy(lossy.data(), dst2.data(), bytes);  // untimed: kept for the comparison

    t0 = absl::Now();
    absl::StatusOr<std::vector<FetchedBlock>> fb =
        grpc_->FetchBlocks(int8_model_, tokens, /*lossy_as_stored=*/true, {.accept_lossy = true});
    const absl::Time t1 = absl::Now();
    if (!fb.ok()) return fb.status();
    if (fb->size() != blocks) {
      return absl::DataLossError(
          absl::StrCat("grpc-int8: ", fb->size(), " of ", blocks, " blocks"));
    }
    uint64_t moved = 0;
    for (const FetchedBlock& b : *fb) {
      moved += b.bytes.size();
      std::span<std::byte> out = std::span(decoded).subspan(b.index * block_bytes_, block_bytes_);
      const auto* p = reinterpret_cast<const std::byte*>(b.bytes.data());
      if (b.encoding == v1::BLOCK_ENCODING_COMPRESSED) {
        absl::StatusOr<importance::CompressedBlockView> view =
            importance::ParseCompressedBlock({p, b.bytes.size()});
        if (!view.ok()) return view.status();
        if (absl::Status s = importance::DecodeBlock(*view, out); !s.ok()) return s;
      } else {
        std::memcpy(out.data(), p, out.size());
      }
    }
    grpc_int8.decode_ms.push_back(MsSince(t1));
    grpc_int8.ms.push_back(MsSince(t0));
    grpc_int8.bytes_moved = moved;
    if (std::memcmp(decoded.data(), lossy.data(), bytes) != 0) {
      grpc_int8.verified = shm_lossy.verified = false;
    }
    // The blocks left raw (the recent window) must be exact.
    const uint64_t raw_from = uint64_t{compressed} * block_bytes_;
    if (std::memcmp(lossy.data() + raw_from, src.data() + raw_from, bytes - raw_from) != 0) {
      shm_lossy.verified = false;
    }

    t0 = absl::Now();
    std::memcpy(dst2.data(), dst.data(), bytes);
    copy.ms.push_back(MsSince(t0));
  }
  shm_lossy.bytes_moved = bytes;  // decoded by the daemon, fp16 through shared memory
  for (PathResult* r : {&shm_raw, &grpc_raw, &shm_lossy, &grpc_int8, &copy}) {
    PrintJson(prefix, *r);
    if (!r->verified) return absl::DataLossError(absl::StrCat(r->path, ": WRONG BYTES"));
  }
  return absl::OkStatus();
}

int TtftFetch::Run() {
  if (absl::Status s = Setup(); !s.ok()) {
    std::fprintf(stderr, "kvcache-ttft-fetch: %s\n", s.ToString().c_str());
    return 1;
  }
  for (uint32_t p : o_.prefix_tokens) {
    if (absl::Status s = MeasurePrefix(p); !s.ok()) {
      std::fprintf(stderr, "kvcache-ttft-fetch: prefix %u: %s\n", p, s.ToString().c_str());
      return 1;
    }
  }
  return 0;
}

}  // namespace
}  // namespace kvcache::bench

int main(int argc, char** argv) {
  kvcache::bench::TtftOptions o;
  CLI::App app(
      "kvcache-ttft-fetch: times fetching a cached prefix's KV from kvcached over every path a\n"
      "worker on the daemon's host has (tests/eval/ttft_bench.py drives it). One JSON line per\n"
      "(prefix, path). Exits 1 on a failed call or a wrong byte, 2 on a bad command line.",
      "kvcache-ttft-fetch");
  app.add_option("--target", o.target, "the daemon's unix:///path socket (shared memory)")
      ->required();
  app.add_option("--prefix-tokens", o.prefix_tokens, "prefix lengths, multiples of block tokens")
      ->required()
      ->delimiter(',');
  app.add_option("--model", o.model, "model id prefix (-raw and -int8 are appended)")
      ->capture_default_str();
  app.add_option("--layers", o.layers, "layout: num_layers")->capture_default_str();
  app.add_option("--kv-heads", o.kv_heads, "layout: num_kv_heads")->capture_default_str();
  app.add_option("--head-dim", o.head_dim, "layout: head_dim")->capture_default_str();
  app.add_option("--block-tokens", o.block_tokens, "layout: tokens per block")
      ->capture_default_str();
  app.add_option("--runs", o.runs, "timed fetches per path and prefix")
      ->capture_default_str()
      ->check(CLI::Range(1, 1000));
  app.add_option("--compress-wait", o.compress_wait_s,
                 "seconds to wait for the daemon to quantize a prefix")
      ->capture_default_str();
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e) == 0 ? 0 : 2;
  }
  return kvcache::bench::TtftFetch(o).Run();
}
