// Mooncake-format JSONL traces (../shared/traces/*.jsonl beside the
// repository; SOURCES.md there): one request per line,
//   {"timestamp": ms, "input_length": tokens, "output_length": tokens,
//    "hash_ids": [...]}
// where hash_ids are prefix hashes of 512-token blocks, ceil(input_length /
// 512) of them. Read by kvcache-bench trace (against a daemon) and
// kvcache-policy-sim (offline, against the eviction policies).
#ifndef KVCACHE_TESTS_BENCH_TRACE_FILE_H_
#define KVCACHE_TESTS_BENCH_TRACE_FILE_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace kvcache::bench {

inline constexpr uint32_t kTraceBlockTokens = 512;

struct TraceRequest {
  uint64_t timestamp_ms = 0;  // 0 when the line has none
  uint64_t input_length = 0;
  std::vector<uint64_t> hash_ids;
};

// One line. INVALID_ARGUMENT naming what is missing or malformed.
absl::StatusOr<TraceRequest> ParseTraceLine(const std::string& line);

// The first `limit` requests of the file (0: all), skipping blank lines.
// NOT_FOUND when it cannot be opened; INVALID_ARGUMENT with file:line.
absl::StatusOr<std::vector<TraceRequest>> LoadTrace(const std::string& path, uint64_t limit);

}  // namespace kvcache::bench

#endif  // KVCACHE_TESTS_BENCH_TRACE_FILE_H_
