#include "server/metrics/metrics.h"

#include <prometheus/collectable.h>
#include <prometheus/counter.h>
#include <prometheus/exposer.h>
#include <prometheus/histogram.h>
#include <prometheus/registry.h>
#include <prometheus/text_serializer.h>

#include <exception>
#include <limits>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"

namespace kvcache {
namespace {

using prometheus::ClientMetric;
using prometheus::MetricFamily;
using prometheus::MetricType;

std::string CodeName(absl::StatusCode code) {
  std::string name = absl::StatusCodeToString(code);
  return name.empty() ? absl::StrCat(static_cast<int>(code)) : name;
}

MetricFamily Family(std::string name, std::string help, MetricType type) {
  return MetricFamily{.name = std::move(name), .help = std::move(help), .type = type, .metric = {}};
}

// part / whole, 0 when whole is 0.
double Ratio(uint64_t part, uint64_t whole) {
  return whole == 0 ? 0.0 : static_cast<double>(part) / static_cast<double>(whole);
}

void AddSample(MetricFamily& family, std::vector<ClientMetric::Label> labels, double value) {
  ClientMetric m;
  m.label = std::move(labels);
  if (family.type == MetricType::Counter) {
    m.counter.value = value;
  } else {
    m.gauge.value = value;
  }
  family.metric.push_back(std::move(m));
}

// The checkpoint families (docs/checkpoints.md), when checkpoints are on.
std::vector<MetricFamily> CheckpointFamilies(const CheckpointCounters& c) {
  std::vector<MetricFamily> out;
  if (!c.enabled) return out;
  auto runs = Family("kvcached_checkpoints_total", "Checkpoint runs, by outcome (ok, failed)",
                     MetricType::Counter);
  AddSample(runs, {{"outcome", "ok"}}, static_cast<double>(c.ok));
  AddSample(runs, {{"outcome", "failed"}}, static_cast<double>(c.failed));
  out.push_back(std::move(runs));
  // The exposure: what a crash now would lose was cached since then.
  auto age = Family("kvcached_checkpoint_age_seconds",
                    "Seconds since the last checkpoint committed (or since start, before one)",
                    MetricType::Gauge);
  const double since =
      c.last_success_unix_seconds > 0 ? c.last_success_unix_seconds : c.started_unix_seconds;
  AddSample(age, {}, absl::ToDoubleSeconds(absl::Now() - absl::UnixEpoch()) - since);
  out.push_back(std::move(age));
  if (c.last_success_unix_seconds > 0) {
    auto last = Family("kvcached_checkpoint_last_success_timestamp_seconds",
                       "When the last checkpoint was committed (Unix time)", MetricType::Gauge);
    AddSample(last, {}, c.last_success_unix_seconds);
    auto duration = Family("kvcached_checkpoint_duration_seconds",
                           "How long the last checkpoint took to write", MetricType::Gauge);
    AddSample(duration, {}, c.last_duration_seconds);
    auto bytes = Family("kvcached_checkpoint_bytes", "Size of the last checkpoint's data file",
                        MetricType::Gauge);
    AddSample(bytes, {}, static_cast<double>(c.last_bytes));
    for (auto* f : {&last, &duration, &bytes}) out.push_back(std::move(*f));
  }
  auto running = Family("kvcached_checkpoint_in_progress", "1 while a checkpoint is being written",
                        MetricType::Gauge);
  AddSample(running, {}, c.in_progress ? 1 : 0);
  auto restore = Family("kvcached_checkpoint_restore_state",
                        "The restore at start-up: 1 for its current state", MetricType::Gauge);
  for (const char* state : {"off", "reattaching", "restoring", "done", "failed", "stopped"}) {
    AddSample(restore, {{"state", state}}, c.restore_state == state ? 1 : 0);
  }
  auto restored = Family("kvcached_checkpoint_restore_blocks_total",
                         "Blocks the restore at start-up put back or skipped", MetricType::Counter);
  AddSample(restored, {{"outcome", "restored"}}, static_cast<double>(c.restored_blocks));
  AddSample(restored, {{"outcome", "skipped"}}, static_cast<double>(c.restore_skipped_blocks));
  auto unreadable =
      Family("kvcached_checkpoint_restore_failures_total",
             "Checkpoints found corrupt or unreadable when restoring", MetricType::Counter);
  AddSample(unreadable, {}, static_cast<double>(c.restore_failed_checkpoints));
  auto reattached =
      Family("kvcached_checkpoint_reattached_copies_total",
             "Lower-tier (SSD) copies re-attached at start-up, by outcome", MetricType::Counter);
  AddSample(reattached, {{"outcome", "ok"}}, static_cast<double>(c.reattached_copies));
  AddSample(reattached, {{"outcome", "failed"}}, static_cast<double>(c.reattach_failures));
  for (auto* f : {&running, &restore, &restored, &unreadable, &reattached}) {
    out.push_back(std::move(*f));
  }
  return out;
}

// The importance-aware retention families of a snapshot.
std::vector<MetricFamily> ImportanceFamilies(const CacheStats& s) {
  auto tokens =
      Family("kvcached_model_tokens", "Cached tokens per model by precision (full, int8, pruned)",
             MetricType::Gauge);
  auto compressed = Family("kvcached_model_compressed_blocks",
                           "Blocks stored in the compressed format, per model", MetricType::Gauge);
  auto saved =
      Family("kvcached_model_bytes_saved",
             "Raw block bytes minus what compressed blocks take, per model", MetricType::Gauge);
  auto reports =
      Family("kvcached_attention_reports_total",
             "Attention reports folded into token activity, per model", MetricType::Counter);
  auto calibrations =
      Family("kvcached_calibrations_total", "Refits of the importance weights applied, per model",
             MetricType::Counter);
  auto weights = Family("kvcached_importance_weight",
                        "Importance score weights in effect (alpha, beta, gamma), per model",
                        MetricType::Gauge);
  auto mode =
      Family("kvcached_compression_mode",
             "1 for the compression mode a model is in (off, quantize, prune)", MetricType::Gauge);
  for (const ModelStats& m : s.models) {
    const std::string& ns = m.model.ns;
    const std::string& id = m.model.model_id;
    for (auto [precision, value] : {std::pair<const char*, uint64_t>{"full", m.full_tokens},
                                    {"int8", m.int8_tokens},
                                    {"pruned", m.pruned_tokens}}) {
      AddSample(tokens, {{"namespace", ns}, {"model", id}, {"precision", precision}},
                static_cast<double>(value));
    }
    AddSample(compressed, {{"namespace", ns}, {"model", id}},
              static_cast<double>(m.compressed_blocks));
    AddSample(saved, {{"namespace", ns}, {"model", id}}, static_cast<double>(m.bytes_saved));
    AddSample(reports, {{"namespace", ns}, {"model", id}},
              static_cast<double>(m.attention_reports));
    AddSample(calibrations, {{"namespace", ns}, {"model", id}},
              static_cast<double>(m.calibrations));
    for (auto [name, value] : {std::pair<const char*, float>{"alpha", m.policy.params.alpha},
                               {"beta", m.policy.params.beta},
                               {"gamma", m.policy.params.gamma}}) {
      AddSample(weights, {{"namespace", ns}, {"model", id}, {"weight", name}}, value);
    }
    for (const char* name : {"off", "quantize", "prune"}) {
      AddSample(mode, {{"namespace", ns}, {"model", id}, {"mode", name}},
                CompressionModeName(m.policy.mode) == name ? 1.0 : 0.0);
    }
  }
  auto passes =
      Family("kvcached_compaction_passes_total", "Compaction passes run", MetricType::Counter);
  AddSample(passes, {}, static_cast<double>(s.compaction_passes));

  // The scores compaction computed, as a histogram with buckets 0.1 .. 1.0.
  auto scores =
      Family("kvcached_importance_score", "Importance scores of the tokens compaction decided on",
             MetricType::Histogram);
  ClientMetric h;
  uint64_t cumulative = 0;
  for (int b = 0; b < ScoreHistogram::kBuckets; ++b) {
    cumulative += s.scores.counts[b];
    ClientMetric::Bucket bucket;
    bucket.cumulative_count = cumulative;
    bucket.upper_bound =
        b + 1 < ScoreHistogram::kBuckets ? (b + 1) / 10.0 : std::numeric_limits<double>::infinity();
    h.histogram.bucket.push_back(bucket);
  }
  h.histogram.sample_count = s.scores.total;
  h.histogram.sample_sum = s.scores.sum;
  scores.metric.push_back(std::move(h));
  return {tokens, compressed, saved, reports, calibrations, weights, mode, passes, scores};
}

// Reads a CacheStats snapshot at scrape time.
class CacheCollector final : public prometheus::Collectable {
 public:
  explicit CacheCollector(Metrics::StatsSource source) : source_(std::move(source)) {}

  std::vector<MetricFamily> Collect() const override {
    const CacheStats s = source_();
    auto blocks = Family("kvcached_model_blocks", "Blocks cached per model", MetricType::Gauge);
    auto bytes =
        Family("kvcached_model_bytes", "Payload bytes cached per model", MetricType::Gauge);
    auto hits = Family("kvcached_lookup_hit_tokens_total", "Tokens Lookup found cached, per model",
                       MetricType::Counter);
    auto misses = Family("kvcached_lookup_miss_tokens_total",
                         "Whole-block tokens Lookup did not find, per model", MetricType::Counter);
    auto appended = Family("kvcached_appended_blocks_total", "Blocks stored by Append, per model",
                           MetricType::Counter);
    auto dedup = Family("kvcached_deduplicated_blocks_total",
                        "Appended blocks that were already cached, per model", MetricType::Counter);
    auto evicted =
        Family("kvcached_model_evicted_blocks_total",
               "Blocks removed (capacity, explicit or expiry), per model", MetricType::Counter);
    auto conflicting =
        Family("kvcached_conflicting_blocks_total",
               "Appended blocks whose bytes differed from the cached copy, per model",
               MetricType::Counter);
    auto restored =
        Family("kvcached_restored_blocks_total",
               "Lossy blocks made exact again by an append, per model", MetricType::Counter);
    auto corrupt = Family("kvcached_corrupt_blocks_total",
                          "Blocks found not matching their checksum and dropped, per model",
                          MetricType::Counter);
    for (const ModelStats& m : s.models) {
      std::vector<ClientMetric::Label> l = {{"namespace", m.model.ns}, {"model", m.model.model_id}};
      AddSample(conflicting, l, static_cast<double>(m.conflicting_blocks));
      AddSample(restored, l, static_cast<double>(m.restored_blocks));
      AddSample(corrupt, l, static_cast<double>(m.corrupt_blocks));
      AddSample(blocks, l, static_cast<double>(m.blocks));
      AddSample(bytes, l, static_cast<double>(m.bytes));
      AddSample(hits, l, static_cast<double>(m.hit_tokens));
      AddSample(misses, l, static_cast<double>(m.miss_tokens));
      AddSample(appended, l, static_cast<double>(m.appended_blocks));
      AddSample(dedup, l, static_cast<double>(m.deduplicated_blocks));
      AddSample(evicted, l, static_cast<double>(m.evicted_blocks));
    }
    const std::vector<ClientMetric::Label> host = {{"tier", "host"}};
    auto capacity = Family("kvcached_tier_capacity_bytes", "Capacity of a tier", MetricType::Gauge);
    AddSample(capacity, host, static_cast<double>(s.host_pool.capacity_bytes));
    auto used =
        Family("kvcached_tier_used_bytes",
               "Bytes of a tier reserved by slabs (host) or extents (ssd)", MetricType::Gauge);
    AddSample(used, host, static_cast<double>(s.host_pool.reserved_bytes));
    auto payload = Family("kvcached_tier_payload_bytes", "Bytes of cached block payloads in a tier",
                          MetricType::Gauge);
    AddSample(payload, host, static_cast<double>(s.payload_bytes));
    auto tier_blocks = Family("kvcached_tier_blocks", "Blocks cached in a tier", MetricType::Gauge);
    AddSample(tier_blocks, host, static_cast<double>(s.blocks - s.tiers.lower_only_blocks));
    auto utilization =
        Family("kvcached_tier_utilization_ratio",
               "Live payload bytes over the bytes a tier has reserved", MetricType::Gauge);
    AddSample(utilization, host, Ratio(s.payload_bytes, s.host_pool.reserved_bytes));
    const PoolCompactionCounters& pc = s.pool_compaction;
    auto pool_passes = Family("kvcached_pool_compaction_passes_total",
                              "Host pool compaction passes run", MetricType::Counter);
    AddSample(pool_passes, {}, static_cast<double>(pc.passes));
    auto pool_moves =
        Family("kvcached_pool_compaction_moves_total",
               "Blocks host pool compaction moved to a fuller span", MetricType::Counter);
    AddSample(pool_moves, {}, static_cast<double>(pc.moved_blocks));
    auto pool_moved_bytes =
        Family("kvcached_pool_compaction_moved_bytes_total",
               "Payload bytes host pool compaction copied and swapped in", MetricType::Counter);
    AddSample(pool_moved_bytes, {}, static_cast<double>(pc.moved_bytes));
    auto pool_skipped = Family("kvcached_pool_compaction_skipped_total",
                               "Blocks host pool compaction copied but did not swap in, by reason",
                               MetricType::Counter);
    AddSample(pool_skipped, {{"reason", "changed"}}, static_cast<double>(pc.changed_blocks));
    AddSample(pool_skipped, {{"reason", "checksum_mismatch"}},
              static_cast<double>(pc.mismatched_blocks));
    auto drained =
        Family("kvcached_pool_drained_spans_total",
               "Host pool spans released after compaction drained them", MetricType::Counter);
    AddSample(drained, {}, static_cast<double>(s.host_pool.drained_spans));
    std::vector<MetricFamily> out;
    if (s.has_lower) {
      const std::vector<ClientMetric::Label> ssd = {{"tier", s.lower_store.kind}};
      const TierCounters& t = s.tiers;
      AddSample(capacity, ssd, static_cast<double>(s.lower_store.capacity_bytes));
      AddSample(used, ssd, static_cast<double>(s.lower_store.allocated_bytes));
      AddSample(payload, ssd, static_cast<double>(t.lower_payload_bytes));
      AddSample(tier_blocks, ssd, static_cast<double>(t.lower_blocks));
      AddSample(utilization, ssd, Ratio(t.lower_payload_bytes, s.lower_store.allocated_bytes));
      auto moves =
          Family("kvcached_tier_migrations_total",
                 "Blocks moved between tiers, by direction and reason", MetricType::Counter);
      const std::string lower = s.lower_store.kind;
      AddSample(moves, {{"from", "host"}, {"to", lower}, {"reason", "demote"}},
                static_cast<double>(t.demotions));
      AddSample(moves, {{"from", "host"}, {"to", lower}, {"reason", "clean_drop"}},
                static_cast<double>(t.clean_drops));
      AddSample(moves, {{"from", lower}, {"to", "host"}, {"reason", "promote"}},
                static_cast<double>(t.promotions));
      auto moved_bytes = Family("kvcached_tier_migrated_bytes_total",
                                "Bytes moved between tiers, by direction", MetricType::Counter);
      AddSample(moved_bytes, {{"from", "host"}, {"to", lower}},
                static_cast<double>(t.demoted_bytes));
      AddSample(moved_bytes, {{"from", lower}, {"to", "host"}},
                static_cast<double>(t.promoted_bytes));
      auto tier_evictions = Family("kvcached_tier_evictions_total",
                                   "Blocks evicted from a tier, by reason", MetricType::Counter);
      AddSample(tier_evictions, {{"tier", lower}, {"reason", "capacity"}},
                static_cast<double>(t.lower_evictions));
      AddSample(tier_evictions, {{"tier", "host"}, {"reason", "not_admitted"}},
                static_cast<double>(t.not_admitted_evictions));
      auto refused =
          Family("kvcached_tier_admissions_refused_total",
                 "Demotions the admission gate or the write budget refused", MetricType::Counter);
      AddSample(refused, ssd, static_cast<double>(t.admissions_refused));
      auto reads = Family("kvcached_tier_reads_total", "Blocks read back from a tier for fetches",
                          MetricType::Counter);
      AddSample(reads, ssd, static_cast<double>(t.lower_reads));
      auto read_bytes = Family("kvcached_tier_read_bytes_total",
                               "Bytes read back from a tier for fetches", MetricType::Counter);
      AddSample(read_bytes, ssd, static_cast<double>(t.lower_read_bytes));
      auto failures = Family("kvcached_tier_checksum_failures_total",
                             "Copies that failed verification when read: dropped, never served",
                             MetricType::Counter);
      AddSample(failures, ssd, static_cast<double>(t.checksum_failures));
      auto write_failures = Family("kvcached_tier_write_failures_total",
                                   "Writes a tier refused (full after evicting, or an I/O error)",
                                   MetricType::Counter);
      AddSample(write_failures, ssd, static_cast<double>(t.lower_write_failures));
      auto prefetches =
          Family("kvcached_tier_prefetches_total",
                 "Lookup prefetches of a tier's blocks, by outcome", MetricType::Counter);
      AddSample(prefetches, {{"tier", lower}, {"outcome", "issued"}},
                static_cast<double>(s.prefetch.issued));
      AddSample(prefetches, {{"tier", lower}, {"outcome", "completed"}},
                static_cast<double>(s.prefetch.completed));
      AddSample(prefetches, {{"tier", lower}, {"outcome", "dropped"}},
                static_cast<double>(s.prefetch.dropped));
      AddSample(prefetches, {{"tier", lower}, {"outcome", "late"}},
                static_cast<double>(s.prefetch.late));
      for (auto* f : {&moves, &moved_bytes, &tier_evictions, &refused, &reads, &read_bytes,
                      &failures, &write_failures, &prefetches}) {
        out.push_back(std::move(*f));
      }
    }
    if (s.has_device) {
      const std::vector<ClientMetric::Label> gpu = {{"tier", "gpu"}};
      const TierCounters& t = s.tiers;
      AddSample(capacity, gpu, static_cast<double>(s.device_store.capacity_bytes));
      AddSample(used, gpu, static_cast<double>(s.device_store.allocated_bytes));
      AddSample(payload, gpu, static_cast<double>(t.device_payload_bytes));
      AddSample(tier_blocks, gpu, static_cast<double>(t.device_blocks));
      AddSample(utilization, gpu,
                Ratio(s.device_store.payload_bytes, s.device_store.allocated_bytes));
      auto placed = Family("kvcached_gpu_placements_total",
                           "Blocks copied into the GPU tier for same-host workers (PlaceOnDevice)",
                           MetricType::Counter);
      AddSample(placed, {}, static_cast<double>(t.device_placements));
      auto placed_bytes = Family("kvcached_gpu_placed_bytes_total",
                                 "Bytes copied into the GPU tier", MetricType::Counter);
      AddSample(placed_bytes, {}, static_cast<double>(t.device_placed_bytes));
      auto found = Family("kvcached_gpu_placement_hits_total",
                          "Blocks a placement found in the GPU tier already", MetricType::Counter);
      AddSample(found, {}, static_cast<double>(t.device_hits));
      auto drops = Family("kvcached_gpu_drops_total",
                          "GPU tier copies dropped, by reason (clean: the block stays in host "
                          "memory or on SSD)",
                          MetricType::Counter);
      AddSample(drops, {{"reason", "room"}}, static_cast<double>(t.device_drops_room));
      AddSample(drops, {{"reason", "pressure"}}, static_cast<double>(t.device_drops_pressure));
      AddSample(drops, {{"reason", "invalidated"}},
                static_cast<double>(t.device_drops_invalidated));
      auto failed =
          Family("kvcached_gpu_write_failures_total",
                 "Copies into the GPU tier that failed (other than for room)", MetricType::Counter);
      AddSample(failed, {}, static_cast<double>(t.device_write_failures));
      for (auto* f : {&placed, &placed_bytes, &found, &drops, &failed}) {
        out.push_back(std::move(*f));
      }
    }
    auto evictions = Family("kvcached_capacity_evictions_total",
                            "Blocks evicted to make room for new ones", MetricType::Counter);
    AddSample(evictions, {}, static_cast<double>(s.capacity_evictions));
    auto rejected = Family("kvcached_rejected_appends_total",
                           "Appends refused because nothing could be evicted", MetricType::Counter);
    AddSample(rejected, {}, static_cast<double>(s.rejected_appends));
    auto leases =
        Family("kvcached_active_leases", "Leases currently pinning blocks", MetricType::Gauge);
    AddSample(leases, {}, static_cast<double>(s.active_leases));
    auto budget =
        Family("kvcached_metadata_evictions_total",
               "Blocks evicted to keep index metadata within its budget", MetricType::Counter);
    AddSample(budget, {}, static_cast<double>(s.metadata_evictions));
    auto metadata =
        Family("kvcached_metadata_bytes", "Index metadata and lease token copies held in memory",
               MetricType::Gauge);
    AddSample(metadata, {}, static_cast<double>(s.metadata_bytes));
    auto staged = Family("kvcached_append_staged_bytes", "Pool memory held by appends in flight",
                         MetricType::Gauge);
    AddSample(staged, {}, static_cast<double>(s.staged_bytes));
    auto lease_tokens =
        Family("kvcached_lease_tokens", "Tokens held by live leases", MetricType::Gauge);
    AddSample(lease_tokens, {}, static_cast<double>(s.lease_tokens));
    for (auto* f : {&blocks,    &bytes,    &appended, &dedup,       &evicted,     &hits,
                    &misses,    &capacity, &used,     &payload,     &tier_blocks, &utilization,
                    &evictions, &rejected, &leases,   &conflicting, &restored,    &corrupt,
                    &budget,    &metadata, &staged,   &lease_tokens}) {
      out.push_back(std::move(*f));
    }
    for (auto* f : {&pool_passes, &pool_moves, &pool_moved_bytes, &pool_skipped, &drained}) {
      out.push_back(std::move(*f));
    }
    for (MetricFamily& f : ImportanceFamilies(s)) out.push_back(std::move(f));
    for (MetricFamily& f : CheckpointFamilies(s.checkpoint)) out.push_back(std::move(f));
    return out;
  }

 private:
  Metrics::StatsSource source_;
};

}  // namespace

struct Metrics::Impl {
  std::shared_ptr<prometheus::Registry> registry = std::make_shared<prometheus::Registry>();
  std::shared_ptr<CacheCollector> collector;
  std::unique_ptr<prometheus::Exposer> exposer;
  prometheus::Family<prometheus::Counter>* rpcs = nullptr;
  prometheus::Family<prometheus::Histogram>* latency = nullptr;
  prometheus::Family<prometheus::Counter>* payload = nullptr;
  prometheus::Family<prometheus::Counter>* timeouts = nullptr;
  prometheus::Family<prometheus::Counter>* limited = nullptr;
};

Metrics::Metrics(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Metrics::~Metrics() = default;

std::unique_ptr<Metrics> Metrics::CreateUnexposed(StatsSource stats) {
  auto impl = std::make_unique<Impl>();
  impl->collector = std::make_shared<CacheCollector>(std::move(stats));
  impl->rpcs = &prometheus::BuildCounter()
                    .Name("kvcached_rpcs_total")
                    .Help("Finished RPCs by method and status code")
                    .Register(*impl->registry);
  impl->latency = &prometheus::BuildHistogram()
                       .Name("kvcached_rpc_latency_seconds")
                       .Help("RPC latency by method, from the first byte to the status")
                       .Register(*impl->registry);
  impl->payload = &prometheus::BuildCounter()
                       .Name("kvcached_rpc_payload_bytes_total")
                       .Help("KV payload bytes moved by Append and Fetch")
                       .Register(*impl->registry);
  impl->timeouts = &prometheus::BuildCounter()
                        .Name("kvcached_stream_timeouts_total")
                        .Help("Streams cancelled after stream_idle_timeout_ms without progress")
                        .Register(*impl->registry);
  impl->limited = &prometheus::BuildCounter()
                       .Name("kvcached_limit_rejections_total")
                       .Help("Calls refused with RESOURCE_EXHAUSTED by a concurrency limit")
                       .Register(*impl->registry);
  return std::unique_ptr<Metrics>(new Metrics(std::move(impl)));
}

absl::StatusOr<std::unique_ptr<Metrics>> Metrics::Start(const std::string& address,
                                                        StatsSource stats) {
  std::unique_ptr<Metrics> metrics = CreateUnexposed(std::move(stats));
  try {
    metrics->impl_->exposer = std::make_unique<prometheus::Exposer>(address);
  } catch (const std::exception& e) {
    return absl::UnavailableError(
        absl::StrCat("metrics exposer cannot listen on ", address, ": ", e.what()));
  }
  metrics->impl_->exposer->RegisterCollectable(metrics->impl_->registry);
  metrics->impl_->exposer->RegisterCollectable(metrics->impl_->collector);
  return metrics;
}

void Metrics::OnRpcDone(std::string_view method, absl::StatusCode code, absl::Duration latency,
                        uint64_t bytes) {
  const std::string m(method);
  impl_->rpcs->Add({{"method", m}, {"code", CodeName(code)}}).Increment();
  static const prometheus::Histogram::BucketBoundaries kBuckets = {
      0.00005, 0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01,
      0.025,   0.05,   0.1,     0.25,   0.5,   1,      2.5,   10};
  impl_->latency->Add({{"method", m}}, kBuckets).Observe(absl::ToDoubleSeconds(latency));
  if (bytes > 0) impl_->payload->Add({{"method", m}}).Increment(static_cast<double>(bytes));
}

void Metrics::OnStreamTimeout(std::string_view method) {
  impl_->timeouts->Add({{"method", std::string(method)}}).Increment();
}

void Metrics::OnLimitReached(std::string_view method, std::string_view limit) {
  impl_->limited->Add({{"method", std::string(method)}, {"limit", std::string(limit)}}).Increment();
}

std::string Metrics::Render() const {
  std::vector<MetricFamily> families = impl_->registry->Collect();
  std::vector<MetricFamily> cache = impl_->collector->Collect();
  families.insert(families.end(), cache.begin(), cache.end());
  return prometheus::TextSerializer().Serialize(families);
}

int Metrics::port() const {
  if (impl_->exposer == nullptr) return 0;
  auto ports = impl_->exposer->GetListeningPorts();
  return ports.empty() ? 0 : ports.front();
}

}  // namespace kvcache
