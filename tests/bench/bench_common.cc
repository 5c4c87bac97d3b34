#include "bench_common.h"

#include <algorithm>
#include <cstdio>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "server/common/splitmix64.h"

namespace kvcache::bench {
namespace {

uint64_t BlockSeed(uint64_t seq_key, uint64_t block) {
  return SplitMix64(seq_key ^ SplitMix64(block + 0x5151));
}

// Word i of a block's pattern: cheap to make and to check, distinct per word.
inline uint64_t PatternWord(uint64_t seed, uint64_t i) {
  return seed ^ (i * 0xD6E8FEB86659FD93ull);
}

}  // namespace

absl::StatusOr<v1::DType> ParseDType(const std::string& name) {
  if (name == "fp16") return v1::DTYPE_FP16;
  if (name == "bf16") return v1::DTYPE_BF16;
  if (name == "fp32") return v1::DTYPE_FP32;
  return absl::InvalidArgumentError(
      absl::StrCat("--dtype is '", name, "'; expected fp16, bf16 or fp32"));
}

size_t DTypeSize(v1::DType dtype) { return dtype == v1::DTYPE_FP32 ? 4 : 2; }

absl::StatusOr<std::unique_ptr<Client>> ConnectClient(const BenchOptions& opts,
                                                      std::string_view transport_override) {
  const std::string transport =
      transport_override.empty() ? opts.transport : std::string(transport_override);
  ClientOptions o;
  o.target = transport == "grpc" && !opts.grpc_target.empty() ? opts.grpc_target : opts.target;
  o.ns = opts.ns;
  o.token = opts.token;
  o.timeout = absl::Seconds(opts.timeout_s);
  if (transport == "grpc") o.data_path = DataPath::kGrpc;
  if (transport == "shm") o.data_path = DataPath::kSharedMemory;
  absl::StatusOr<std::unique_ptr<Client>> client = Client::Connect(o);
  if (!client.ok()) return client.status();
  if (absl::Status s = (*client)->WaitForReady(absl::Seconds(10)); !s.ok()) return s;
  if (transport == "shm" && !(*client)->UsesSharedMemory()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "--transport ", opts.transport, ": ", o.target, " offers no shared-memory data plane"));
  }
  return client;
}

std::vector<uint32_t> SequenceTokens(uint64_t seq_key, size_t n) {
  std::vector<uint32_t> tokens(n);
  const uint64_t base = SplitMix64(seq_key);
  for (size_t i = 0; i < n; ++i) tokens[i] = static_cast<uint32_t>(SplitMix64(base + i) >> 32);
  return tokens;
}

void FillBlock(uint64_t seq_key, uint64_t block, std::span<std::byte> out) {
  const uint64_t seed = BlockSeed(seq_key, block);
  const size_t words = out.size() / 8;
  for (size_t i = 0; i < words; ++i) {
    const uint64_t w = PatternWord(seed, i);
    std::memcpy(out.data() + i * 8, &w, 8);
  }
  const uint64_t tail = PatternWord(seed, words);
  std::memcpy(out.data() + words * 8, &tail, out.size() % 8);
}

int64_t CheckBlock(uint64_t seq_key, uint64_t block, std::span<const std::byte> data) {
  const uint64_t seed = BlockSeed(seq_key, block);
  const size_t words = data.size() / 8;
  for (size_t i = 0; i < words; ++i) {
    uint64_t w;
    std::memcpy(&w, data.data() + i * 8, 8);
    if (w != PatternWord(seed, i)) return static_cast<int64_t>(i * 8);
  }
  const uint64_t tail = PatternWord(seed, words);
  if (std::memcmp(data.data() + words * 8, &tail, data.size() % 8) != 0) {
    return static_cast<int64_t>(words * 8);
  }
  return -1;
}

void OpStats::Merge(const OpStats& other) {
  nanos_.insert(nanos_.end(), other.nanos_.begin(), other.nanos_.end());
  sorted_ = false;
  bytes_ += other.bytes_;
  for (const auto& [code, n] : other.errors_) errors_[code] += n;
}

double OpStats::PercentileMs(double q) {
  if (nanos_.empty()) return 0;
  if (!sorted_) {
    std::sort(nanos_.begin(), nanos_.end());
    sorted_ = true;
  }
  const size_t i = std::min(nanos_.size() - 1, static_cast<size_t>(q * (nanos_.size() - 1) + 0.5));
  return static_cast<double>(nanos_[i]) / 1e6;
}

double OpStats::MaxMs() { return PercentileMs(1.0); }

void PrintOpTable(const std::vector<std::pair<std::string, OpStats*>>& ops, double seconds) {
  std::printf("%-8s %10s %10s %8s %9s %9s %9s  %s\n", "op", "count", "ops/s", "GB/s", "p50_ms",
              "p99_ms", "max_ms", "errors");
  for (const auto& [name, st] : ops) {
    uint64_t errors = 0;
    std::string detail;
    for (const auto& [code, n] : st->errors()) {
      errors += n;
      absl::StrAppend(&detail, detail.empty() ? "" : ",", absl::StatusCodeToString(code), "=", n);
    }
    if (st->count() == 0 && errors == 0) continue;
    std::printf("%-8s %10zu %10.1f %8.3f %9.3f %9.3f %9.3f  %llu%s%s%s\n", name.c_str(),
                st->count(), st->count() / seconds, st->bytes() / seconds / 1e9,
                st->PercentileMs(0.50), st->PercentileMs(0.99), st->MaxMs(),
                static_cast<unsigned long long>(errors), detail.empty() ? "" : " (", detail.c_str(),
                detail.empty() ? "" : ")");
  }
}

void PrintServerStats(Client& client, const std::string& model) {
  absl::StatusOr<v1::GetStatsResponse> stats = client.GetStats();
  if (!stats.ok()) {
    std::printf("server stats: unavailable (%s)\n", stats.status().ToString().c_str());
    return;
  }
  std::printf("server: active_leases=%llu capacity_evictions=%llu rejected_appends=%llu\n",
              static_cast<unsigned long long>(stats->active_leases()),
              static_cast<unsigned long long>(stats->capacity_evictions()),
              static_cast<unsigned long long>(stats->rejected_appends()));
  for (const v1::TierStats& t : stats->tiers()) {
    std::printf("tier %-6s capacity=%.1f MiB used=%.1f MiB (%.1f%%) payload=%.1f MiB blocks=%llu\n",
                t.name().c_str(), t.capacity_bytes() / 1048576.0, t.used_bytes() / 1048576.0,
                t.capacity_bytes() ? 100.0 * t.used_bytes() / t.capacity_bytes() : 0.0,
                t.payload_bytes() / 1048576.0, static_cast<unsigned long long>(t.blocks()));
  }
  for (const v1::ModelStats& m : stats->models()) {
    if (m.model_id() != model) continue;
    std::printf(
        "model %s/%s: blocks=%llu bytes=%.1f MiB hit_tokens=%llu miss_tokens=%llu "
        "appended=%llu dedup=%llu evicted=%llu\n",
        m.namespace_().c_str(), m.model_id().c_str(), static_cast<unsigned long long>(m.blocks()),
        m.bytes() / 1048576.0, static_cast<unsigned long long>(m.hit_tokens()),
        static_cast<unsigned long long>(m.miss_tokens()),
        static_cast<unsigned long long>(m.appended_blocks()),
        static_cast<unsigned long long>(m.deduplicated_blocks()),
        static_cast<unsigned long long>(m.evicted_blocks()));
  }
}

}  // namespace kvcache::bench
