// How each group of CacheStats reports its counters (cache_stats.h): one
// Visit per exposed field, in the order of the fields. Families visited from
// more than one place are constants here; the others are written at their
// one Visit. docs/metrics.md lists them all (metrics_test checks it).
#include "server/core/cache_stats.h"

#include <array>
#include <span>
#include <string>

namespace kvcache {
namespace {

// part / whole, 0 when whole is 0.
double Ratio(uint64_t part, uint64_t whole) {
  return whole == 0 ? 0.0 : static_cast<double>(part) / static_cast<double>(whole);
}

// Passes every sample on as a Declare: visiting a default group through it
// lists the families the group reports.
class DeclaringVisitor final : public CounterVisitor {
 public:
  explicit DeclaringVisitor(CounterVisitor& target) : target_(target) {}

 private:
  void OnSample(const CounterFamily& family, std::span<const CounterLabel>, double) override {
    target_.Declare(family);
  }
  void OnDeclare(const CounterFamily& family) override { target_.Declare(family); }

  CounterVisitor& target_;
};

// The size of one tier (host, ssd, gpu), labelled tier.
struct TierSize {
  std::string_view tier;
  uint64_t capacity_bytes = 0;
  uint64_t used_bytes = 0;  // reserved by slabs (host) or extents
  uint64_t payload_bytes = 0;
  uint64_t blocks = 0;
  double utilization = 0;

  void VisitCounters(CounterVisitor& visitor) const {
    const std::array<CounterLabel, 1> l = {{{"tier", tier}}};
    visitor.Visit({"kvcached_tier_capacity_bytes", "Capacity of a tier", CounterType::kGauge}, l,
                  capacity_bytes);
    visitor.Visit(
        {"kvcached_tier_used_bytes", "Bytes of a tier reserved by slabs (host) or extents (ssd)",
         CounterType::kGauge},
        l, used_bytes);
    visitor.Visit({"kvcached_tier_payload_bytes", "Bytes of cached block payloads in a tier",
                   CounterType::kGauge},
                  l, payload_bytes);
    visitor.Visit({"kvcached_tier_blocks", "Blocks cached in a tier", CounterType::kGauge}, l,
                  blocks);
    visitor.Visit({"kvcached_tier_utilization_ratio",
                   "Live payload bytes over the bytes a tier has reserved", CounterType::kGauge},
                  l, utilization);
  }
};

}  // namespace

void ModelStats::VisitCounters(CounterVisitor& visitor) const {
  const std::string_view ns = model.ns;
  const std::string_view id = model.model_id;
  const std::array<CounterLabel, 2> l = {{{"namespace", ns}, {"model", id}}};
  visitor.Visit({"kvcached_model_blocks", "Blocks cached per model", CounterType::kGauge}, l,
                blocks);
  visitor.Visit({"kvcached_model_bytes", "Payload bytes cached per model", CounterType::kGauge}, l,
                bytes);
  visitor.Visit({"kvcached_lookup_hit_tokens_total", "Tokens Lookup found cached, per model",
                 CounterType::kCounter},
                l, hit_tokens);
  visitor.Visit({"kvcached_lookup_miss_tokens_total",
                 "Whole-block tokens Lookup did not find, per model", CounterType::kCounter},
                l, miss_tokens);
  visitor.Visit({"kvcached_appended_blocks_total", "Blocks stored by Append, per model",
                 CounterType::kCounter},
                l, appended_blocks);
  visitor.Visit({"kvcached_deduplicated_blocks_total",
                 "Appended blocks that were already cached, per model", CounterType::kCounter},
                l, deduplicated_blocks);
  visitor.Visit({"kvcached_model_evicted_blocks_total",
                 "Blocks removed (capacity, explicit or expiry), per model", CounterType::kCounter},
                l, evicted_blocks);
  // Importance-aware retention.
  constexpr CounterFamily kMode{
      "kvcached_compression_mode",
      "1 for the compression mode a model is in (off, quantize, prune, budget)",
      CounterType::kGauge};
  for (const char* name : {"off", "quantize", "prune", "budget"}) {
    visitor.Visit(kMode, {{"namespace", ns}, {"model", id}, {"mode", name}},
                  CompressionModeName(policy.mode) == name ? 1.0 : 0.0);
  }
  constexpr CounterFamily kWeight{
      "kvcached_importance_weight",
      "Importance score weights in effect (alpha, beta, gamma), per model", CounterType::kGauge};
  visitor.Visit(kWeight, {{"namespace", ns}, {"model", id}, {"weight", "alpha"}},
                policy.params.alpha);
  visitor.Visit(kWeight, {{"namespace", ns}, {"model", id}, {"weight", "beta"}},
                policy.params.beta);
  visitor.Visit(kWeight, {{"namespace", ns}, {"model", id}, {"weight", "gamma"}},
                policy.params.gamma);
  visitor.Visit({"kvcached_model_compressed_blocks",
                 "Blocks stored in the compressed format, per model", CounterType::kGauge},
                l, compressed_blocks);
  constexpr CounterFamily kTokens{"kvcached_model_tokens",
                                  "Cached tokens per model by precision (full, int8, pruned)",
                                  CounterType::kGauge};
  visitor.Visit(kTokens, {{"namespace", ns}, {"model", id}, {"precision", "full"}}, full_tokens);
  visitor.Visit(kTokens, {{"namespace", ns}, {"model", id}, {"precision", "int8"}}, int8_tokens);
  visitor.Visit(kTokens, {{"namespace", ns}, {"model", id}, {"precision", "pruned"}},
                pruned_tokens);
  constexpr CounterFamily kEntries{
      "kvcached_model_entries",
      "Budget mode: (layer, KV head, token) entries per model by precision (int8, int4, pruned)",
      CounterType::kGauge};
  visitor.Visit(kEntries, {{"namespace", ns}, {"model", id}, {"precision", "int8"}}, int8_entries);
  visitor.Visit(kEntries, {{"namespace", ns}, {"model", id}, {"precision", "int4"}}, int4_entries);
  visitor.Visit(kEntries, {{"namespace", ns}, {"model", id}, {"precision", "pruned"}},
                pruned_entries);
  visitor.Visit({"kvcached_budget_overruns_total",
                 "Blocks compacted in budget mode that did not fit target_bytes even pruned, "
                 "per model",
                 CounterType::kCounter},
                l, budget_overruns);
  visitor.Visit(
      {"kvcached_model_bytes_saved", "Raw block bytes minus what compressed blocks take, per model",
       CounterType::kGauge},
      l, bytes_saved);
  visitor.Visit({"kvcached_attention_reports_total",
                 "Attention reports folded into token activity, per model", CounterType::kCounter},
                l, attention_reports);
  visitor.Visit({"kvcached_calibrations_total",
                 "Refits of the importance weights applied, per model", CounterType::kCounter},
                l, calibrations);
  // Integrity.
  visitor.Visit({"kvcached_conflicting_blocks_total",
                 "Appended blocks whose bytes differed from the cached copy, per model",
                 CounterType::kCounter},
                l, conflicting_blocks);
  visitor.Visit({"kvcached_restored_blocks_total",
                 "Lossy blocks made exact again by an append, per model", CounterType::kCounter},
                l, restored_blocks);
  visitor.Visit(
      {"kvcached_corrupt_blocks_total",
       "Blocks found not matching their checksum and dropped, per model", CounterType::kCounter},
      l, corrupt_blocks);
}

void LowerLevelCounters::VisitCounters(std::string_view tier, std::string_view above,
                                       CounterVisitor& visitor) const {
  const std::array<CounterLabel, 1> l = {{{"tier", tier}}};
  constexpr CounterFamily kMoves{"kvcached_tier_migrations_total",
                                 "Blocks moved between tiers, by direction and reason",
                                 CounterType::kCounter};
  constexpr CounterFamily kMovedBytes{"kvcached_tier_migrated_bytes_total",
                                      "Bytes moved between tiers, by direction",
                                      CounterType::kCounter};
  constexpr CounterFamily kEvictions{"kvcached_tier_evictions_total",
                                     "Blocks evicted from a tier, by reason",
                                     CounterType::kCounter};
  visitor.Visit(kMoves, {{"from", above}, {"to", tier}, {"reason", "demote"}}, demotions);
  visitor.Visit(kMovedBytes, {{"from", above}, {"to", tier}}, demoted_bytes);
  visitor.Visit(kMoves, {{"from", above}, {"to", tier}, {"reason", "clean_drop"}}, clean_drops);
  visitor.Visit(kMoves, {{"from", tier}, {"to", "host"}, {"reason", "promote"}}, promotions);
  visitor.Visit(kMovedBytes, {{"from", tier}, {"to", "host"}}, promoted_bytes);
  visitor.Visit({"kvcached_tier_reads_total", "Blocks read back from a tier for fetches",
                 CounterType::kCounter},
                l, reads);
  visitor.Visit({"kvcached_tier_read_bytes_total", "Bytes read back from a tier for fetches",
                 CounterType::kCounter},
                l, read_bytes);
  visitor.Visit(kEvictions, {{"tier", tier}, {"reason", "capacity"}}, evictions);
  visitor.Visit({"kvcached_tier_admissions_refused_total",
                 "Demotions the admission gate or the write budget refused", CounterType::kCounter},
                l, admissions_refused);
  visitor.Visit(kEvictions, {{"tier", above}, {"reason", "not_admitted"}}, not_admitted_evictions);
  visitor.Visit(
      {"kvcached_tier_write_failures_total",
       "Writes a tier refused (full after evicting, or an I/O error)", CounterType::kCounter},
      l, write_failures);
  visitor.Visit(
      {"kvcached_tier_checksum_failures_total",
       "Copies that failed verification when read: dropped, never served", CounterType::kCounter},
      l, checksum_failures);
}

void TierCounters::VisitDeviceCounters(CounterVisitor& visitor) const {
  visitor.Visit({"kvcached_gpu_placements_total",
                 "Blocks copied into the GPU tier for same-host workers (PlaceOnDevice)",
                 CounterType::kCounter},
                device_placements);
  visitor.Visit(
      {"kvcached_gpu_placed_bytes_total", "Bytes copied into the GPU tier", CounterType::kCounter},
      device_placed_bytes);
  visitor.Visit({"kvcached_gpu_placement_hits_total",
                 "Blocks a placement found in the GPU tier already", CounterType::kCounter},
                device_hits);
  constexpr CounterFamily kDrops{
      "kvcached_gpu_drops_total",
      "GPU tier copies dropped, by reason (clean: the block stays in host memory or on SSD)",
      CounterType::kCounter};
  visitor.Visit(kDrops, {{"reason", "room"}}, device_drops_room);
  visitor.Visit(kDrops, {{"reason", "pressure"}}, device_drops_pressure);
  visitor.Visit(kDrops, {{"reason", "invalidated"}}, device_drops_invalidated);
  visitor.Visit(
      {"kvcached_gpu_write_failures_total",
       "Copies into the GPU tier that failed (other than for room)", CounterType::kCounter},
      device_write_failures);
}

void CheckpointCounters::VisitCounters(absl::Time now, CounterVisitor& visitor) const {
  if (!enabled) return;
  constexpr CounterFamily kRuns{"kvcached_checkpoints_total",
                                "Checkpoint runs, by outcome (ok, failed)", CounterType::kCounter};
  visitor.Visit(kRuns, {{"outcome", "ok"}}, ok);
  visitor.Visit(kRuns, {{"outcome", "failed"}}, failed);
  // The exposure: what a crash now would lose was cached since then.
  const double since =
      last_success_unix_seconds > 0 ? last_success_unix_seconds : started_unix_seconds;
  visitor.Visit({"kvcached_checkpoint_age_seconds",
                 "Seconds since the last checkpoint committed (or since start, before one)",
                 CounterType::kGauge},
                absl::ToDoubleSeconds(now - absl::UnixEpoch()) - since);
  if (last_success_unix_seconds > 0) {
    visitor.Visit({"kvcached_checkpoint_last_success_timestamp_seconds",
                   "When the last checkpoint was committed (Unix time)", CounterType::kGauge},
                  last_success_unix_seconds);
    visitor.Visit({"kvcached_checkpoint_duration_seconds",
                   "How long the last checkpoint took to write", CounterType::kGauge},
                  last_duration_seconds);
    visitor.Visit({"kvcached_checkpoint_bytes", "Size of the last checkpoint's data file",
                   CounterType::kGauge},
                  last_bytes);
  }
  visitor.Visit({"kvcached_checkpoint_in_progress", "1 while a checkpoint is being written",
                 CounterType::kGauge},
                in_progress ? 1 : 0);
  constexpr CounterFamily kRestoreState{"kvcached_checkpoint_restore_state",
                                        "The restore at start-up: 1 for its current state",
                                        CounterType::kGauge};
  for (const char* state : {"off", "reattaching", "restoring", "done", "failed", "stopped"}) {
    visitor.Visit(kRestoreState, {{"state", state}}, restore_state == state ? 1 : 0);
  }
  constexpr CounterFamily kRestored{"kvcached_checkpoint_restore_blocks_total",
                                    "Blocks the restore at start-up put back or skipped",
                                    CounterType::kCounter};
  visitor.Visit(kRestored, {{"outcome", "restored"}}, restored_blocks);
  visitor.Visit(kRestored, {{"outcome", "skipped"}}, restore_skipped_blocks);
  visitor.Visit({"kvcached_checkpoint_restore_failures_total",
                 "Checkpoints found corrupt or unreadable when restoring", CounterType::kCounter},
                restore_failed_checkpoints);
  constexpr CounterFamily kReattached{"kvcached_checkpoint_reattached_copies_total",
                                      "Lower-tier (SSD) copies re-attached at start-up, by outcome",
                                      CounterType::kCounter};
  visitor.Visit(kReattached, {{"outcome", "ok"}}, reattached_copies);
  visitor.Visit(kReattached, {{"outcome", "failed"}}, reattach_failures);
}

void PoolCompactionCounters::VisitCounters(CounterVisitor& visitor) const {
  visitor.Visit({"kvcached_pool_compaction_passes_total", "Host pool compaction passes run",
                 CounterType::kCounter},
                passes);
  visitor.Visit({"kvcached_pool_compaction_moves_total",
                 "Blocks host pool compaction moved to a fuller span", CounterType::kCounter},
                moved_blocks);
  visitor.Visit({"kvcached_pool_compaction_moved_bytes_total",
                 "Payload bytes host pool compaction copied and swapped in", CounterType::kCounter},
                moved_bytes);
  constexpr CounterFamily kSkipped{
      "kvcached_pool_compaction_skipped_total",
      "Blocks host pool compaction copied but did not swap in, by reason", CounterType::kCounter};
  visitor.Visit(kSkipped, {{"reason", "changed"}}, changed_blocks);
  visitor.Visit(kSkipped, {{"reason", "checksum_mismatch"}}, mismatched_blocks);
}

void CacheStats::VisitCounters(absl::Time now, CounterVisitor& visitor) const {
  if (models.empty()) {
    DeclaringVisitor declare(visitor);
    ModelStats().VisitCounters(declare);
  }
  for (const ModelStats& m : models) m.VisitCounters(visitor);

  TierSize{.tier = "host",
           .capacity_bytes = host_pool.capacity_bytes,
           .used_bytes = host_pool.reserved_bytes,
           .payload_bytes = payload_bytes,
           .blocks = blocks - tiers.lower_only_blocks(),
           .utilization = Ratio(payload_bytes, host_pool.reserved_bytes)}
      .VisitCounters(visitor);
  for (size_t i = 0; i < lower_stores.size(); ++i) {
    const TierStats& store = lower_stores[i];
    const LowerLevelCounters& level = tiers.lower[i];
    TierSize{.tier = store.kind,
             .capacity_bytes = store.capacity_bytes,
             .used_bytes = store.allocated_bytes,
             .payload_bytes = level.payload_bytes,
             .blocks = level.blocks,
             .utilization = Ratio(level.payload_bytes, store.allocated_bytes)}
        .VisitCounters(visitor);
  }
  if (has_device) {
    TierSize{.tier = "gpu",
             .capacity_bytes = device_store.capacity_bytes,
             .used_bytes = device_store.allocated_bytes,
             .payload_bytes = tiers.device_payload_bytes,
             .blocks = tiers.device_blocks,
             .utilization = Ratio(device_store.payload_bytes, device_store.allocated_bytes)}
        .VisitCounters(visitor);
  }

  visitor.Visit({"kvcached_active_leases", "Leases currently pinning blocks", CounterType::kGauge},
                active_leases);
  visitor.Visit({"kvcached_capacity_evictions_total", "Blocks evicted to make room for new ones",
                 CounterType::kCounter},
                capacity_evictions);
  visitor.Visit({"kvcached_quota_evictions_total",
                 "Blocks a namespace evicted of its own to stay under its quota "
                 "(security.tenant_limits.max_cached_bytes)",
                 CounterType::kCounter},
                quota_evictions);
  visitor.Visit({"kvcached_rejected_appends_total",
                 "Appends refused because nothing could be evicted", CounterType::kCounter},
                rejected_appends);
  visitor.Visit(
      {"kvcached_compaction_passes_total", "Compaction passes run", CounterType::kCounter},
      compaction_passes);
  pool_compaction.VisitCounters(visitor);
  host_pool.VisitCounters(visitor);
  // conflicting_appends: GetStats only (docs/metrics.md).
  visitor.Visit({"kvcached_metadata_evictions_total",
                 "Blocks evicted to keep index metadata within its budget", CounterType::kCounter},
                metadata_evictions);
  visitor.Visit({"kvcached_namespace_metadata_evictions_total",
                 "Blocks a namespace evicted of its own to keep its metadata within its share "
                 "(security.tenant_limits.max_share of the metadata budget)",
                 CounterType::kCounter},
                namespace_metadata_evictions);
  visitor.Visit({"kvcached_metadata_bytes", "Index metadata and lease token copies held in memory",
                 CounterType::kGauge},
                metadata_bytes);
  visitor.Visit({"kvcached_append_staged_bytes", "Pool memory held by appends in flight",
                 CounterType::kGauge},
                staged_bytes);
  visitor.Visit({"kvcached_lease_tokens", "Tokens held by live leases", CounterType::kGauge},
                lease_tokens);

  for (size_t i = 0; i < lower_stores.size(); ++i) {
    const TierStats& store = lower_stores[i];
    tiers.lower[i].VisitCounters(store.kind, i == 0 ? "host" : lower_stores[i - 1].kind, visitor);
    visitor.Visit(
        {"kvcached_tier_retained_bytes",
         "Space of freed copies kept for the newest checkpoint's re-attach", CounterType::kGauge},
        {{"tier", store.kind}}, store.retained_bytes);
    visitor.Visit({"kvcached_tier_retained_reused_total",
                   "Retained copies whose space a write reused past checkpoint.ssd_retained_share",
                   CounterType::kCounter},
                  {{"tier", store.kind}}, store.retained_reused);
  }
  if (has_lower()) {
    // The read-back's own: by the first level's kind, the one they read most.
    const std::string& first = lower_stores.front().kind;
    visitor.Visit({"kvcached_tier_heap_bounded_fetches_total",
                   "Fetches cut short because their read-back into the heap reached "
                   "limits.max_fetch_heap_bytes",
                   CounterType::kCounter},
                  {{"tier", first}}, tiers.heap_bounded_fetches);
    prefetch.VisitPrefetchCounters(first, visitor);
    fetch_reads.VisitFetchReadCounters(first, visitor);
  }
  if (has_device) tiers.VisitDeviceCounters(visitor);
  checkpoint.VisitCounters(now, visitor);
}

}  // namespace kvcache
