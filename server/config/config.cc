#include "server/config/config.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <fstream>
#include <sstream>
#include <thread>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "google/protobuf/util/json_util.h"
#include "server/common/status_macros.h"
#include "server/config/tier_list.h"
#include "server/core/layout.h"

namespace kvcache {
namespace {

absl::Status CheckRange(std::string_view field, uint64_t value, uint64_t lo, uint64_t hi);

absl::Status ValidateCheckpoint(const v1::CheckpointConfig& c) {
  KVCACHE_RETURN_IF_ERROR(CheckRange("checkpoint.keep", c.keep(), 1, 1000));
  KVCACHE_RETURN_IF_ERROR(CheckRange("checkpoint.full_every", c.full_every(), 1, 1000));
  if (c.zstd_level() < 0 || c.zstd_level() > 19) {
    return absl::InvalidArgumentError(
        absl::StrCat("checkpoint.zstd_level is ", c.zstd_level(), "; it must be in [0, 19]"));
  }
  if (!(c.ssd_retained_share() >= 0.0 && c.ssd_retained_share() <= 1.0)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "checkpoint.ssd_retained_share is ", c.ssd_retained_share(), "; it must be in [0, 1]"));
  }
  // A limit of a few bytes a second would never finish a checkpoint.
  if (c.max_write_bytes_per_second() != 0 && c.max_write_bytes_per_second() < (1u << 20)) {
    return absl::InvalidArgumentError(
        absl::StrCat("checkpoint.max_write_bytes_per_second is ", c.max_write_bytes_per_second(),
                     "; it must be 0 (no limit) or at least 1048576 (1 MiB/s)"));
  }
  return absl::OkStatus();
}

absl::Status ValidateRemoteTier(const v1::RemoteTierConfig& r) {
  KVCACHE_RETURN_IF_ERROR(
      CheckRange("remote_tier.connect_timeout_ms", r.connect_timeout_ms(), 1, 60000));
  KVCACHE_RETURN_IF_ERROR(CheckRange("remote_tier.io_timeout_ms", r.io_timeout_ms(), 1, 60000));
  KVCACHE_RETURN_IF_ERROR(CheckRange("remote_tier.max_redirects", r.max_redirects(), 1, 100));
  KVCACHE_RETURN_IF_ERROR(
      CheckRange("remote_tier.write_queue_blocks", r.write_queue_blocks(), 1, 1 << 20));
  KVCACHE_RETURN_IF_ERROR(
      CheckRange("remote_tier.write_batch_blocks", r.write_batch_blocks(), 1, 4096));
  KVCACHE_RETURN_IF_ERROR(
      CheckRange("remote_tier.breaker_failures", r.breaker_failures(), 1, 1000));
  KVCACHE_RETURN_IF_ERROR(
      CheckRange("remote_tier.breaker_cooldown_ms", r.breaker_cooldown_ms(), 10, 600000));
  KVCACHE_RETURN_IF_ERROR(CheckRange("remote_tier.share_queue", r.share_queue(), 1, 65536));
  KVCACHE_RETURN_IF_ERROR(CheckRange("remote_tier.discover_queue", r.discover_queue(), 1, 65536));
  KVCACHE_RETURN_IF_ERROR(
      CheckRange("remote_tier.max_discover_blocks", r.max_discover_blocks(), 1, 65536));
  KVCACHE_RETURN_IF_ERROR(
      CheckRange("remote_tier.batch_deadline_ms", r.batch_deadline_ms(), 10, 60000));
  if (r.seeds().empty()) return absl::OkStatus();
  for (const std::string& seed : r.seeds()) {
    const size_t colon = seed.rfind(':');
    uint32_t port = 0;
    if (colon == std::string::npos || colon == 0 ||
        !absl::SimpleAtoi(absl::string_view(seed).substr(colon + 1), &port) || port == 0 ||
        port > 65535) {
      return absl::InvalidArgumentError(
          absl::StrCat("remote_tier.seeds holds \"", seed, "\"; each must be HOST:PORT"));
    }
  }
  if (r.key_file().empty()) {
    return absl::InvalidArgumentError(
        "remote_tier.key_file is empty; with remote_tier.seeds set it must name the secret "
        "every daemon of the deployment shares");
  }
  return absl::OkStatus();
}

absl::Status ValidateStatusPage(const v1::StatusPageConfig& p) {
  return CheckRange("status_page.recent_events", p.recent_events(), 1, 10000);
}

absl::Status ValidateGpuTier(const v1::GpuTierConfig& g) {
  if (g.kind().empty()) return absl::OkStatus();
  if (g.kind() != "cuda" && g.kind() != "host_stand_in") {
    return absl::InvalidArgumentError(absl::StrCat("gpu_tier.kind is \"", g.kind(),
                                                   "\"; it must be cuda, host_stand_in or empty"));
  }
  if (auto s = CheckRange("gpu_tier.slab_bytes", g.slab_bytes(), 64 << 10, uint64_t{1} << 30);
      !s.ok()) {
    return s;
  }
  if (!std::has_single_bit(g.slab_bytes())) {
    return absl::InvalidArgumentError(
        absl::StrCat("gpu_tier.slab_bytes is ", g.slab_bytes(), "; it must be a power of two"));
  }
  if (!std::has_single_bit(g.min_block_bytes()) || g.min_block_bytes() < 256 ||
      g.min_block_bytes() > g.slab_bytes()) {
    return absl::InvalidArgumentError(
        absl::StrCat("gpu_tier.min_block_bytes is ", g.min_block_bytes(),
                     "; it must be a power of two from 256 to slab_bytes (", g.slab_bytes(), ")"));
  }
  if (auto s = CheckRange("gpu_tier.capacity_bytes", g.capacity_bytes(), g.slab_bytes(),
                          uint64_t{1} << 50);
      !s.ok()) {
    return s;
  }
  if (g.arena_bytes() == 0 || g.arena_bytes() % g.slab_bytes() != 0 ||
      g.arena_bytes() > g.capacity_bytes()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "gpu_tier.arena_bytes is ", g.arena_bytes(), "; it must be a multiple of slab_bytes (",
        g.slab_bytes(), ") and at most capacity_bytes (", g.capacity_bytes(), ")"));
  }
  if (!(g.low_watermark() > 0 && g.low_watermark() <= g.high_watermark() &&
        g.high_watermark() <= 1)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "gpu_tier.low_watermark (", g.low_watermark(), ") and high_watermark (", g.high_watermark(),
        ") must satisfy 0 < low_watermark <= high_watermark <= 1"));
  }
  if (g.on_unavailable() != "refuse" && g.on_unavailable() != "skip") {
    return absl::InvalidArgumentError(absl::StrCat(
        "gpu_tier.on_unavailable is \"", g.on_unavailable(), "\"; it must be refuse or skip"));
  }
  return absl::OkStatus();
}

absl::Status ValidateMemory(const v1::MemoryConfig& m) {
  if (m.mmap_threshold_bytes() != 0) {
    if (auto s = CheckRange("memory.mmap_threshold_bytes", m.mmap_threshold_bytes(), 4096,
                            uint64_t{32} << 20);
        !s.ok()) {
      return s;
    }
  }
  if (auto s = CheckRange("memory.malloc_arena_max", m.malloc_arena_max(), 0, 1024); !s.ok()) {
    return s;
  }
  if (m.trim_interval_ms() != 0) {
    if (auto s = CheckRange("memory.trim_interval_ms", m.trim_interval_ms(), 10, 3600000);
        !s.ok()) {
      return s;
    }
  }
  return absl::OkStatus();
}

absl::Status ValidateSsdTier(const v1::SsdTierConfig& ssd) {
  if (ssd.path().empty()) return absl::OkStatus();
  if (auto s = CheckRange("ssd_tier.region_bytes", ssd.region_bytes(), 1 << 20, uint64_t{1} << 30);
      !s.ok()) {
    return s;
  }
  if (!std::has_single_bit(ssd.region_bytes())) {
    return absl::InvalidArgumentError(absl::StrCat("ssd_tier.region_bytes is ", ssd.region_bytes(),
                                                   "; it must be a power of two"));
  }
  if (auto s = CheckRange("ssd_tier.capacity_bytes", ssd.capacity_bytes(), ssd.region_bytes(),
                          uint64_t{1} << 52);
      !s.ok()) {
    return s;
  }
  if (ssd.io_engine() != "auto" && ssd.io_engine() != "io_uring" && ssd.io_engine() != "threads") {
    return absl::InvalidArgumentError(absl::StrCat("ssd_tier.io_engine is \"", ssd.io_engine(),
                                                   "\"; it must be auto, io_uring or threads"));
  }
  KVCACHE_RETURN_IF_ERROR(CheckRange("ssd_tier.io_threads", ssd.io_threads(), 1, 256));
  if (auto s = CheckRange("ssd_tier.staging_cache_bytes", ssd.staging_cache_bytes(), 0,
                          uint64_t{1} << 30);
      !s.ok()) {
    return s;
  }
  if (auto s = CheckRange("ssd_tier.admit_min_references", ssd.admit_min_references(), 1, 65535);
      !s.ok()) {
    return s;
  }
  if (ssd.on_open_failure() != "refuse" && ssd.on_open_failure() != "skip") {
    return absl::InvalidArgumentError(absl::StrCat(
        "ssd_tier.on_open_failure is \"", ssd.on_open_failure(), "\"; it must be refuse or skip"));
  }
  return absl::OkStatus();
}

absl::Status CheckRange(std::string_view field, uint64_t value, uint64_t lo, uint64_t hi) {
  if (value < lo || value > hi) {
    return absl::InvalidArgumentError(
        absl::StrCat(std::string(field), " is ", value, "; it must be in ", lo, "..", hi));
  }
  return absl::OkStatus();
}

absl::Status CheckUnit(std::string_view field, double value, bool allow_zero) {
  if (!std::isfinite(value) || value < 0 || value > 1 || (!allow_zero && value == 0)) {
    return absl::InvalidArgumentError(absl::StrCat("importance.", std::string(field), " is ", value,
                                                   "; it must be in ",
                                                   allow_zero ? "[0, 1]" : "(0, 1]"));
  }
  return absl::OkStatus();
}

absl::Status ValidateImportance(const v1::ImportanceConfig& i) {
  const std::string& mode = i.default_mode();
  if (mode != "off" && mode != "quantize" && mode != "prune" && mode != "budget") {
    return absl::InvalidArgumentError(absl::StrCat(
        "importance.default_mode is \"", mode, "\"; it must be off, quantize, prune or budget"));
  }
  for (auto [field, value] : {std::pair<std::string_view, double>{"alpha", i.alpha()},
                              {"beta", i.beta()},
                              {"gamma", i.gamma()}}) {
    KVCACHE_RETURN_IF_ERROR(CheckUnit(field, value, true));
  }
  if (i.alpha() + i.beta() + i.gamma() <= 0) {
    return absl::InvalidArgumentError("importance.alpha, beta and gamma are all 0");
  }
  KVCACHE_RETURN_IF_ERROR(CheckUnit("target_mass", i.target_mass(), false));
  KVCACHE_RETURN_IF_ERROR(CheckUnit("target_bytes", i.target_bytes(), false));
  KVCACHE_RETURN_IF_ERROR(CheckUnit("pressure_watermark", i.pressure_watermark(), false));
  if (auto s = CheckRange("importance.sink_tokens", i.sink_tokens(), 0, 1 << 20); !s.ok()) {
    return s;
  }
  if (auto s = CheckRange("importance.recent_window", i.recent_window(), 0, 1 << 20); !s.ok()) {
    return s;
  }
  if (!std::isfinite(i.decay_tau()) || i.decay_tau() <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("importance.decay_tau is ", i.decay_tau(), "; it must be > 0"));
  }
  if (!std::isfinite(i.activity_half_life_seconds()) || i.activity_half_life_seconds() < 0) {
    return absl::InvalidArgumentError("importance.activity_half_life_seconds must be >= 0");
  }
  if (auto s =
          CheckRange("importance.compaction_interval_ms", i.compaction_interval_ms(), 10, 3600000);
      !s.ok()) {
    return s;
  }
  if (auto s = CheckRange("importance.max_blocks_per_pass", i.max_blocks_per_pass(), 1, 1 << 20);
      !s.ok()) {
    return s;
  }
  if (auto s = CheckUnit("calibration_max_step", i.calibration_max_step(), false); !s.ok()) {
    return s;
  }
  // A refit needs at least calibration_min_samples samples and the reservoir
  // holds kCalibrationSamples: more would switch calibration off silently.
  if (auto s = CheckRange("importance.calibration_min_samples", i.calibration_min_samples(), 1,
                          kCalibrationSamples);
      !s.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat(s.message(), " (a model keeps at most ", kCalibrationSamples,
                     " calibration samples, so more could never be reached)"));
  }
  for (uint32_t layer : i.novelty_layers()) {
    KVCACHE_RETURN_IF_ERROR(CheckRange("importance.novelty_layers[]", layer, 0, 1023));
  }
  return absl::OkStatus();
}

absl::Status ValidateSecurity(const v1::SecurityConfig& s) {
  const v1::TlsConfig& tls = s.tls();
  if (tls.cert_file().empty() != tls.key_file().empty()) {
    return absl::InvalidArgumentError(
        "security.tls.cert_file and security.tls.key_file go together: set both or neither");
  }
  if (!tls.client_ca_file().empty() && tls.cert_file().empty()) {
    return absl::InvalidArgumentError(
        "security.tls.client_ca_file (mutual TLS) needs security.tls.cert_file and key_file");
  }
  if (auto st = CheckRange("security.tls.reload_interval_seconds", tls.reload_interval_seconds(), 1,
                           86400);
      !st.ok()) {
    return st;
  }
  for (const std::string& ns : s.shared_namespaces()) {
    KVCACHE_RETURN_IF_ERROR(ValidateIdentifier("security.shared_namespaces", ns));
  }
  if (!s.has_require_block_checksums()) {
    // Unset reads as false: integrity would be off by omission.
    return absl::InvalidArgumentError(
        "security.require_block_checksums is unset; apply the defaults before validating");
  }
  if (const double share = TenantShare(s); !(share > 0 && share <= 1)) {
    return absl::InvalidArgumentError(
        absl::StrCat("security.tenant_limits.max_share is ", share, "; it must be in (0, 1]"));
  }
  return absl::OkStatus();
}

// LruKOptions::fewer_than_k_penalty's upper bound.
constexpr uint64_t kTenYearsMs = uint64_t{10} * 365 * 24 * 3600 * 1000;

absl::Status ValidateCache(const v1::CacheConfig& c) {
  if (c.eviction_policy() != "lru" && c.eviction_policy() != "lru_k") {
    return absl::InvalidArgumentError(absl::StrCat(
        "cache.eviction_policy is \"", c.eviction_policy(), "\"; it must be lru or lru_k"));
  }
  if (auto s = CheckRange("cache.lru_k.correlated_period_ms", c.lru_k().correlated_period_ms(), 0,
                          86400000);
      !s.ok()) {
    return s;
  }
  if (auto s = CheckRange("cache.lru_k.fewer_than_k_penalty_ms",
                          c.lru_k().fewer_than_k_penalty_ms(), 0, kTenYearsMs);
      !s.ok()) {
    return s;
  }
  return CheckRange("cache.lru_k.retained_history", c.lru_k().retained_history(), 0,
                    uint64_t{1} << 26);
}

}  // namespace

bool IsLoopbackAddress(std::string_view address) {
  std::string_view host = address;
  if (!host.empty() && host.front() == '[') {
    const size_t close = host.find(']');
    host = close == std::string_view::npos ? host.substr(1) : host.substr(1, close - 1);
  } else if (const size_t colon = host.rfind(':'); colon != std::string_view::npos) {
    host = host.substr(0, colon);
  }
  if (host == "localhost" || host == "::1") return true;
  // 127.0.0.0/8, written as a dotted quad.
  return host.size() > 4 && host.substr(0, 4) == "127." &&
         host.find_first_not_of("0123456789.") == std::string_view::npos;
}

void ApplyDefaults(v1::ServerConfig* c) {
  v1::ListenConfig* listen = c->mutable_listen();
  if (listen->tcp_address().empty()) listen->set_tcp_address("127.0.0.1:50051");
  if (listen->unix_socket().empty()) listen->set_unix_socket("/tmp/kvcached.sock");
  if (listen->metrics_address().empty()) listen->set_metrics_address("127.0.0.1:9464");

  v1::LimitsConfig* limits = c->mutable_limits();
  if (limits->max_message_bytes() == 0) limits->set_max_message_bytes(uint64_t{64} << 20);
  if (limits->max_tokens_per_request() == 0) limits->set_max_tokens_per_request(1 << 20);
  if (limits->max_concurrent_streams() == 0) limits->set_max_concurrent_streams(256);
  if (limits->fetch_chunk_bytes() == 0) limits->set_fetch_chunk_bytes(1 << 20);
  if (limits->default_lease_ttl_ms() == 0) limits->set_default_lease_ttl_ms(30000);
  if (limits->max_lease_ttl_ms() == 0) limits->set_max_lease_ttl_ms(600000);
  if (limits->max_models() == 0) limits->set_max_models(1024);
  if (limits->max_leases() == 0) limits->set_max_leases(65536);
  if (limits->max_lease_tokens() == 0) limits->set_max_lease_tokens(uint64_t{64} << 20);
  if (limits->max_fetch_heap_bytes() == 0) limits->set_max_fetch_heap_bytes(uint64_t{256} << 20);
  if (limits->max_protected_ranges() == 0) limits->set_max_protected_ranges(1024);
  if (limits->stream_idle_timeout_ms() == 0) limits->set_stream_idle_timeout_ms(30000);
  if (limits->max_streams_per_client() == 0) {
    limits->set_max_streams_per_client(limits->max_concurrent_streams());
  }
  if (limits->max_concurrent_unary() == 0) limits->set_max_concurrent_unary(64);
  if (limits->data_path_concurrency() == 0) {
    // One step per core: fewer serialize a shared-memory step that waits on
    // the SSD tier behind the others, more let shared-memory workers crowd
    // out gRPC ones; docs/benchmarks.md, "Both data paths at once", has the
    // measurements behind it.
    limits->set_data_path_concurrency(std::max(1u, std::thread::hardware_concurrency()));
  }
  if (limits->grpc_memory_quota_bytes() == 0) {
    limits->set_grpc_memory_quota_bytes(uint64_t{1} << 30);
  }
  if (limits->keepalive_time_ms() == 0) limits->set_keepalive_time_ms(30000);
  if (limits->keepalive_timeout_ms() == 0) limits->set_keepalive_timeout_ms(10000);

  v1::HostTierConfig* host = c->mutable_host_tier();
  if (host->capacity_bytes() == 0) host->set_capacity_bytes(uint64_t{1} << 30);
  if (host->slab_bytes() == 0) host->set_slab_bytes(uint64_t{4} << 20);
  if (!host->has_append_staging_fraction()) host->set_append_staging_fraction(0.03125);
  if (!host->has_metadata_fraction()) host->set_metadata_fraction(0.125);
  if (!host->has_high_watermark()) host->set_high_watermark(0.98);
  if (host->min_class_bytes() == 0) host->set_min_class_bytes(64);
  if (!host->has_low_watermark()) host->set_low_watermark(0.96);
  if (!host->has_compaction_interval_ms()) host->set_compaction_interval_ms(0);
  if (!host->has_compaction_max_span_occupancy()) host->set_compaction_max_span_occupancy(0.5);
  if (host->compaction_max_bytes_per_pass() == 0) {
    host->set_compaction_max_bytes_per_pass(uint64_t{64} << 20);
  }
  if (!host->has_thread_cache_bytes()) host->set_thread_cache_bytes(uint64_t{256} << 10);

  v1::SsdTierConfig* ssd = c->mutable_ssd_tier();
  if (ssd->capacity_bytes() == 0) ssd->set_capacity_bytes(uint64_t{16} << 30);
  if (ssd->region_bytes() == 0) ssd->set_region_bytes(uint64_t{16} << 20);
  if (!ssd->has_direct_io()) ssd->set_direct_io(true);
  if (ssd->io_engine().empty()) ssd->set_io_engine("auto");
  if (ssd->io_threads() == 0) ssd->set_io_threads(4);
  if (ssd->admit_min_references() == 0) ssd->set_admit_min_references(1);
  if (!ssd->has_promote_on_fetch()) ssd->set_promote_on_fetch(true);
  if (ssd->on_open_failure().empty()) ssd->set_on_open_failure("refuse");
  if (!ssd->has_staging_cache_bytes()) ssd->set_staging_cache_bytes(uint64_t{8} << 20);

  v1::MemoryConfig* memory = c->mutable_memory();
  if (!memory->has_mmap_threshold_bytes()) memory->set_mmap_threshold_bytes(uint64_t{64} << 10);
  if (!memory->has_malloc_arena_max()) memory->set_malloc_arena_max(4);
  if (!memory->has_trim_interval_ms()) memory->set_trim_interval_ms(1000);

  v1::GpuTierConfig* gpu = c->mutable_gpu_tier();
  if (gpu->capacity_bytes() == 0) gpu->set_capacity_bytes(uint64_t{8} << 30);
  if (gpu->slab_bytes() == 0) gpu->set_slab_bytes(uint64_t{8} << 20);
  if (gpu->min_block_bytes() == 0) gpu->set_min_block_bytes(uint64_t{64} << 10);
  if (gpu->arena_bytes() == 0) {
    const uint64_t arena = std::min(uint64_t{1} << 30, gpu->capacity_bytes());
    gpu->set_arena_bytes(std::max(gpu->slab_bytes(), arena - arena % gpu->slab_bytes()));
  }
  if (!gpu->has_high_watermark()) gpu->set_high_watermark(0.95);
  if (!gpu->has_low_watermark()) gpu->set_low_watermark(0.85);
  if (gpu->on_unavailable().empty()) gpu->set_on_unavailable("refuse");
  if (!gpu->has_pin_host_memory()) gpu->set_pin_host_memory(true);

  v1::RemoteTierConfig* remote = c->mutable_remote_tier();
  if (remote->connect_timeout_ms() == 0) remote->set_connect_timeout_ms(200);
  if (remote->io_timeout_ms() == 0) remote->set_io_timeout_ms(500);
  if (remote->max_redirects() == 0) remote->set_max_redirects(5);
  if (remote->write_queue_blocks() == 0) remote->set_write_queue_blocks(1024);
  if (remote->write_batch_blocks() == 0) remote->set_write_batch_blocks(32);
  if (remote->breaker_failures() == 0) remote->set_breaker_failures(3);
  if (remote->breaker_cooldown_ms() == 0) remote->set_breaker_cooldown_ms(1000);
  if (remote->share_queue() == 0) remote->set_share_queue(256);
  if (remote->discover_queue() == 0) remote->set_discover_queue(64);
  if (remote->max_discover_blocks() == 0) remote->set_max_discover_blocks(256);
  if (remote->batch_deadline_ms() == 0) remote->set_batch_deadline_ms(1000);

  v1::CheckpointConfig* ckpt = c->mutable_checkpoint();
  if (!ckpt->has_interval_seconds()) ckpt->set_interval_seconds(300);
  if (ckpt->keep() == 0) ckpt->set_keep(3);
  if (ckpt->full_every() == 0) ckpt->set_full_every(8);
  if (!ckpt->has_zstd_level()) ckpt->set_zstd_level(1);
  if (!ckpt->has_restore_on_start()) ckpt->set_restore_on_start(true);
  if (!ckpt->has_on_shutdown()) ckpt->set_on_shutdown(true);
  if (!ckpt->has_ssd_retained_share()) ckpt->set_ssd_retained_share(0.1);

  v1::StatusPageConfig* status_page = c->mutable_status_page();
  if (!status_page->has_enabled()) status_page->set_enabled(true);
  v1::TlsConfig* tls = c->mutable_security()->mutable_tls();
  if (tls->reload_interval_seconds() == 0) tls->set_reload_interval_seconds(10);
  if (!c->security().has_require_block_checksums()) {
    c->mutable_security()->set_require_block_checksums(true);
  }
  if (status_page->recent_events() == 0) status_page->set_recent_events(50);

  v1::ShmConfig* shm = c->mutable_shm();
  if (shm->max_connections() == 0) shm->set_max_connections(256);
  if (shm->max_regions_per_connection() == 0) shm->set_max_regions_per_connection(64);
  if (shm->max_region_bytes() == 0) shm->set_max_region_bytes(uint64_t{64} << 30);
  if (shm->parallel_copy_min_bytes() == 0) shm->set_parallel_copy_min_bytes(uint64_t{8} << 20);
  if (shm->hello_timeout_ms() == 0) shm->set_hello_timeout_ms(5000);
  if (shm->io_timeout_ms() == 0) shm->set_io_timeout_ms(30000);
  if (shm->drain_timeout_ms() == 0) shm->set_drain_timeout_ms(5000);
  if (shm->max_mappings() == 0) shm->set_max_mappings(16384);
  if (shm->max_mapped_bytes() == 0) shm->set_max_mapped_bytes(uint64_t{16} << 40);
  // A tenant's default share: a quarter of the default daemon-wide cap, never
  // more than the daemon-wide cap in force.
  if (shm->max_tenant_mappings() == 0) {
    shm->set_max_tenant_mappings(std::min<uint32_t>(4096, shm->max_mappings()));
  }
  if (shm->max_tenant_mapped_bytes() == 0) {
    shm->set_max_tenant_mapped_bytes(
        std::min<uint64_t>(uint64_t{4} << 40, shm->max_mapped_bytes()));
  }

  v1::CacheConfig* cache = c->mutable_cache();
  if (cache->eviction_policy().empty()) cache->set_eviction_policy("lru_k");
  v1::LruKConfig* lru_k = cache->mutable_lru_k();
  if (!lru_k->has_correlated_period_ms()) lru_k->set_correlated_period_ms(1000);
  if (!lru_k->has_retained_history()) lru_k->set_retained_history(65536);
  if (!lru_k->has_fewer_than_k_penalty_ms()) lru_k->set_fewer_than_k_penalty_ms(600000);

  if (c->logging().level().empty()) c->mutable_logging()->set_level("info");
  if (c->logging().format().empty()) c->mutable_logging()->set_format("text");
  if (c->logging().migration_log_max_bytes() == 0) {
    c->mutable_logging()->set_migration_log_max_bytes(uint64_t{16} << 20);
  }
  if (c->drain_timeout_seconds() == 0) c->set_drain_timeout_seconds(10);

  v1::ImportanceConfig* imp = c->mutable_importance();
  if (imp->default_mode().empty()) imp->set_default_mode("off");
  if (!imp->has_alpha()) imp->set_alpha(0.6f);
  if (!imp->has_beta()) imp->set_beta(0.3f);
  if (!imp->has_gamma()) imp->set_gamma(0.1f);
  if (!imp->has_sink_tokens()) imp->set_sink_tokens(4);
  if (!imp->has_recent_window()) imp->set_recent_window(64);
  if (imp->decay_tau() == 0) imp->set_decay_tau(256);
  if (imp->target_mass() == 0) imp->set_target_mass(0.95);
  if (imp->target_bytes() == 0) imp->set_target_bytes(0.37);
  if (imp->activity_half_life_seconds() == 0) imp->set_activity_half_life_seconds(600);
  if (imp->cold_after_seconds() == 0) imp->set_cold_after_seconds(300);
  if (imp->pressure_watermark() == 0) imp->set_pressure_watermark(0.85);
  if (imp->compaction_interval_ms() == 0) imp->set_compaction_interval_ms(1000);
  if (imp->max_blocks_per_pass() == 0) imp->set_max_blocks_per_pass(256);
  if (!imp->has_calibration_interval_seconds()) imp->set_calibration_interval_seconds(1800);
  if (imp->calibration_max_step() == 0) imp->set_calibration_max_step(0.05f);
  if (imp->calibration_min_samples() == 0) imp->set_calibration_min_samples(256);
}

v1::ServerConfig DefaultConfig() {
  v1::ServerConfig config;
  ApplyDefaults(&config);
  return config;
}

absl::StatusOr<v1::ServerConfig> ParseConfigJson(std::string_view json) {
  v1::ServerConfig config;
  google::protobuf::util::JsonParseOptions options;
  options.ignore_unknown_fields = false;
  auto status = google::protobuf::util::JsonStringToMessage(
      google::protobuf::StringPiece(json.data(), json.size()), &config, options);
  if (!status.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("config: ", status.message().as_string()));
  }
  ApplyDefaults(&config);
  return config;
}

absl::StatusOr<v1::ServerConfig> LoadConfigFile(const std::string& path) {
  std::ifstream in(path);
  if (!in) return absl::NotFoundError(absl::StrCat("config file ", path, " cannot be read"));
  std::stringstream text;
  text << in.rdbuf();
  auto config = ParseConfigJson(text.str());
  if (!config.ok()) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": ", config.status().message()));
  }
  return config;
}

absl::Status ValidateConfig(const v1::ServerConfig& c) {
  const v1::LimitsConfig& l = c.limits();
  if (auto s =
          CheckRange("limits.max_message_bytes", l.max_message_bytes(), 1 << 16, uint64_t{1} << 30);
      !s.ok()) {
    return s;
  }
  if (auto s = CheckRange("limits.max_tokens_per_request", l.max_tokens_per_request(), 16,
                          uint64_t{1} << 24);
      !s.ok()) {
    return s;
  }
  if (auto s = CheckRange("limits.max_concurrent_streams", l.max_concurrent_streams(), 1, 100000);
      !s.ok()) {
    return s;
  }
  // A fetch chunk plus its worst-case header must fit one message.
  if (auto s = CheckRange("limits.fetch_chunk_bytes", l.fetch_chunk_bytes(), 4096,
                          l.max_message_bytes() - kFetchHeaderRoom);
      !s.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat(s.message(), " (limits.max_message_bytes less ", kFetchHeaderRoom,
                     " bytes for the largest chunk header, a pruned block's kept_tokens)"));
  }
  if (auto s = CheckRange("limits.max_lease_ttl_ms", l.max_lease_ttl_ms(), 1, kMaxLeaseTtlMs);
      !s.ok()) {
    return absl::InvalidArgumentError(absl::StrCat(s.message(), " (at most 24 hours)"));
  }
  if (auto s = CheckRange("limits.default_lease_ttl_ms", l.default_lease_ttl_ms(), 1,
                          l.max_lease_ttl_ms());
      !s.ok()) {
    return s;
  }
  KVCACHE_RETURN_IF_ERROR(CheckRange("limits.max_models", l.max_models(), 1, 1 << 20));
  KVCACHE_RETURN_IF_ERROR(CheckRange("limits.max_leases", l.max_leases(), 1, 1 << 24));
  if (auto s = CheckRange("limits.max_lease_tokens", l.max_lease_tokens(),
                          l.max_tokens_per_request(), uint64_t{1} << 34);
      !s.ok()) {
    return s;
  }
  if (auto s = CheckRange("limits.max_fetch_heap_bytes", l.max_fetch_heap_bytes(), 4096,
                          uint64_t{1} << 40);
      !s.ok()) {
    return s;
  }
  if (auto s = CheckRange("limits.max_protected_ranges", l.max_protected_ranges(), 1, 1 << 20);
      !s.ok()) {
    return s;
  }
  if (auto s =
          CheckRange("limits.stream_idle_timeout_ms", l.stream_idle_timeout_ms(), 100, 3600000);
      !s.ok()) {
    return s;
  }
  if (auto s = CheckRange("limits.max_streams_per_client", l.max_streams_per_client(), 1,
                          l.max_concurrent_streams());
      !s.ok()) {
    return s;
  }
  if (auto s = CheckRange("limits.max_concurrent_unary", l.max_concurrent_unary(), 1, 100000);
      !s.ok()) {
    return s;
  }
  if (auto s = CheckRange("limits.data_path_concurrency", l.data_path_concurrency(), 1, 1024);
      !s.ok()) {
    return s;
  }
  // gRPC must be able to buffer at least one largest message.
  if (auto s = CheckRange("limits.grpc_memory_quota_bytes", l.grpc_memory_quota_bytes(),
                          l.max_message_bytes(), uint64_t{1} << 50);
      !s.ok()) {
    return s;
  }
  if (auto s = CheckRange("limits.keepalive_time_ms", l.keepalive_time_ms(), 1000, 86400000);
      !s.ok()) {
    return s;
  }
  if (auto s = CheckRange("limits.keepalive_timeout_ms", l.keepalive_timeout_ms(), 1000, 3600000);
      !s.ok()) {
    return s;
  }

  const v1::HostTierConfig& h = c.host_tier();
  if (auto s = CheckRange("host_tier.slab_bytes", h.slab_bytes(), 64 << 10, uint64_t{1} << 30);
      !s.ok()) {
    return s;
  }
  if (!std::has_single_bit(h.slab_bytes())) {
    return absl::InvalidArgumentError(
        absl::StrCat("host_tier.slab_bytes is ", h.slab_bytes(), "; it must be a power of two"));
  }
  if (auto s = CheckRange("host_tier.capacity_bytes", h.capacity_bytes(), h.slab_bytes(),
                          uint64_t{1} << 50);
      !s.ok()) {
    return s;
  }
  if (!(h.append_staging_fraction() >= 0 && h.append_staging_fraction() <= 0.5)) {
    return absl::InvalidArgumentError(absl::StrCat("host_tier.append_staging_fraction is ",
                                                   h.append_staging_fraction(),
                                                   "; it must be in [0, 0.5]"));
  }
  if (!(h.metadata_fraction() >= 0 && h.metadata_fraction() <= 1)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "host_tier.metadata_fraction is ", h.metadata_fraction(), "; it must be in [0, 1]"));
  }
  if (!std::has_single_bit(h.min_class_bytes()) || h.min_class_bytes() < 64 ||
      h.min_class_bytes() > h.slab_bytes()) {
    return absl::InvalidArgumentError(
        absl::StrCat("host_tier.min_class_bytes is ", h.min_class_bytes(),
                     "; it must be a power of two from 64 to slab_bytes (", h.slab_bytes(), ")"));
  }
  if (!(h.low_watermark() > 0 && h.low_watermark() <= h.high_watermark() &&
        h.high_watermark() <= 1)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "host_tier.low_watermark (", h.low_watermark(), ") and high_watermark (",
        h.high_watermark(), ") must satisfy 0 < low_watermark <= high_watermark <= 1"));
  }
  if (h.compaction_interval_ms() != 0) {
    if (auto s =
            CheckRange("host_tier.compaction_interval_ms", h.compaction_interval_ms(), 10, 3600000);
        !s.ok()) {
      return s;
    }
  }
  if (!(h.compaction_max_span_occupancy() >= 0 && h.compaction_max_span_occupancy() <= 1)) {
    return absl::InvalidArgumentError(absl::StrCat("host_tier.compaction_max_span_occupancy is ",
                                                   h.compaction_max_span_occupancy(),
                                                   "; it must be in [0, 1]"));
  }
  if (auto s = CheckRange("host_tier.compaction_max_bytes_per_pass",
                          h.compaction_max_bytes_per_pass(), 1, uint64_t{1} << 40);
      !s.ok()) {
    return s;
  }
  if (auto s =
          CheckRange("host_tier.thread_cache_bytes", h.thread_cache_bytes(), 0, uint64_t{16} << 20);
      !s.ok()) {
    return s;
  }
  KVCACHE_RETURN_IF_ERROR(ValidateSsdTier(c.ssd_tier()));
  KVCACHE_RETURN_IF_ERROR(ValidateTierList(c));
  KVCACHE_RETURN_IF_ERROR(ValidateMemory(c.memory()));
  KVCACHE_RETURN_IF_ERROR(ValidateGpuTier(c.gpu_tier()));
  KVCACHE_RETURN_IF_ERROR(ValidateCheckpoint(c.checkpoint()));
  KVCACHE_RETURN_IF_ERROR(ValidateRemoteTier(c.remote_tier()));
  KVCACHE_RETURN_IF_ERROR(ValidateStatusPage(c.status_page()));
  const std::string& level = c.logging().level();
  if (level != "trace" && level != "debug" && level != "info" && level != "warn" &&
      level != "error") {
    return absl::InvalidArgumentError(absl::StrCat(
        "logging.level is \"", level, "\"; it must be trace, debug, info, warn or error"));
  }
  const std::string& format = c.logging().format();
  if (format != "text" && format != "logfmt" && format != "json") {
    return absl::InvalidArgumentError(
        absl::StrCat("logging.format is \"", format, "\"; it must be text, logfmt or json"));
  }
  const v1::ListenConfig& listen = c.listen();
  if (listen.tcp_address() == kDisabled && listen.unix_socket() == kDisabled) {
    return absl::InvalidArgumentError(
        "listen.tcp_address and listen.unix_socket are both \"none\"; enable at least one");
  }
  const v1::ShmConfig& shm = c.shm();
  if (auto s = CheckRange("shm.max_connections", shm.max_connections(), 1, 65536); !s.ok()) {
    return s;
  }
  if (auto s =
          CheckRange("shm.max_regions_per_connection", shm.max_regions_per_connection(), 1, 4096);
      !s.ok()) {
    return s;
  }
  if (auto s = CheckRange("shm.max_region_bytes", shm.max_region_bytes(), 4096, uint64_t{1} << 46);
      !s.ok()) {
    return s;
  }
  KVCACHE_RETURN_IF_ERROR(CheckRange("shm.copy_threads", shm.copy_threads(), 0, 64));
  KVCACHE_RETURN_IF_ERROR(CheckRange("shm.worker_threads", shm.worker_threads(), 0, 1024));
  if (auto s = CheckRange("shm.hello_timeout_ms", shm.hello_timeout_ms(), 100, 600000); !s.ok()) {
    return s;
  }
  if (auto s = CheckRange("shm.io_timeout_ms", shm.io_timeout_ms(), 100, 3600000); !s.ok()) {
    return s;
  }
  if (auto s = CheckRange("shm.drain_timeout_ms", shm.drain_timeout_ms(), 1, 600000); !s.ok()) {
    return s;
  }
  KVCACHE_RETURN_IF_ERROR(CheckRange("shm.max_mappings", shm.max_mappings(), 1, 1 << 20));
  if (auto s = CheckRange("shm.max_mapped_bytes", shm.max_mapped_bytes(), 4096, uint64_t{1} << 47);
      !s.ok()) {
    return s;
  }
  if (auto s =
          CheckRange("shm.max_tenant_mappings", shm.max_tenant_mappings(), 1, shm.max_mappings());
      !s.ok()) {
    return s;
  }
  if (auto s = CheckRange("shm.max_tenant_mapped_bytes", shm.max_tenant_mapped_bytes(), 4096,
                          shm.max_mapped_bytes());
      !s.ok()) {
    return s;
  }
  KVCACHE_RETURN_IF_ERROR(ValidateSecurity(c.security()));
  if (const std::string& secret = c.security().secret_file(); !secret.empty()) {
    std::string dir = c.checkpoint().dir();
    while (dir.size() > 1 && dir.back() == '/') dir.pop_back();
    if (!dir.empty() && absl::StartsWith(secret, dir + "/")) {
      return absl::InvalidArgumentError(absl::StrCat(
          "security.secret_file \"", secret, "\" is inside checkpoint.dir \"", dir,
          "\": the secret authenticates the checkpoints, so it must live outside their folder"));
    }
  }
  const v1::SecurityConfig& security = c.security();
  const bool secured = !security.tls().cert_file().empty() && !security.principals_file().empty();
  if (listen.tcp_address() != kDisabled && !IsLoopbackAddress(listen.tcp_address()) && !secured &&
      !listen.allow_insecure_remote()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "listen.tcp_address \"", listen.tcp_address(),
        "\" can be reached from other hosts without TLS (security.tls) and authentication "
        "(security.principals_file): anyone reaching it could read, evict and reconfigure every "
        "model's KV. Set both (docs/security.md), listen on 127.0.0.1 (workers on this host can "
        "also use the Unix socket), or set listen.allow_insecure_remote to true (flag "
        "--allow-insecure-remote) on a network you trust"));
  }
  if (auto s = CheckRange("drain_timeout_seconds", c.drain_timeout_seconds(), 1, 3600); !s.ok()) {
    return s;
  }
  KVCACHE_RETURN_IF_ERROR(ValidateCache(c.cache()));
  return ValidateImportance(c.importance());
}

double TenantShare(const v1::SecurityConfig& security) {
  if (security.tenant_limits().has_max_share()) return security.tenant_limits().max_share();
  return security.principals_file().empty() ? 1.0 : 0.5;
}

std::string SecretFilePath(const v1::ServerConfig& config) {
  if (!config.security().secret_file().empty()) return config.security().secret_file();
  std::string dir = config.checkpoint().dir();
  while (dir.size() > 1 && dir.back() == '/') dir.pop_back();
  if (dir.empty()) return "";
  return dir + ".secret";
}

std::string ConfigToJson(const v1::ServerConfig& config) {
  std::string out;
  google::protobuf::util::JsonPrintOptions options;
  options.add_whitespace = true;
  options.always_print_primitive_fields = true;
  options.preserve_proto_field_names = true;
  (void)google::protobuf::util::MessageToJsonString(config, &out, options);
  return out;
}

}  // namespace kvcache
