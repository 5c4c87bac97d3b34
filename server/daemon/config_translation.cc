#include "server/daemon/config_translation.h"

#include "server/config/config.h"

namespace kvcache {

std::string Enabled(const std::string& value) { return value == kDisabled ? "" : value; }

std::string ShmSocketPath(const v1::ListenConfig& listen) {
  if (!listen.shm_socket().empty()) return Enabled(listen.shm_socket());
  const std::string grpc_socket = Enabled(listen.unix_socket());
  return grpc_socket.empty() ? "" : grpc_socket + ".shm";
}

ImportanceOptions ImportanceFromConfig(const v1::ImportanceConfig& c) {
  ImportanceOptions o;
  ImportancePolicy& p = o.default_policy;
  p.mode = ParseCompressionMode(c.default_mode()).value_or(CompressionMode::kOff);
  p.params.alpha = c.alpha();
  p.params.beta = c.beta();
  p.params.gamma = c.gamma();
  p.params.sink_tokens = c.sink_tokens();
  p.params.recent_window = c.recent_window();
  p.params.decay_tau = c.decay_tau();
  p.target_mass = c.target_mass();
  p.target_bytes = c.target_bytes();
  o.activity_half_life_seconds = c.activity_half_life_seconds();
  o.cold_after = absl::Seconds(c.cold_after_seconds());
  o.pressure_watermark = c.pressure_watermark();
  o.max_blocks_per_pass = c.max_blocks_per_pass();
  o.novelty_layers.assign(c.novelty_layers().begin(), c.novelty_layers().end());
  o.calibration_samples = kCalibrationSamples;
  o.calibration_min_samples = c.calibration_min_samples();
  o.calibration_max_step = c.calibration_max_step();
  return o;
}

std::unique_ptr<EvictionPolicy> EvictionPolicyFromConfig(const v1::CacheConfig& c, Clock* clock) {
  if (c.eviction_policy() == "lru") return NewLruPolicy();
  LruKOptions o;
  o.correlated_period = absl::Milliseconds(c.lru_k().correlated_period_ms());
  o.retained_history = c.lru_k().retained_history();
  o.fewer_than_k_penalty = absl::Milliseconds(c.lru_k().fewer_than_k_penalty_ms());
  return NewLruKPolicy(o, clock);
}

SlabPoolOptions HostPoolOptionsFromConfig(const v1::HostTierConfig& host) {
  return {.capacity_bytes = host.capacity_bytes(),
          .slab_bytes = host.slab_bytes(),
          .min_class_bytes = host.min_class_bytes(),
          .thread_cache_bytes = host.thread_cache_bytes()};
}

CacheOptions CacheOptionsFromConfig(const v1::ServerConfig& config) {
  const v1::LimitsConfig& limits = config.limits();
  const v1::HostTierConfig& host = config.host_tier();
  const auto share_of_host = [&host](double fraction) {
    return static_cast<uint64_t>(fraction * static_cast<double>(host.capacity_bytes()));
  };
  CacheOptions o{.max_tokens_per_request = limits.max_tokens_per_request(),
                 .default_lease_ttl = absl::Milliseconds(limits.default_lease_ttl_ms()),
                 .max_lease_ttl = absl::Milliseconds(limits.max_lease_ttl_ms()),
                 .max_models = limits.max_models(),
                 .max_leases = limits.max_leases(),
                 .max_lease_tokens = limits.max_lease_tokens(),
                 .append_staging_bytes = share_of_host(host.append_staging_fraction()),
                 .max_metadata_bytes = share_of_host(host.metadata_fraction()),
                 .max_protected_ranges = limits.max_protected_ranges(),
                 .max_namespace_bytes = config.security().tenant_limits().max_cached_bytes(),
                 .namespace_share = TenantShare(config.security()),
                 .max_fetch_heap_bytes = limits.max_fetch_heap_bytes(),
                 .importance = ImportanceFromConfig(config.importance())};
  const v1::SsdTierConfig& ssd = config.ssd_tier();
  o.tiers = {.host_high_watermark = host.high_watermark(),
             .host_low_watermark = host.low_watermark(),
             .lower_admit_min_references = ssd.admit_min_references(),
             .lower_write_bytes_per_second = ssd.max_write_bytes_per_second(),
             .promote_on_fetch = ssd.promote_on_fetch(),
             .device_high_watermark = config.gpu_tier().high_watermark(),
             .device_low_watermark = config.gpu_tier().low_watermark()};
  o.require_block_checksums = config.security().require_block_checksums();
  return o;
}

}  // namespace kvcache
