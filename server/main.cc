// kvcached: the KV-cache daemon.
//
// Builds the configuration (embedded defaults < --config file < flags),
// validates and logs it, creates the cache over its tiers (host memory and,
// when configured, SSD), starts the metrics endpoint, the shared-memory data
// plane and the gRPC server, runs the periodic work (lease expiry, importance
// compaction, weight calibration) and the tier migrator, and serves until
// SIGTERM or SIGINT, which drain in-flight calls (up to
// drain_timeout_seconds) and exit 0.
#include <grp.h>
#include <pthread.h>
#include <signal.h>
#include <spdlog/sinks/rotating_file_sink.h>
#include <spdlog/spdlog.h>

#include <CLI/CLI.hpp>
#include <atomic>
#include <cstdio>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "server/checkpoint/checkpoint_service.h"
#include "server/config/calibration_file.h"
#include "server/config/config.h"
#include "server/core/cache.h"
#include "server/core/eviction_policy.h"
#include "server/core/memory_breakdown.h"
#include "server/core/slab_pool.h"
#include "server/daemon_security.h"
#include "server/http/http_server.h"
#include "server/logging/logging.h"
#include "server/memory/malloc_tuning.h"
#include "server/memory/process_memory.h"
#include "server/metrics/metrics.h"
#include "server/rpc/fair_scheduler.h"
#include "server/rpc/rpc_tally.h"
#include "server/rpc/server.h"
#include "server/shm/shm_server.h"
#include "server/status/cache_status_source.h"
#include "server/status/event_log.h"
#include "server/status/status_page.h"
#include "server/tier/gpu_device_tier.h"
#include "server/tier/ssd_block_store.h"

#ifndef KVCACHE_VERSION
#define KVCACHE_VERSION "dev"
#endif

namespace kvcache {
namespace {

static_assert(kMaxFetchKeptTokens >= kMaxBlockTokens,
              "kFetchHeaderRoom must cover a pruned block's kept_tokens");

struct Flags {
  std::string config_path;
  std::string listen;
  std::string unix_socket;
  std::string shm_socket;
  std::string metrics_address;
  bool allow_insecure_remote = false;
  std::string principals_file;
  std::string secret_file;
  std::string tls_cert;
  std::string tls_key;
  std::string tls_client_ca;
  uint64_t capacity_bytes = 0;
  uint64_t slab_bytes = 0;
  std::string ssd_path;
  uint64_t ssd_capacity_bytes = 0;
  std::string checkpoint_dir;
  std::string gpu_tier;
  uint64_t gpu_capacity_bytes = 0;
  std::string log_level;
  std::string log_format;
  bool print_default_config = false;
};

// Flags override the file; an empty/zero flag leaves the file's value.
void ApplyFlags(const Flags& f, v1::ServerConfig* c) {
  if (!f.listen.empty()) c->mutable_listen()->set_tcp_address(f.listen);
  if (!f.unix_socket.empty()) c->mutable_listen()->set_unix_socket(f.unix_socket);
  if (!f.shm_socket.empty()) c->mutable_listen()->set_shm_socket(f.shm_socket);
  if (f.allow_insecure_remote) c->mutable_listen()->set_allow_insecure_remote(true);
  v1::SecurityConfig* security = c->mutable_security();
  if (!f.principals_file.empty()) security->set_principals_file(f.principals_file);
  if (!f.secret_file.empty()) security->set_secret_file(f.secret_file);
  if (!f.tls_cert.empty()) security->mutable_tls()->set_cert_file(f.tls_cert);
  if (!f.tls_key.empty()) security->mutable_tls()->set_key_file(f.tls_key);
  if (!f.tls_client_ca.empty()) security->mutable_tls()->set_client_ca_file(f.tls_client_ca);
  if (!f.metrics_address.empty()) c->mutable_listen()->set_metrics_address(f.metrics_address);
  if (f.capacity_bytes != 0) c->mutable_host_tier()->set_capacity_bytes(f.capacity_bytes);
  if (f.slab_bytes != 0) c->mutable_host_tier()->set_slab_bytes(f.slab_bytes);
  if (!f.ssd_path.empty()) c->mutable_ssd_tier()->set_path(f.ssd_path);
  if (f.ssd_capacity_bytes != 0) c->mutable_ssd_tier()->set_capacity_bytes(f.ssd_capacity_bytes);
  if (!f.checkpoint_dir.empty()) c->mutable_checkpoint()->set_dir(f.checkpoint_dir);
  if (!f.gpu_tier.empty()) c->mutable_gpu_tier()->set_kind(f.gpu_tier);
  if (f.gpu_capacity_bytes != 0) c->mutable_gpu_tier()->set_capacity_bytes(f.gpu_capacity_bytes);
  if (!f.log_level.empty()) c->mutable_logging()->set_level(f.log_level);
  if (!f.log_format.empty()) c->mutable_logging()->set_format(f.log_format);
}

std::string Enabled(const std::string& value) { return value == kDisabled ? "" : value; }

// listen.shm_socket, or the gRPC socket's path + ".shm" when it is unset;
// empty when disabled.
std::string ShmSocketPath(const v1::ListenConfig& listen) {
  if (!listen.shm_socket().empty()) return Enabled(listen.shm_socket());
  const std::string grpc_socket = Enabled(listen.unix_socket());
  return grpc_socket.empty() ? "" : grpc_socket + ".shm";
}

// The signals the daemon handles by sigwait() on the main thread: SIGTERM and
// SIGINT stop it, SIGHUP reloads the principals file.
sigset_t HandledSignals() {
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGTERM);
  sigaddset(&signals, SIGINT);
  sigaddset(&signals, SIGHUP);  // reloads the principals file
  return signals;
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

// The eviction policy cache.eviction_policy names (validated: lru or lru_k).
std::unique_ptr<EvictionPolicy> EvictionPolicyFromConfig(const v1::CacheConfig& c, Clock* clock) {
  if (c.eviction_policy() == "lru") return NewLruPolicy();
  LruKOptions o;
  o.correlated_period = absl::Milliseconds(c.lru_k().correlated_period_ms());
  o.retained_history = c.lru_k().retained_history();
  return NewLruKPolicy(o, clock);
}

// Saves the weights calibration applied into `saved` and, when the config
// names a calibration file, writes it.
void PersistCalibration(const std::vector<CalibrationOutcome>& outcomes,
                        const v1::ImportanceConfig& config, v1::CalibratedWeights* saved) {
  bool changed = false;
  for (const CalibrationOutcome& c : outcomes) {
    if (!c.applied) continue;
    v1::CalibratedWeights::Model* entry = nullptr;
    for (auto& m : *saved->mutable_models()) {
      if (m.namespace_() == c.model.ns && m.model_id() == c.model.model_id) entry = &m;
    }
    if (entry == nullptr) {
      entry = saved->add_models();
      entry->set_namespace_(c.model.ns);
      entry->set_model_id(c.model.model_id);
    }
    entry->set_alpha(c.after.alpha);
    entry->set_beta(c.after.beta);
    entry->set_gamma(c.after.gamma);
    changed = true;
  }
  if (!changed || config.calibration_file().empty()) return;
  if (absl::Status s = SaveCalibrationFile(config.calibration_file(), *saved); !s.ok()) {
    spdlog::warn("calibration: {}", s.ToString());
  }
}

// Runs the periodic work until `stopping`: lease expiry every second,
// compaction, pool compaction and calibration at their configured intervals.
void RunMaintenance(Cache& cache, const v1::ImportanceConfig& config,
                    const v1::HostTierConfig& host, v1::CalibratedWeights calibrated,
                    const std::atomic<bool>& stopping) {
  const absl::Duration compaction_every = absl::Milliseconds(config.compaction_interval_ms());
  const absl::Duration pool_compaction_every = absl::Milliseconds(host.compaction_interval_ms());
  const PoolCompactionOptions pool_compaction{
      .plan = {.max_span_occupancy = host.compaction_max_span_occupancy(),
               .max_bytes = host.compaction_max_bytes_per_pass()}};
  absl::Time next_pool_compaction = absl::Now() + pool_compaction_every;
  const absl::Duration calibration_every = absl::Seconds(config.calibration_interval_seconds());
  absl::Time next_expiry = absl::Now();
  absl::Time next_compaction = absl::Now() + compaction_every;
  absl::Time next_calibration = absl::Now() + calibration_every;
  while (!stopping.load()) {
    const absl::Time now = absl::Now();
    if (now >= next_expiry) {
      cache.ExpireLeases();
      next_expiry = now + absl::Seconds(1);
    }
    if (now >= next_compaction) {
      const CompactionResult r = cache.Compact();
      if (r.corrupt_blocks > 0) {
        spdlog::error(
            "compaction: {} blocks did not match their checksums (memory corruption) and were "
            "dropped",
            r.corrupt_blocks);
      }
      if (r.compressed_blocks > 0) {
        spdlog::info(
            "compaction: {} blocks compressed ({} INT8 and {} pruned tokens), {} bytes "
            "saved{}",
            r.compressed_blocks, r.int8_tokens, r.pruned_tokens, r.bytes_saved,
            r.under_pressure ? ", under memory pressure" : "");
      }
      next_compaction = absl::Now() + compaction_every;
    }
    if (pool_compaction_every > absl::ZeroDuration() && now >= next_pool_compaction) {
      const PoolCompactionResult r = cache.CompactPool(pool_compaction);
      if (r.mismatched_blocks > 0) {
        spdlog::error(
            "pool compaction: {} blocks did not match their checksums (memory corruption); "
            "left in place",
            r.mismatched_blocks);
      }
      if (r.moved_blocks > 0) {
        spdlog::debug("pool compaction: {} blocks ({} bytes) moved out of {} sparse spans",
                      r.moved_blocks, r.moved_bytes, r.draining_spans);
      }
      next_pool_compaction = absl::Now() + pool_compaction_every;
    }
    if (calibration_every > absl::ZeroDuration() && now >= next_calibration) {
      const std::vector<CalibrationOutcome> outcomes = cache.Calibrate();
      for (const CalibrationOutcome& c : outcomes) {
        spdlog::info(
            "calibration of {}: {} samples, weights {:.3f}/{:.3f}/{:.3f} -> {:.3f}/{:.3f}/{:.3f} "
            "(fit {:.3f}/{:.3f}/{:.3f}), score-attention correlation {:.3f} -> {:.3f}{}",
            c.model.ToString(), c.samples, c.before.alpha, c.before.beta, c.before.gamma,
            c.after.alpha, c.after.beta, c.after.gamma, c.fitted.alpha, c.fitted.beta,
            c.fitted.gamma, c.correlation_before, c.correlation_after,
            c.applied ? "" : " (not applied: too few samples or no fit)");
      }
      PersistCalibration(outcomes, config, &calibrated);
      next_calibration = absl::Now() + calibration_every;
    }
    absl::SleepFor(absl::Milliseconds(100));
  }
}

// The migration log's logger (a rotating file), or null when it is off.
std::shared_ptr<spdlog::logger> OpenMigrationLog(const v1::LoggingConfig& c) {
  if (c.migration_log().empty()) return nullptr;
  try {
    auto log = spdlog::rotating_logger_mt(kMigrationLoggerName, c.migration_log(),
                                          c.migration_log_max_bytes(), /*max_files=*/3);
    log->set_pattern("%Y-%m-%dT%H:%M:%S.%fZ %v", spdlog::pattern_time_type::utc);
    log->flush_on(spdlog::level::info);
    return log;
  } catch (const spdlog::spdlog_ex& e) {
    spdlog::error("migration log {}: {}; moves are not logged", c.migration_log(), e.what());
    return nullptr;
  }
}

// Writes the moves since the last call to the migration log and the status
// page's event log.
void WriteMoves(Cache& cache, spdlog::logger* log, EventLog* events) {
  for (const MoveRecord& m : cache.DrainMoves()) {
    if (events != nullptr) events->AddMove(m);
    if (log == nullptr) continue;
    log->info("key={:016x} from={} to={} reason={} bytes={} us={}", m.key, m.from, m.to, m.reason,
              m.bytes, absl::ToInt64Microseconds(m.took));
  }
}

// Demotes cold host blocks to the lower tier whenever the host is past its
// high watermark, drops GPU tier copies past its own, and writes the moves to
// the migration log, until `stopping`.
void RunMigrator(Cache& cache, spdlog::logger* migration_log, EventLog* events,
                 const std::atomic<bool>& stopping) {
  while (!stopping.load()) {
    WriteMoves(cache, migration_log, events);
    if (!cache.NeedsMigration()) {
      absl::SleepFor(absl::Milliseconds(20));
      continue;
    }
    const absl::Time start = absl::Now();
    const MigrationResult r = cache.Migrate();
    spdlog::debug(
        "migration: {} blocks ({} bytes) demoted to ssd, {} clean host copies dropped, {} "
        "evicted ({} not admitted), {} gpu copies dropped in {:.1f} ms",
        r.demoted_blocks, r.demoted_bytes, r.clean_drops, r.evicted_blocks, r.refused_blocks,
        r.device_drops, absl::ToDoubleMilliseconds(absl::Now() - start));
    if (r.demoted_blocks + r.clean_drops + r.evicted_blocks + r.device_drops == 0) {
      absl::SleepFor(absl::Milliseconds(20));  // nothing movable now (all leased or in use)
    }
  }
  WriteMoves(cache, migration_log, events);
}

// The SSD tier of ssd_tier, or null when it is off. An error when it cannot be
// opened and on_open_failure is "refuse".
absl::StatusOr<std::shared_ptr<BlockStore>> OpenSsdTier(const v1::SsdTierConfig& c) {
  if (c.path().empty()) return nullptr;
  SsdStoreOptions options{.path = c.path(),
                          .capacity_bytes = c.capacity_bytes(),
                          .region_bytes = c.region_bytes(),
                          .direct_io = c.direct_io(),
                          .engine = c.io_engine() == "io_uring"  ? SsdIoEngine::kIoUring
                                    : c.io_engine() == "threads" ? SsdIoEngine::kThreadPool
                                                                 : SsdIoEngine::kAuto,
                          .io_threads = c.io_threads(),
                          .staging_cache_bytes = c.staging_cache_bytes(),
                          .epoch = static_cast<uint64_t>(absl::ToUnixNanos(absl::Now()))};
  absl::StatusOr<std::shared_ptr<BlockStore>> store = OpenSsdBlockStore(options);
  if (!store.ok()) {
    if (c.on_open_failure() == "skip") {
      spdlog::error("ssd tier: {}; running without it (ssd_tier.on_open_failure is skip)",
                    store.status().ToString());
      return nullptr;
    }
    return absl::Status(store.status().code(),
                        absl::StrCat("ssd tier at ", c.path(), ": ", store.status().message()));
  }
  const SsdStoreStats s = SsdStatsOf(**store);
  spdlog::info("ssd tier: {} bytes at {}, {} I/O, engine {}", s.capacity_bytes, c.path(),
               s.direct_io ? "direct" : "buffered (the file system refused O_DIRECT)", s.engine);
  return store;
}

// The GPU tier of gpu_tier, or null when it is off. An error when its device
// is not usable and on_unavailable is "refuse".
absl::StatusOr<std::shared_ptr<DeviceTier>> OpenGpuTier(const v1::GpuTierConfig& c) {
  if (c.kind().empty()) return nullptr;
  absl::StatusOr<std::shared_ptr<DeviceTier>> tier =
      OpenGpuDeviceTier({.kind = c.kind(),
                         .device = static_cast<int>(c.device()),
                         .capacity_bytes = c.capacity_bytes(),
                         .arena_bytes = c.arena_bytes(),
                         .slab_bytes = c.slab_bytes(),
                         .min_block_bytes = c.min_block_bytes()});
  if (!tier.ok()) {
    if (c.on_unavailable() == "skip") {
      spdlog::error("{}; running without it (gpu_tier.on_unavailable is skip)",
                    tier.status().ToString());
      return nullptr;
    }
    return tier.status();
  }
  spdlog::info("gpu tier: {} bytes of {} ({}), slabs of {} bytes", c.capacity_bytes(), c.kind(),
               (*tier)->device_description(), c.slab_bytes());
  return tier;
}

CheckpointCounters CheckpointCountersOf(const checkpoint::CheckpointServiceStatus& s) {
  CheckpointCounters c{.enabled = true,
                       .ok = s.ok,
                       .failed = s.failed,
                       .in_progress = s.in_progress,
                       .restore_state = std::string(checkpoint::RestoreStateName(s.restore.state)),
                       .restored_blocks = s.restore.restored_blocks,
                       .restore_skipped_blocks = s.restore.present_blocks +
                                                 s.restore.orphan_blocks + s.restore.lost_blocks +
                                                 s.restore.skipped_blocks,
                       .restore_failed_checkpoints = s.restore.failed_checkpoints,
                       .reattached_copies = s.restore.reattached_copies,
                       .reattach_failures = s.restore.reattach_failures};
  c.started_unix_seconds = absl::ToDoubleSeconds(s.started - absl::UnixEpoch());
  if (s.last.has_value()) {
    c.last_success_unix_seconds = absl::ToDoubleSeconds(s.last_time - absl::UnixEpoch());
    c.last_duration_seconds = absl::ToDoubleSeconds(s.last->duration);
    c.last_bytes = s.last->data_bytes;
  }
  return c;
}

// The status page's event log, fed the default logger's warnings and errors
// from now on (and the tier moves, by the migrator). Called before any thread
// that logs has started: a logger's sinks are not guarded.
std::shared_ptr<EventLog> AttachEventLog(const v1::StatusPageConfig& c) {
  auto events = std::make_shared<EventLog>(c.recent_events());
  spdlog::default_logger()->sinks().push_back(NewEventLogSink(events));
  return events;
}

// What the status page says of this daemon.
StatusIdentity StatusIdentityOf(const v1::ListenConfig& listen) {
  StatusIdentity id{.version = KVCACHE_VERSION,
                    .git_revision = KVCACHE_GIT_REVISION,
                    .start_time = absl::Now(),
                    .listen_addresses = {},
                    .cuda_built = KVCACHE_CUDA_BUILT != 0};
  if (const std::string tcp = Enabled(listen.tcp_address()); !tcp.empty()) {
    id.listen_addresses.push_back(tcp);
  }
  if (const std::string socket = Enabled(listen.unix_socket()); !socket.empty()) {
    id.listen_addresses.push_back("unix:" + socket);
  }
  if (const std::string shm = ShmSocketPath(listen); !shm.empty()) {
    id.listen_addresses.push_back("shm:" + shm);
  }
  return id;
}

// The read-only HTTP endpoint on listen.metrics_address: /metrics and, with
// status_page.enabled, the status pages. Null when the address is "none".
absl::StatusOr<std::unique_ptr<HttpServer>> StartHttpEndpoint(
    const v1::ServerConfig& config, const Metrics& metrics, AccessControl* access,
    std::shared_ptr<const StatusSource> status) {
  const std::string address = Enabled(config.listen().metrics_address());
  if (address.empty()) return nullptr;
  absl::StatusOr<std::unique_ptr<HttpServer>> server = HttpServer::Start({.address = address});
  if (!server.ok()) {
    return absl::Status(server.status().code(),
                        absl::StrCat("listen.metrics_address: ", server.status().message()));
  }
  metrics.ServeOn(**server);
  spdlog::info("metrics on http://{}/metrics", address);
  if (config.status_page().enabled()) {
    StatusPageOptions options{.show_tokens = config.status_page().show_tokens()};
    if (access != nullptr && access->enabled()) {
      // Per-tenant detail for admins of every namespace only (docs/security.md).
      options.may_see_detail = [access](const HttpRequest& request) {
        return access->Admit(CredentialsOfAuthorization(request.authorization), "StatusPageDetail")
            .ok();
      };
    }
    ServeStatusPages(**server, std::move(status), std::move(options));
    spdlog::info("status page on http://{}/status{}{}", address,
                 config.status_page().show_tokens() ? " (showing token ids)" : "",
                 access != nullptr && access->enabled()
                     ? " (per-tenant detail for admins' bearer tokens only)"
                     : "");
  }
  return server;
}

int Serve(const v1::ServerConfig& config) {
  sigset_t signals = HandledSignals();
  if (absl::Status s = SetUpLogging(config.logging()); !s.ok()) {
    std::fprintf(stderr, "kvcached: %s\n", std::string(s.message()).c_str());
    return 2;
  }
  spdlog::info("kvcached {} starting with config:\n{}", KVCACHE_VERSION, ConfigToJson(config));
  // The allocator's tuning before any other thread exists (docs/operations.md,
  // "Memory"); then a thread gives the free memory it keeps back to the OS.
  const v1::MemoryConfig& memory = config.memory();
  if (absl::Status s = ApplyMallocTuning({.mmap_threshold_bytes = memory.mmap_threshold_bytes(),
                                          .arena_max = memory.malloc_arena_max()});
      !s.ok()) {
    spdlog::warn("memory: {}; running with glibc's defaults", s.ToString());
  }
  MallocTrimmer trimmer(absl::Milliseconds(memory.trim_interval_ms()));

  // The GPU tier first: the host pool registers its memory with its device.
  absl::StatusOr<std::shared_ptr<DeviceTier>> gpu = OpenGpuTier(config.gpu_tier());
  if (!gpu.ok()) {
    spdlog::error("{}", gpu.status().ToString());
    return 2;
  }
  std::shared_ptr<HostMemoryRegistrar> pinner;
  if (*gpu != nullptr && config.gpu_tier().pin_host_memory()) {
    pinner = (*gpu)->HostPinner();
    spdlog::info("host tier: memory is page-locked with the gpu tier's device as it is mapped");
  }
  SlabPoolOptions pool_options{.capacity_bytes = config.host_tier().capacity_bytes(),
                               .slab_bytes = config.host_tier().slab_bytes(),
                               .min_class_bytes = config.host_tier().min_class_bytes()};
  auto pool = SlabPool::Create(pool_options, std::move(pinner));
  if (!pool.ok()) {
    spdlog::error("host tier: {}", pool.status().ToString());
    return 2;
  }
  v1::CalibratedWeights calibrated;
  if (const std::string& path = config.importance().calibration_file(); !path.empty()) {
    absl::StatusOr<v1::CalibratedWeights> loaded = LoadCalibrationFile(path);
    if (loaded.ok()) {
      calibrated = *std::move(loaded);
      spdlog::info("calibration: starting from the weights of {} models in {}",
                   calibrated.models_size(), path);
    } else if (!absl::IsNotFound(loaded.status())) {
      // The file only carries what calibration learned; it never keeps the
      // daemon down. The next save replaces it.
      spdlog::error(
          "calibration: ignoring the calibration file {}: {}; every model starts from the "
          "configured weights (importance.alpha/beta/gamma), and the file is replaced when "
          "calibration next saves",
          path, std::string(loaded.status().message()));
    }
  }
  absl::StatusOr<DaemonSecret> secret = LoadDaemonSecret(config);
  if (!secret.ok()) {
    spdlog::error("{}", secret.status().ToString());
    return 2;
  }
  const v1::LimitsConfig& limits = config.limits();
  CacheOptions cache_options{
      .max_tokens_per_request = limits.max_tokens_per_request(),
      .default_lease_ttl = absl::Milliseconds(limits.default_lease_ttl_ms()),
      .max_lease_ttl = absl::Milliseconds(limits.max_lease_ttl_ms()),
      .max_models = limits.max_models(),
      .max_leases = limits.max_leases(),
      .max_lease_tokens = limits.max_lease_tokens(),
      .append_staging_bytes =
          static_cast<uint64_t>(config.host_tier().append_staging_fraction() *
                                static_cast<double>(config.host_tier().capacity_bytes())),
      .max_metadata_bytes =
          static_cast<uint64_t>(config.host_tier().metadata_fraction() *
                                static_cast<double>(config.host_tier().capacity_bytes())),
      .max_protected_ranges = limits.max_protected_ranges(),
      .max_namespace_bytes = config.security().tenant_limits().max_cached_bytes(),
      .namespace_share = TenantShare(config.security()),
      .max_fetch_heap_bytes = limits.max_fetch_heap_bytes(),
      .importance = ImportanceFromConfig(config.importance()),
      .block_hash_keys = BlockHashKeysFrom(*secret)};
  for (const v1::CalibratedWeights::Model& m : calibrated.models()) {
    cache_options.importance.initial_weights[ModelKey{m.namespace_(), m.model_id()}] = {
        .alpha = m.alpha(), .beta = m.beta(), .gamma = m.gamma()};
  }
  absl::StatusOr<std::shared_ptr<BlockStore>> ssd = OpenSsdTier(config.ssd_tier());
  if (!ssd.ok()) {
    spdlog::error("{}", ssd.status().ToString());
    return 2;
  }
  const v1::SsdTierConfig& ssd_config = config.ssd_tier();
  cache_options.tiers = {.host_high_watermark = config.host_tier().high_watermark(),
                         .host_low_watermark = config.host_tier().low_watermark(),
                         .lower_admit_min_references = ssd_config.admit_min_references(),
                         .lower_write_bytes_per_second = ssd_config.max_write_bytes_per_second(),
                         .promote_on_fetch = ssd_config.promote_on_fetch(),
                         .device_high_watermark = config.gpu_tier().high_watermark(),
                         .device_low_watermark = config.gpu_tier().low_watermark()};
  cache_options.require_block_checksums = config.security().require_block_checksums();
  std::unique_ptr<EvictionPolicy> policy =
      EvictionPolicyFromConfig(config.cache(), SystemClock::Get());
  spdlog::info("eviction policy: {} (each tier ranks its blocks with its own)", policy->name());
  Cache cache(
      cache_options, *std::move(pool), std::move(policy), SystemClock::Get(), *ssd,
      *ssd != nullptr ? EvictionPolicyFromConfig(config.cache(), SystemClock::Get()) : nullptr,
      *gpu);

  // Checkpoints: before anything can write to the SSD tier, the checkpoint
  // to restore is chosen and its SSD copies re-attached; the rest of the
  // restore runs while the daemon serves.
  std::unique_ptr<checkpoint::CheckpointService> checkpoints;
  if (const v1::CheckpointConfig& c = config.checkpoint(); !c.dir().empty()) {
    // Checkpoints hold every tenant's prompts and KV: only the daemon's user
    // may enter their folder (created 0700; an existing one is checked).
    absl::Status private_dir = checkpoint::DefaultFileSystem()->CreateDir(c.dir());
    if (private_dir.ok()) private_dir = checkpoint::CheckPrivateDirectory(c.dir());
    if (!private_dir.ok()) {
      spdlog::error("checkpoints: {}", private_dir.ToString());
      return 2;
    }
    auto opened = checkpoint::CheckpointService::Open(
        &cache, checkpoint::DefaultFileSystem(),
        {.checkpointer = {.dir = c.dir(),
                          .keep = c.keep(),
                          .full_every = c.full_every(),
                          .zstd_level = c.zstd_level(),
                          .mac_key = secret->Derive("checkpoint-mac")},
         .interval = absl::Seconds(c.interval_seconds()),
         .restore_on_start = c.restore_on_start(),
         .lower_retained_share = c.ssd_retained_share(),
         .after_run = [&trimmer] { trimmer.RequestTrim(); }});
    if (!opened.ok()) {
      spdlog::error("checkpoints: {}", opened.status().ToString());
      return 2;
    }
    checkpoints = *std::move(opened);
    if (absl::Status s = checkpoints->PrepareRestore(); !s.ok()) {
      spdlog::error("checkpoints: {}", s.ToString());
      return 2;
    }
  }

  auto stats_source = [&cache, &checkpoints] {
    CacheStats stats = cache.GetStats();
    if (checkpoints != nullptr) stats.checkpoint = CheckpointCountersOf(checkpoints->Status());
    return stats;
  };
  std::unique_ptr<Metrics> metrics = Metrics::CreateUnexposed(stats_source);
  std::shared_ptr<EventLog> events = AttachEventLog(config.status_page());
  absl::StatusOr<DaemonSecurity> security = DaemonSecurity::Start(config);
  if (!security.ok()) {
    spdlog::error("{}", security.status().ToString());
    return 2;
  }
  // Admission of data-path steps from both front doors (fair_scheduler.h).
  // Shared with the metrics, which may scrape after the servers are gone; it
  // outlives both servers (declared before them).
  auto fair = std::make_shared<FairScheduler>(
      FairSchedulerOptions{.slots = limits.data_path_concurrency(), .threads = 2});
  metrics->AddCounterSource([fair](CounterVisitor& v) { fair->VisitCounters(v); });
  spdlog::info("data-path admission: {} steps at once (limits.data_path_concurrency)",
               limits.data_path_concurrency());
  // The daemon's memory, part by part (docs/operations.md, "Memory"): for the
  // metrics, the status page and GetStats. The shared-memory server is
  // started below; until then it counts no connections.
  std::unique_ptr<ShmServer> shm_server;
  std::atomic<const ShmServer*> shm_counted{nullptr};  // shm_server while it serves
  auto memory_source = [&cache, &checkpoints, &shm_counted, &trimmer,
                        capacity = config.host_tier().capacity_bytes()] {
    const CacheStats stats = cache.GetStats();
    MemoryInputs in{
        .malloc = ReadMallocStats(),
        .malloc_trims = trimmer.trims(),
        .capacity_bytes = capacity,
        .pool_reserved_bytes = stats.host_pool.reserved_bytes,
        .metadata_bytes = stats.metadata_bytes,
        .ssd_staging_bytes = stats.has_lower ? stats.lower_store.staging_bytes : 0,
        .checkpoint_writer_bytes = checkpoints != nullptr ? checkpoints->Status().writer_bytes : 0,
        .shm_connections = 0};
    if (const ShmServer* shm = shm_counted.load(); shm != nullptr) {
      in.shm_connections = static_cast<uint64_t>(shm->connections());
    }
    if (absl::StatusOr<ProcessMemory> process = ReadProcessMemory(); process.ok()) {
      in.process = *process;
    }
    return BreakDownMemory(in);
  };
  metrics->AddCounterSource(
      [memory_source](CounterVisitor& v) { memory_source().VisitCounters(v); });
  auto status_source = std::make_shared<CacheStatusSource>(
      &cache, StatusIdentityOf(config.listen()), ConfigToJson(config), events, stats_source);
  status_source->SetMemorySource(memory_source);
  auto http = StartHttpEndpoint(config, *metrics, security->access.get(), status_source);
  if (!http.ok()) {
    spdlog::error("{}", http.status().ToString());
    return 2;
  }

  // Every call is counted per method for GetStats (kvcachectl top) on its
  // way to the metrics.
  RpcTally rpc_tally(metrics.get());
  InflightCalls inflight;  // the calls DumpMemory lists; outlives both servers

  const v1::ListenConfig& listen = config.listen();
  int64_t socket_gid = -1;
  if (!listen.socket_group().empty()) {
    const group* g = ::getgrnam(listen.socket_group().c_str());
    if (g == nullptr) {
      spdlog::error("listen.socket_group \"{}\" is not a group on this host",
                    listen.socket_group());
      return 2;
    }
    socket_gid = g->gr_gid;
  }
  if (listen.allow_insecure_remote() && Enabled(listen.tcp_address()) != "" &&
      !IsLoopbackAddress(listen.tcp_address())) {
    spdlog::warn(
        "INSECURE: listening on {} with listen.allow_insecure_remote: nothing authenticates "
        "callers or encrypts traffic, so anyone who can reach this address can read, evict and "
        "reconfigure every model's KV. Use it only on a network you trust.",
        listen.tcp_address());
  }

  // The TCP port before any socket is touched; then the shared-memory data
  // plane, so that once gRPC answers it is up too.
  if (const std::string tcp = Enabled(config.listen().tcp_address()); !tcp.empty()) {
    if (absl::Status s = CheckTcpAddressFree(tcp); !s.ok()) {
      spdlog::error("{}", s.ToString());
      return 2;
    }
  }
  if (const std::string shm_socket = ShmSocketPath(config.listen()); !shm_socket.empty()) {
    const v1::ShmConfig& shm = config.shm();
    // The budget outlives the server: the metrics read it while they serve.
    auto budget = std::make_shared<MappingBudget>(
        MappingLimits{.max_mappings = shm.max_mappings(),
                      .max_bytes = shm.max_mapped_bytes(),
                      .max_owner_mappings = shm.max_tenant_mappings(),
                      .max_owner_bytes = shm.max_tenant_mapped_bytes()});
    metrics->AddCounterSource([budget](CounterVisitor& v) { budget->VisitCounters(v); });
    auto started = ShmServer::Start({.socket_path = shm_socket,
                                     .socket_gid = socket_gid,
                                     .max_connections = shm.max_connections(),
                                     .limits = {.max_regions = shm.max_regions_per_connection(),
                                                .max_region_bytes = shm.max_region_bytes(),
                                                .max_frame_bytes = limits.max_message_bytes()},
                                     .budget = budget,
                                     .hello_timeout = absl::Milliseconds(shm.hello_timeout_ms()),
                                     .io_timeout = absl::Milliseconds(shm.io_timeout_ms()),
                                     .drain_timeout = absl::Milliseconds(shm.drain_timeout_ms()),
                                     .copy_threads = shm.copy_threads(),
                                     .parallel_copy_min_bytes = shm.parallel_copy_min_bytes(),
                                     .inflight = &inflight,
                                     .access = security->access.get(),
                                     .fair = fair.get()},
                                    &cache, &rpc_tally);
    if (!started.ok()) {
      spdlog::error("{}", started.status().ToString());
      return 2;
    }
    shm_server = *std::move(started);
    shm_counted = shm_server.get();
    spdlog::info("serving the shared-memory data plane on {}", shm_socket);
  }

  GrpcServerOptions server_options{
      .tcp_address = Enabled(config.listen().tcp_address()),
      .unix_socket = Enabled(config.listen().unix_socket()),
      .socket_gid = socket_gid,
      .max_message_bytes = limits.max_message_bytes(),
      .grpc_memory_quota_bytes = limits.grpc_memory_quota_bytes(),
      .keepalive_time = absl::Milliseconds(limits.keepalive_time_ms()),
      .keepalive_timeout = absl::Milliseconds(limits.keepalive_timeout_ms()),
      .cache_service = {.fetch_chunk_bytes = limits.fetch_chunk_bytes(),
                        .max_concurrent_streams = limits.max_concurrent_streams(),
                        .max_streams_per_client = limits.max_streams_per_client(),
                        .max_concurrent_unary = limits.max_concurrent_unary(),
                        .stream_idle_timeout = absl::Milliseconds(limits.stream_idle_timeout_ms())},
      .identity = {.version = KVCACHE_VERSION,
                   .git_revision = KVCACHE_GIT_REVISION,
                   .start_time = absl::Now(),
                   .listen_addresses = {},
                   .cuda_built = KVCACHE_CUDA_BUILT != 0,
                   .shm_socket = shm_server ? shm_server->socket_path() : ""}};
  server_options.checkpoints = checkpoints.get();
  server_options.rpc_tally = &rpc_tally;
  server_options.inflight = &inflight;
  server_options.tls = security->ServedTls();
  server_options.access = security->access.get();
  server_options.memory = memory_source;
  server_options.cache_service.fair = fair.get();
  auto server = GrpcServer::Start(server_options, &cache, &rpc_tally);
  if (!server.ok()) {
    spdlog::error("{}", server.status().ToString());
    return 2;
  }
  for (const std::string& address : (*server)->listen_addresses()) {
    const bool tcp = !absl::StartsWith(address, "unix:");
    spdlog::info("serving kvcache.v1 on {}{}", address,
                 !tcp || !security->tls.enabled() ? ""
                 : security->tls.mutual()         ? " (mutual TLS)"
                                                  : " (TLS)");
  }

  if (checkpoints != nullptr) checkpoints->Start();
  std::atomic<bool> stopping{false};
  std::thread maintenance([&] {
    RunMaintenance(cache, config.importance(), config.host_tier(), std::move(calibrated), stopping);
  });
  std::thread migrator;
  std::shared_ptr<spdlog::logger> migration_log;
  if (*ssd != nullptr || *gpu != nullptr) {
    migration_log = OpenMigrationLog(config.logging());
    migrator =
        std::thread([&] { RunMigrator(cache, migration_log.get(), events.get(), stopping); });
  }

  int signal_number = 0;
  for (;;) {
    sigwait(&signals, &signal_number);
    if (signal_number != SIGHUP) break;
    security->Reload();
  }
  spdlog::info("received {}, draining for up to {} s", strsignal(signal_number),
               config.drain_timeout_seconds());
  (*server)->Shutdown(absl::Seconds(config.drain_timeout_seconds()));
  (*server)->Wait();
  if (shm_server) shm_server->Shutdown();
  stopping = true;
  maintenance.join();
  if (migrator.joinable()) migrator.join();
  // After the drain: the final checkpoint sees every committed append.
  if (checkpoints != nullptr) checkpoints->Shutdown(config.checkpoint().on_shutdown());
  server->reset();  // before the cache: in-flight fetches hold its blocks
  shm_counted = nullptr;
  shm_server.reset();
  spdlog::info("kvcached stopped");
  return 0;
}

}  // namespace
}  // namespace kvcache

int main(int argc, char** argv) {
  // Block the stop signals before any thread exists, so every thread inherits
  // the mask and only the main thread's sigwait() sees them.
  sigset_t signals = kvcache::HandledSignals();
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);
  // The distribution's Abseil checks every absl::Mutex (gRPC's included) for
  // lock-order cycles; that costs about 3% of the daemon's CPU under load.
  absl::SetMutexDeadlockDetectionMode(absl::OnDeadlockCycle::kIgnore);
  using kvcache::Flags;
  Flags flags;
  CLI::App app{
      "kvcached: a shared, tiered, prefix-aware KV cache daemon for LLM inference.\n"
      "Settings come from the embedded defaults, then --config, then the flags below."};
  app.add_option("-c,--config", flags.config_path, "JSON config file (kvcache.v1.ServerConfig)")
      ->check(CLI::ExistingFile);
  app.add_option("--listen", flags.listen,
                 "TCP address HOST:PORT, or 'none' (default 127.0.0.1:50051; an address other "
                 "hosts can reach needs --tls-cert/--tls-key and --principals-file, or "
                 "--allow-insecure-remote)");
  app.add_option("--unix-socket", flags.unix_socket,
                 "Unix socket path, or 'none' (default /tmp/kvcached.sock)");
  app.add_option("--shm-socket", flags.shm_socket,
                 "Shared-memory data plane socket for workers on this host, or 'none' "
                 "(default: the Unix socket's path + '.shm')");
  app.add_flag("--allow-insecure-remote", flags.allow_insecure_remote,
               "Allow a --listen address other hosts can reach, with no TLS or authentication "
               "(listen.allow_insecure_remote)");
  app.add_option("--principals-file", flags.principals_file,
                 "JSON file of who may call and what they may do; turns authentication on, "
                 "re-read on SIGHUP (security.principals_file; docs/security.md)");
  app.add_option("--secret-file", flags.secret_file,
                 "The daemon's own secret (created 0600 if missing), outside the checkpoint "
                 "folder (security.secret_file; default: <checkpoint-dir>.secret)");
  app.add_option("--tls-cert", flags.tls_cert,
                 "PEM certificate chain for TLS on --listen (security.tls.cert_file)");
  app.add_option("--tls-key", flags.tls_key,
                 "PEM private key of --tls-cert (security.tls.key_file)");
  app.add_option("--tls-client-ca", flags.tls_client_ca,
                 "PEM CA that client certificates must chain to: mutual TLS "
                 "(security.tls.client_ca_file)");
  app.add_option("--metrics-address", flags.metrics_address,
                 "Prometheus endpoint HOST:PORT, or 'none' (default 127.0.0.1:9464)");
  app.add_option("--capacity-bytes", flags.capacity_bytes,
                 "Host-memory tier capacity in bytes (default 1 GiB)");
  app.add_option("--slab-bytes", flags.slab_bytes, "Slab size in bytes (default 4 MiB)");
  app.add_option("--ssd-path", flags.ssd_path,
                 "File (or block device) of the SSD tier below host memory; unset: no SSD tier");
  app.add_option("--ssd-capacity-bytes", flags.ssd_capacity_bytes,
                 "Bytes of --ssd-path the SSD tier may use (default 16 GiB)");
  app.add_option("--gpu-tier", flags.gpu_tier,
                 "Kind of the GPU tier above host memory: cuda, or host_stand_in (host memory "
                 "standing in for a device); unset: no GPU tier");
  app.add_option("--gpu-capacity-bytes", flags.gpu_capacity_bytes,
                 "Device memory the GPU tier may use (default 8 GiB)");
  app.add_option("--checkpoint-dir", flags.checkpoint_dir,
                 "Directory of checkpoints: the cache is saved there periodically and at "
                 "shutdown, and reloaded at start-up; unset: no checkpoints");
  app.add_option("--log-level", flags.log_level, "trace, debug, info, warn or error");
  app.add_option("--log-format", flags.log_format,
                 "How log lines are written: text (default), logfmt or json (logging.format)");
  app.add_flag("--print-default-config", flags.print_default_config,
               "Print the embedded default configuration as JSON and exit");
  app.set_version_flag("--version", std::string("kvcached ") + KVCACHE_VERSION);
  CLI11_PARSE(app, argc, argv);

  if (flags.print_default_config) {
    std::puts(kvcache::ConfigToJson(kvcache::DefaultConfig()).c_str());
    return 0;
  }
  kvcache::v1::ServerConfig config = kvcache::DefaultConfig();
  if (!flags.config_path.empty()) {
    auto loaded = kvcache::LoadConfigFile(flags.config_path);
    if (!loaded.ok()) {
      std::fprintf(stderr, "kvcached: %s\n", std::string(loaded.status().message()).c_str());
      return 2;
    }
    config = *std::move(loaded);
  }
  kvcache::ApplyFlags(flags, &config);
  if (auto status = kvcache::ValidateConfig(config); !status.ok()) {
    std::fprintf(stderr, "kvcached: invalid configuration: %s\n",
                 std::string(status.message()).c_str());
    return 2;
  }
  return kvcache::Serve(config);
}
