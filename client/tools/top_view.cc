#include "top_view.h"

#include <algorithm>
#include <map>
#include <nlohmann/json.hpp>
#include <sstream>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/strip.h"
#include "table.h"

namespace kvcache::ctl {
namespace {

// A counter's increase from `before` to `after`; a counter that went down
// (the daemon restarted) counts from zero.
uint64_t Increase(uint64_t before, uint64_t after) {
  return after >= before ? after - before : after;
}

// Per-second rates over one interval; every rate is unset without a previous sample.
class Rates {
 public:
  explicit Rates(std::optional<double> seconds) : seconds_(seconds) {}
  std::optional<double> Of(uint64_t before, uint64_t after) const {
    if (!seconds_ || *seconds_ <= 0) return std::nullopt;
    return static_cast<double>(Increase(before, after)) / *seconds_;
  }
  bool known() const { return seconds_.has_value(); }

 private:
  std::optional<double> seconds_;
};

std::optional<double> Ratio(uint64_t part, uint64_t whole) {
  if (whole == 0) return std::nullopt;
  return static_cast<double>(part) / static_cast<double>(whole);
}

std::string ModeName(v1::CompressionMode mode) {
  std::string name(absl::StripPrefix(v1::CompressionMode_Name(mode), "COMPRESSION_MODE_"));
  absl::AsciiStrToLower(&name);
  return name.empty() ? "-" : name;
}

std::string Rate(const std::optional<double>& v) {
  if (!v) return "-";
  if (*v >= 100) return absl::StrFormat("%.0f", *v);
  return absl::StrFormat("%.1f", *v);
}

std::string ByteRate(const std::optional<double>& v) {
  if (!v) return "-";
  return absl::StrCat(HumanBytes(static_cast<uint64_t>(*v)), "/s");
}

std::string Pct(const std::optional<double>& v) {
  if (!v) return "-";
  return absl::StrFormat("%.1f%%", 100 * *v);
}

std::string Latency(const std::optional<double>& us) {
  if (!us) return "-";
  if (*us >= 1e6) return absl::StrFormat("%.2f s", *us / 1e6);
  if (*us >= 1e3) return absl::StrFormat("%.2f ms", *us / 1e3);
  return absl::StrFormat("%.0f us", *us);
}

// [#######.............] of used/capacity, `width` cells inside the brackets.
std::string Bar(uint64_t used, uint64_t capacity, int width = 20) {
  int filled = 0;
  if (capacity > 0) {
    filled =
        static_cast<int>(static_cast<double>(width) * std::min(used, capacity) / capacity + 0.5);
  }
  return absl::StrCat("[", std::string(filled, '#'), std::string(width - filled, '.'), "]");
}

nlohmann::ordered_json Num(const std::optional<double>& v) {
  return v ? nlohmann::ordered_json(*v) : nlohmann::ordered_json(nullptr);
}

}  // namespace

bool IsInboundMethod(const std::string& method) { return absl::StrContains(method, "Append"); }
bool IsOutboundMethod(const std::string& method) {
  return absl::StrContains(method, "Fetch") || absl::StrContains(method, "Place");
}

TopFrame BuildTopFrame(const TopSample* prev, const TopSample& cur) {
  TopFrame f;
  f.time = cur.time;
  if (prev != nullptr) f.interval_s = absl::ToDoubleSeconds(cur.time - prev->time);
  const Rates rates(f.interval_s);
  const v1::GetStatsResponse& now = cur.stats;
  static const v1::GetStatsResponse kEmpty;
  const v1::GetStatsResponse& before = prev != nullptr ? prev->stats : kEmpty;

  // RPC methods, matched by name.
  std::map<std::string, const v1::RpcCounters*> old_rpcs;
  for (const v1::RpcCounters& r : before.rpcs()) old_rpcs[r.method()] = &r;
  f.rpcs_reported = now.rpcs_size() > 0;
  uint64_t calls = 0, errors = 0, in = 0, out = 0;
  for (const v1::RpcCounters& r : now.rpcs()) {
    static const v1::RpcCounters kZero;
    auto it = old_rpcs.find(r.method());
    const v1::RpcCounters& o = it == old_rpcs.end() ? kZero : *it->second;
    RpcRate rate;
    rate.method = r.method();
    rate.calls = r.calls();
    rate.errors = r.errors();
    rate.payload_bytes = r.payload_bytes();
    rate.calls_per_s = rates.Of(o.calls(), r.calls());
    rate.errors_per_s = rates.Of(o.errors(), r.errors());
    rate.payload_bytes_per_s = rates.Of(o.payload_bytes(), r.payload_bytes());
    const uint64_t new_calls = Increase(o.calls(), r.calls());
    if (rates.known() && new_calls > 0) {
      rate.mean_latency_us =
          static_cast<double>(Increase(o.latency_us_sum(), r.latency_us_sum())) / new_calls;
    }
    calls += new_calls;
    errors += Increase(o.errors(), r.errors());
    const uint64_t moved = Increase(o.payload_bytes(), r.payload_bytes());
    if (IsInboundMethod(r.method())) in += moved;
    if (IsOutboundMethod(r.method())) out += moved;
    f.rpcs.push_back(std::move(rate));
  }
  std::stable_sort(f.rpcs.begin(), f.rpcs.end(), [](const RpcRate& a, const RpcRate& b) {
    const double ra = a.calls_per_s.value_or(0), rb = b.calls_per_s.value_or(0);
    if (ra != rb) return ra > rb;
    if (a.calls != b.calls) return a.calls > b.calls;
    return a.method < b.method;
  });
  if (rates.known() && f.rpcs_reported) {
    f.calls_per_s = calls / *f.interval_s;
    f.errors_per_s = errors / *f.interval_s;
    f.bytes_in_per_s = in / *f.interval_s;
    f.bytes_out_per_s = out / *f.interval_s;
  }

  // Models, matched by (namespace, model).
  std::map<std::pair<std::string, std::string>, const v1::ModelStats*> old_models;
  for (const v1::ModelStats& m : before.models()) {
    old_models[{m.namespace_(), m.model_id()}] = &m;
  }
  uint64_t hits = 0, misses = 0;
  for (const v1::ModelStats& m : now.models()) {
    static const v1::ModelStats kZero;
    auto it = old_models.find({m.namespace_(), m.model_id()});
    const v1::ModelStats& o = it == old_models.end() ? kZero : *it->second;
    ModelRate r;
    r.ns = m.namespace_();
    r.model = m.model_id();
    r.mode = ModeName(m.policy().mode());
    r.blocks = m.blocks();
    r.bytes = m.bytes();
    r.hit_tokens = m.hit_tokens();
    r.miss_tokens = m.miss_tokens();
    r.hit_tokens_per_s = rates.Of(o.hit_tokens(), m.hit_tokens());
    r.miss_tokens_per_s = rates.Of(o.miss_tokens(), m.miss_tokens());
    const uint64_t h = Increase(o.hit_tokens(), m.hit_tokens());
    const uint64_t mi = Increase(o.miss_tokens(), m.miss_tokens());
    if (rates.known()) r.hit_ratio = Ratio(h, h + mi);
    hits += h;
    misses += mi;
    r.hit_ratio_total = Ratio(m.hit_tokens(), m.hit_tokens() + m.miss_tokens());
    r.appended_blocks_per_s = rates.Of(o.appended_blocks(), m.appended_blocks());
    r.evicted_blocks_per_s = rates.Of(o.evicted_blocks(), m.evicted_blocks());
    r.compressed_blocks = m.compressed_blocks();
    r.bytes_saved = m.bytes_saved();
    r.int8_tokens = m.int8_tokens();
    r.pruned_tokens = m.pruned_tokens();
    r.int8_entries = m.int8_entries();
    r.int4_entries = m.int4_entries();
    r.pruned_entries = m.pruned_entries();
    f.models.push_back(std::move(r));
  }
  if (rates.known()) f.hit_ratio = Ratio(hits, hits + misses);

  // Tiers, matched by name.
  std::map<std::string, const v1::TierStats*> old_tiers;
  for (const v1::TierStats& t : before.tiers()) old_tiers[t.name()] = &t;
  for (const v1::TierStats& t : now.tiers()) {
    static const v1::TierStats kZero;
    auto it = old_tiers.find(t.name());
    const v1::TierStats& o = it == old_tiers.end() ? kZero : *it->second;
    TierRate r;
    r.name = t.name();
    r.capacity_bytes = t.capacity_bytes();
    r.used_bytes = t.used_bytes();
    r.payload_bytes = t.payload_bytes();
    r.blocks = t.blocks();
    r.demotions_per_s = rates.Of(o.demotions(), t.demotions());
    r.promotions_per_s = rates.Of(o.promotions(), t.promotions());
    r.evictions_per_s = rates.Of(o.evictions(), t.evictions());
    r.clean_drops_per_s = rates.Of(o.clean_drops(), t.clean_drops());
    r.read_bytes_per_s = rates.Of(o.read_bytes(), t.read_bytes());
    r.write_bytes_per_s = rates.Of(o.write_bytes(), t.write_bytes());
    f.tiers.push_back(std::move(r));
  }
  f.capacity_evictions_per_s = rates.Of(before.capacity_evictions(), now.capacity_evictions());
  f.active_leases = now.active_leases();
  return f;
}

std::string RenderTopText(const TopHeader& header, const TopFrame& f) {
  std::ostringstream out;
  const v1::GetServerInfoResponse& info = header.info;
  out << "kvcached " << (info.version().empty() ? "-" : info.version());
  if (!info.git_revision().empty()) out << " (" << info.git_revision() << ")";
  out << " at " << header.target << "  "
      << absl::FormatTime("%H:%M:%S", f.time, absl::LocalTimeZone()) << "  every "
      << absl::FormatDuration(header.interval) << "  leases " << f.active_leases;
  if (header.interactive) out << "  (q: quit)";
  out << '\n';
  if (!f.interval_s) {
    out << "first sample: totals only; rates from the next frame on\n";
  } else {
    out << absl::StrFormat("rates over the last %.2fs\n", *f.interval_s);
  }

  out << "\nRPCs  " << Rate(f.calls_per_s) << " calls/s, " << Rate(f.errors_per_s) << " errors/s\n";
  if (!f.rpcs_reported) {
    out << "-  (this kvcached reports no per-method counters)\n";
  } else {
    Table t({{"METHOD"},
             {"CALLS/S", true},
             {"ERRORS/S", true},
             {"MEAN_LAT", true},
             {"KV/S", true},
             {"CALLS", true},
             {"ERRORS", true}});
    for (const RpcRate& r : f.rpcs) {
      t.AddRow({r.method, Rate(r.calls_per_s), Rate(r.errors_per_s), Latency(r.mean_latency_us),
                r.payload_bytes > 0 ? ByteRate(r.payload_bytes_per_s) : "", absl::StrCat(r.calls),
                absl::StrCat(r.errors)});
    }
    t.Print(out);
  }

  out << "\nHit ratio  " << Pct(f.hit_ratio) << " of lookup tokens over the interval\n";
  if (f.models.empty()) {
    out << "(no models registered)\n";
  } else {
    Table t({{"NAMESPACE"},
             {"MODEL"},
             {"HIT%", true},
             {"HIT_TOK/S", true},
             {"MISS_TOK/S", true},
             {"HIT%_TOTAL", true},
             {"APPENDED/S", true},
             {"EVICTED/S", true},
             {"BLOCKS", true},
             {"BYTES", true}});
    for (const ModelRate& m : f.models) {
      t.AddRow({m.ns, m.model, Pct(m.hit_ratio), Rate(m.hit_tokens_per_s),
                Rate(m.miss_tokens_per_s), Pct(m.hit_ratio_total), Rate(m.appended_blocks_per_s),
                Rate(m.evicted_blocks_per_s), absl::StrCat(m.blocks), HumanBytes(m.bytes)});
    }
    t.Print(out);
  }

  out << "\nBytes  in " << ByteRate(f.bytes_in_per_s) << " (Append)  out "
      << ByteRate(f.bytes_out_per_s) << " (Fetch)\n";

  out << "\nTiers\n";
  Table tiers({{"TIER"},
               {"USED", true},
               {"CAPACITY", true},
               {"USED%", true},
               {""},
               {"PAYLOAD", true},
               {"BLOCKS", true}});
  for (const TierRate& t : f.tiers) {
    tiers.AddRow({t.name, HumanBytes(t.used_bytes), HumanBytes(t.capacity_bytes),
                  Percent(t.used_bytes, t.capacity_bytes), Bar(t.used_bytes, t.capacity_bytes),
                  HumanBytes(t.payload_bytes), absl::StrCat(t.blocks)});
  }
  tiers.Print(out);

  out << "\nMigrations  capacity evictions " << Rate(f.capacity_evictions_per_s) << "/s\n";
  Table moves({{"TIER"},
               {"DEMOTED/S", true},
               {"PROMOTED/S", true},
               {"EVICTED/S", true},
               {"CLEAN_DROPS/S", true},
               {"WRITE", true},
               {"READ", true}});
  bool any_moves = false;
  for (const TierRate& t : f.tiers) {
    if (t.name == "host") continue;  // moves are counted on the ssd and gpu entries
    any_moves = true;
    moves.AddRow({t.name, Rate(t.demotions_per_s), Rate(t.promotions_per_s),
                  Rate(t.evictions_per_s), Rate(t.clean_drops_per_s), ByteRate(t.write_bytes_per_s),
                  ByteRate(t.read_bytes_per_s)});
  }
  if (any_moves) {
    moves.Print(out);
  } else {
    out << "(host memory only: no tier to move blocks to)\n";
  }

  out << "\nCompression\n";
  if (f.models.empty()) {
    out << "(no models registered)\n";
  } else {
    Table t({{"NAMESPACE"},
             {"MODEL"},
             {"MODE"},
             {"COMPRESSED", true},
             {"SAVED", true},
             {"INT8_TOKENS", true},
             {"PRUNED_TOKENS", true},
             {"INT8_ENTRIES", true},
             {"INT4_ENTRIES", true},
             {"PRUNED_ENTRIES", true}});
    for (const ModelRate& m : f.models) {
      t.AddRow({m.ns, m.model, m.mode, absl::StrCat(m.compressed_blocks), HumanBytes(m.bytes_saved),
                absl::StrCat(m.int8_tokens), absl::StrCat(m.pruned_tokens),
                absl::StrCat(m.int8_entries), absl::StrCat(m.int4_entries),
                absl::StrCat(m.pruned_entries)});
    }
    t.Print(out);
  }
  return out.str();
}

std::string RenderTopJson(const TopHeader& header, const TopFrame& f) {
  using Json = nlohmann::ordered_json;
  Json j;
  j["time_unix_ms"] = absl::ToUnixMillis(f.time);
  j["target"] = header.target;
  j["version"] = header.info.version();
  j["interval_seconds"] = Num(f.interval_s);
  j["rpcs_reported"] = f.rpcs_reported;
  j["calls_per_second"] = Num(f.calls_per_s);
  j["errors_per_second"] = Num(f.errors_per_s);
  j["bytes_in_per_second"] = Num(f.bytes_in_per_s);
  j["bytes_out_per_second"] = Num(f.bytes_out_per_s);
  j["hit_ratio"] = Num(f.hit_ratio);
  j["active_leases"] = f.active_leases;
  j["capacity_evictions_per_second"] = Num(f.capacity_evictions_per_s);
  Json rpcs = Json::array();
  for (const RpcRate& r : f.rpcs) {
    rpcs.push_back({{"method", r.method},
                    {"calls", r.calls},
                    {"errors", r.errors},
                    {"payload_bytes", r.payload_bytes},
                    {"calls_per_second", Num(r.calls_per_s)},
                    {"errors_per_second", Num(r.errors_per_s)},
                    {"payload_bytes_per_second", Num(r.payload_bytes_per_s)},
                    {"mean_latency_us", Num(r.mean_latency_us)}});
  }
  j["rpcs"] = std::move(rpcs);
  Json models = Json::array();
  for (const ModelRate& m : f.models) {
    models.push_back({{"namespace", m.ns},
                      {"model", m.model},
                      {"mode", m.mode},
                      {"blocks", m.blocks},
                      {"bytes", m.bytes},
                      {"hit_tokens", m.hit_tokens},
                      {"miss_tokens", m.miss_tokens},
                      {"hit_tokens_per_second", Num(m.hit_tokens_per_s)},
                      {"miss_tokens_per_second", Num(m.miss_tokens_per_s)},
                      {"hit_ratio", Num(m.hit_ratio)},
                      {"hit_ratio_total", Num(m.hit_ratio_total)},
                      {"appended_blocks_per_second", Num(m.appended_blocks_per_s)},
                      {"evicted_blocks_per_second", Num(m.evicted_blocks_per_s)},
                      {"compressed_blocks", m.compressed_blocks},
                      {"bytes_saved", m.bytes_saved},
                      {"int8_tokens", m.int8_tokens},
                      {"pruned_tokens", m.pruned_tokens},
                      {"int8_entries", m.int8_entries},
                      {"int4_entries", m.int4_entries},
                      {"pruned_entries", m.pruned_entries}});
  }
  j["models"] = std::move(models);
  Json tiers = Json::array();
  for (const TierRate& t : f.tiers) {
    tiers.push_back({{"name", t.name},
                     {"capacity_bytes", t.capacity_bytes},
                     {"used_bytes", t.used_bytes},
                     {"payload_bytes", t.payload_bytes},
                     {"blocks", t.blocks},
                     {"used_ratio", Num(Ratio(t.used_bytes, t.capacity_bytes))},
                     {"demotions_per_second", Num(t.demotions_per_s)},
                     {"promotions_per_second", Num(t.promotions_per_s)},
                     {"evictions_per_second", Num(t.evictions_per_s)},
                     {"clean_drops_per_second", Num(t.clean_drops_per_s)},
                     {"write_bytes_per_second", Num(t.write_bytes_per_s)},
                     {"read_bytes_per_second", Num(t.read_bytes_per_s)}});
  }
  j["tiers"] = std::move(tiers);
  return j.dump();
}

}  // namespace kvcache::ctl
