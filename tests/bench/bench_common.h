// Shared pieces of kvcache-bench: options, synthetic sequences and payloads,
// latency recording and the report.
//
// Payloads are a deterministic pattern of (sequence key, block index), so a
// fetched block can be checked byte for byte without keeping a copy: the
// client already verifies the server's checksum; the pattern also catches a
// server that hands back another block's (correctly checksummed) bytes.
#ifndef KVCACHE_TESTS_BENCH_BENCH_COMMON_H_
#define KVCACHE_TESTS_BENCH_BENCH_COMMON_H_

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "kvcache/client.h"

namespace kvcache::bench {

struct BenchOptions {
  std::string mode;
  std::string target = "localhost:50051";
  std::string ns;
  std::string token;  // bearer token for a daemon with authentication on
  std::string model = "bench-model";
  int clients = 4;
  bool shared_client = false;
  // How data calls travel: "grpc", "shm" (the shared-memory data plane,
  // with each thread's buffers in a SharedRegion: no client-side copy) or
  // "auto" (the client's default: shared memory for unix:// targets, through
  // its staging region) or "both" (load modes: half the clients on shared
  // memory, half on gRPC, at once; reported per path with fairness ratios).
  std::string transport = "auto";
  std::string grpc_target;  // --transport both: the gRPC clients' target (empty: --target)
  double duration_s = 10;
  double timeout_s = 30;
  uint64_t seed = 0;  // 0: derived from the clock, so runs do not share blocks
  // Layout (load modes).
  uint32_t layers = 32;
  uint32_t kv_heads = 8;
  uint32_t head_dim = 128;
  std::string dtype = "fp16";
  uint32_t block_tokens = 16;
  uint32_t blocks_per_seq = 4;
  uint32_t working_set = 8;      // sequences per client for fetch/lookup/mixed
  std::string mix = "20,40,40";  // mixed: append,lookup,fetch weights
  bool verify = true;            // fetch: check the payload pattern
  std::string compress;          // fetch: "", "quantize" or "prune" the working set first
  // Trace mode.
  std::string trace;
  uint64_t limit = 0;  // 0: the whole trace
  uint32_t bytes_per_token = 16;
  bool fetch_hits = false;
  bool keep_cache = false;  // trace: do not evict the model's cache first
  // trace: issue each request at its timestamp divided by this (0: as fast
  // as possible, timestamps ignored).
  double speedup = 0;
};

absl::StatusOr<v1::DType> ParseDType(const std::string& name);
size_t DTypeSize(v1::DType dtype);

// Connects and waits for the daemon; the error says where it looked.
// `transport` overrides opts.transport (for --transport both, "shm" or "grpc").
absl::StatusOr<std::unique_ptr<Client>> ConnectClient(const BenchOptions& opts,
                                                      std::string_view transport = {});

// The tokens of sequence `seq_key`: `n` ids, distinct between sequences.
std::vector<uint32_t> SequenceTokens(uint64_t seq_key, size_t n);
// Fills `out` with the pattern of block `block` of sequence `seq_key`.
void FillBlock(uint64_t seq_key, uint64_t block, std::span<std::byte> out);
// The offset of the first byte of `data` that differs from the pattern, or -1.
int64_t CheckBlock(uint64_t seq_key, uint64_t block, std::span<const std::byte> data);

// Latencies and bytes of one kind of operation.
class OpStats {
 public:
  void Record(absl::Duration latency, uint64_t bytes) {
    nanos_.push_back(absl::ToInt64Nanoseconds(latency));
    bytes_ += bytes;
  }
  void Error(absl::StatusCode code) { ++errors_[code]; }
  void Merge(const OpStats& other);

  size_t count() const { return nanos_.size(); }
  uint64_t bytes() const { return bytes_; }
  const std::map<absl::StatusCode, uint64_t>& errors() const { return errors_; }
  // Percentile q in [0, 1] of the recorded latencies, in milliseconds.
  // Sorts lazily; not thread-safe.
  double PercentileMs(double q);
  double MaxMs();

 private:
  std::vector<int64_t> nanos_;
  bool sorted_ = false;
  uint64_t bytes_ = 0;
  std::map<absl::StatusCode, uint64_t> errors_;
};

// Prints "op count ops/s GB/s p50 p99 max errors" rows for every non-empty op.
void PrintOpTable(const std::vector<std::pair<std::string, OpStats*>>& ops, double seconds);
// Prints the daemon's tier table and counters (and the given model's row).
void PrintServerStats(Client& client, const std::string& model);

// The benchmark modes; each returns the process exit code.
int RunLoad(const BenchOptions& opts);   // append, fetch, lookup, mixed
int RunTrace(const BenchOptions& opts);  // trace

}  // namespace kvcache::bench

#endif  // KVCACHE_TESTS_BENCH_BENCH_COMMON_H_
