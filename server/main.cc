// kvcached: the KV-cache daemon.
//
// Builds the configuration (embedded defaults < --config file < flags),
// validates and logs it, creates the cache over its tiers (host memory and,
// when configured, SSD), starts the metrics endpoint, the shared-memory data
// plane and the gRPC server, runs the periodic work (lease expiry, importance
// compaction, weight calibration) and the tier migrator, shares blocks with
// other daemons through the remote tier when configured, and serves until
// SIGTERM or SIGINT, which drain in-flight calls (up to
// drain_timeout_seconds) and exit 0.
#include <grp.h>
#include <pthread.h>
#include <signal.h>
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
#include "server/config/config.h"
#include "server/core/cache.h"
#include "server/core/eviction_policy.h"
#include "server/core/memory_breakdown.h"
#include "server/core/slab_pool.h"
#include "server/daemon/config_translation.h"
#include "server/daemon/daemon_security.h"
#include "server/daemon/endpoints.h"
#include "server/daemon/maintenance.h"
#include "server/daemon/remote_tier.h"
#include "server/daemon/tiers.h"
#include "server/frontdoor/fair_scheduler.h"
#include "server/http/http_server.h"
#include "server/logging/logging.h"
#include "server/memory/malloc_tuning.h"
#include "server/memory/process_memory.h"
#include "server/metrics/metrics.h"
#include "server/rpc/rpc_tally.h"
#include "server/rpc/server.h"
#include "server/shm/shm_server.h"
#include "server/status/cache_status_source.h"
#include "server/status/event_log.h"
#include "server/status/status_page.h"

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
  absl::StatusOr<std::shared_ptr<DeviceTier>> gpu = GpuTierFromConfig(config.gpu_tier());
  if (!gpu.ok()) {
    spdlog::error("{}", gpu.status().ToString());
    return 2;
  }
  std::shared_ptr<HostMemoryRegistrar> pinner;
  if (*gpu != nullptr && config.gpu_tier().pin_host_memory()) {
    pinner = (*gpu)->HostPinner();
    spdlog::info("host tier: memory is page-locked with the gpu tier's device as it is mapped");
  }
  auto pool = SlabPool::Create(HostPoolOptionsFromConfig(config.host_tier()), std::move(pinner));
  if (!pool.ok()) {
    spdlog::error("host tier: {}", pool.status().ToString());
    return 2;
  }
  v1::CalibratedWeights calibrated = LoadCalibratedWeights(config.importance());
  absl::StatusOr<DaemonSecret> secret = LoadDaemonSecret(config);
  if (!secret.ok()) {
    spdlog::error("{}", secret.status().ToString());
    return 2;
  }
  const v1::LimitsConfig& limits = config.limits();
  CacheOptions cache_options = CacheOptionsFromConfig(config);
  cache_options.block_hash_keys = BlockHashKeysFrom(*secret);
  for (const v1::CalibratedWeights::Model& m : calibrated.models()) {
    cache_options.importance.initial_weights[ModelKey{m.namespace_(), m.model_id()}] = {
        .alpha = m.alpha(), .beta = m.beta(), .gamma = m.gamma()};
  }
  absl::StatusOr<std::vector<Cache::LowerLevel>> levels =
      LowerLevelsFromConfig(config, SystemClock::Get());
  if (!levels.ok()) {
    spdlog::error("{}", levels.status().ToString());
    return 2;
  }
  std::unique_ptr<EvictionPolicy> policy =
      EvictionPolicyFromConfig(config.cache(), SystemClock::Get());
  spdlog::info("eviction policy: {} (each tier ranks its blocks with its own)", policy->name());
  Cache cache(cache_options, *std::move(pool), std::move(policy), SystemClock::Get(),
              *std::move(levels), *gpu);

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
                          .max_write_bytes_per_second = c.max_write_bytes_per_second(),
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

  // The tier shared with the other daemons of a deployment (remote_tier):
  // before the metrics that read it and the servers that tell it of appends
  // and lookups, so that it outlives them.
  absl::StatusOr<std::unique_ptr<RemoteTier>> remote =
      RemoteTier::Start(config.remote_tier(), &cache);
  if (!remote.ok()) {
    spdlog::error("remote tier: {}", remote.status().ToString());
    return 2;
  }
  SharedTier* const shared = *remote != nullptr ? (*remote)->shared() : nullptr;

  auto stats_source = [&cache, &checkpoints] {
    CacheStats stats = cache.GetStats();
    if (checkpoints != nullptr) stats.checkpoint = CheckpointCountersOf(checkpoints->Status());
    return stats;
  };
  std::unique_ptr<Metrics> metrics = Metrics::CreateUnexposed(stats_source);
  if (const RemoteTier* r = remote->get(); r != nullptr) {
    metrics->AddCounterSource([r](CounterVisitor& v) { r->sharing().VisitCounters(v); });
  }
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
    uint64_t staging_bytes = 0;  // the lower levels' bounce buffers
    for (const TierStats& level : stats.lower_stores) staging_bytes += level.staging_bytes;
    MemoryInputs in{
        .malloc = ReadMallocStats(),
        .malloc_trims = trimmer.trims(),
        .capacity_bytes = capacity,
        .pool_reserved_bytes = stats.host_pool.reserved_bytes,
        .metadata_bytes = stats.metadata_bytes,
        .ssd_staging_bytes = staging_bytes,
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
  if (const RemoteTier* r = remote->get(); r != nullptr) {
    status_source->SetRemoteTierSource([r] { return r->Status(); });
  }
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
                                     .worker_threads = shm.worker_threads(),
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
                                     .fair = fair.get(),
                                     .shared = shared},
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
  if (const RemoteTier* r = remote->get(); r != nullptr) {
    server_options.remote_tier = [r] { return r->Status(); };
  }
  server_options.cache_service.fair = fair.get();
  server_options.cache_service.shared = shared;
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
  if (cache.tiers().lower_tier() != nullptr || *gpu != nullptr) {
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
