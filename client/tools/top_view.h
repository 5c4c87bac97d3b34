// The frames of `kvcachectl top`: what two successive GetStats polls of
// kvcached say about the interval between them, as text or as one JSON line.
//
// A frame holds the daemon's totals at the second poll and, when there was a
// first, the rates over the interval: calls and errors per second and mean
// latency per RPC method (GetStatsResponse.rpcs), token hit ratio per model,
// KV bytes in (Append-like methods) and out (Fetch-like methods) per second,
// tier usage, moves between tiers per second, and compression per model.
// Rates are never negative: a counter that went down (the daemon restarted)
// counts from zero, as Prometheus's rate() does. A counter absent from the
// first poll counts from zero too. Pure functions of their inputs, no I/O.
#ifndef KVCACHE_CLIENT_TOOLS_TOP_VIEW_H_
#define KVCACHE_CLIENT_TOOLS_TOP_VIEW_H_

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/time/time.h"
#include "kvcache/v1/admin.pb.h"

namespace kvcache::ctl {

// One GetStats answer and when it arrived.
struct TopSample {
  absl::Time time;
  v1::GetStatsResponse stats;
};

// Rates are unset in the first frame (no interval yet), and a ratio or mean
// is unset when its denominator was 0 over the interval.
struct RpcRate {
  std::string method;
  uint64_t calls = 0;  // totals since the daemon started
  uint64_t errors = 0;
  uint64_t payload_bytes = 0;
  std::optional<double> calls_per_s, errors_per_s, payload_bytes_per_s, mean_latency_us;
};

struct ModelRate {
  std::string ns, model, mode;
  uint64_t blocks = 0, bytes = 0, hit_tokens = 0, miss_tokens = 0;
  std::optional<double> hit_tokens_per_s, miss_tokens_per_s;
  std::optional<double> hit_ratio;        // over the interval
  std::optional<double> hit_ratio_total;  // since the daemon started
  std::optional<double> appended_blocks_per_s, evicted_blocks_per_s;
  // Compression (docs/importance.md).
  uint64_t compressed_blocks = 0, bytes_saved = 0;
  uint64_t int8_tokens = 0, pruned_tokens = 0;
  uint64_t int8_entries = 0, int4_entries = 0, pruned_entries = 0;
};

struct TierRate {
  std::string name;
  uint64_t capacity_bytes = 0, used_bytes = 0, payload_bytes = 0, blocks = 0;
  std::optional<double> demotions_per_s, promotions_per_s, evictions_per_s, clean_drops_per_s;
  std::optional<double> read_bytes_per_s, write_bytes_per_s;
};

struct TopFrame {
  absl::Time time;
  std::optional<double> interval_s;  // unset in the first frame
  // Whether the daemon reports per-method counters (GetStatsResponse.rpcs);
  // daemons before that field report none and the RPC rows show "-".
  bool rpcs_reported = false;
  std::vector<RpcRate> rpcs;                        // busiest first (by calls/s, then calls)
  std::optional<double> calls_per_s, errors_per_s;  // all methods
  std::optional<double> bytes_in_per_s, bytes_out_per_s;
  std::optional<double> hit_ratio;  // all models, over the interval
  std::vector<ModelRate> models;
  std::vector<TierRate> tiers;
  std::optional<double> capacity_evictions_per_s;
  uint64_t active_leases = 0;
};

// KV moves in with Append-like methods ("Append", "ShmAppendFrom") and out
// with Fetch-like ones ("Fetch", "FetchLease", "ShmFetchInto", ...).
bool IsInboundMethod(const std::string& method);
bool IsOutboundMethod(const std::string& method);

// The frame for `cur`, with rates since `prev` when given.
// REQUIRES: prev == nullptr or prev->time < cur.time.
TopFrame BuildTopFrame(const TopSample* prev, const TopSample& cur);

// What the header line says about the daemon.
struct TopHeader {
  std::string target;
  v1::GetServerInfoResponse info;
  absl::Duration interval;
  bool interactive = false;  // says how to quit
};

// The frame as text: a header line, then sections "RPCs", "Hit ratio",
// "Bytes", "Tiers", "Migrations" and "Compression"; lines end in '\n'.
std::string RenderTopText(const TopHeader& header, const TopFrame& frame);
// The frame as one JSON object on one line (no newline): counters and rates
// as numbers, rates null in the first frame.
std::string RenderTopJson(const TopHeader& header, const TopFrame& frame);

}  // namespace kvcache::ctl

#endif  // KVCACHE_CLIENT_TOOLS_TOP_VIEW_H_
