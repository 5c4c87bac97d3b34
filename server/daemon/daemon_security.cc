#include "server/daemon/daemon_security.h"

#include <spdlog/spdlog.h>
#include <unistd.h>

#include <cstdlib>
#include <string>
#include <utility>

#include "server/config/config.h"

namespace kvcache {

namespace {

// Where the daemon keeps private runtime files (the TLS mirror): a tmpfs when
// there is one, so a key copy never reaches a disk.
std::string RuntimeDirectory() {
  auto usable = [](const char* dir) {
    return dir != nullptr && *dir != '\0' && ::access(dir, W_OK) == 0;
  };
  if (const char* run = std::getenv("XDG_RUNTIME_DIR"); usable(run)) return run;
  if (usable("/dev/shm")) return "/dev/shm";
  if (const char* tmp = std::getenv("TMPDIR"); usable(tmp)) return tmp;
  return "/tmp";
}

}  // namespace

std::function<BlockHashKeys(const ModelKey&)> BlockHashKeysFrom(const DaemonSecret& secret) {
  const SecretKey lookup = secret.Derive("block-lookup-hash");
  const SecretKey chain = secret.Derive("chain-key");
  return [lookup, chain](const ModelKey& model) {
    std::string id = model.ns;
    id.push_back('\0');  // model names never hold one
    id += model.model_id;
    return BlockHashKeys{.lookup = HmacSha256(lookup, id), .chain = HmacSha256(chain, id)};
  };
}

absl::StatusOr<DaemonSecret> LoadDaemonSecret(const v1::ServerConfig& config) {
  const std::string path = SecretFilePath(config);
  if (path.empty()) {
    spdlog::info(
        "daemon secret: random for this process (no checkpoints, no "
        "security.secret_file)");
    return DaemonSecret::Random();
  }
  absl::StatusOr<DaemonSecret> secret = DaemonSecret::LoadOrCreate(path);
  if (secret.ok()) spdlog::info("daemon secret: {}", path);
  return secret;
}

absl::StatusOr<DaemonSecurity> DaemonSecurity::Start(const v1::ServerConfig& config) {
  const v1::SecurityConfig& security = config.security();
  DaemonSecurity out;
  absl::StatusOr<std::unique_ptr<AccessControl>> access = AccessControl::Create(
      {.principals_file = security.principals_file(),
       .shared_namespaces = {security.shared_namespaces().begin(),
                             security.shared_namespaces().end()},
       .max_requests_per_second = security.tenant_limits().max_requests_per_second(),
       .max_concurrent_streams = security.tenant_limits().max_concurrent_streams(),
       .max_share = TenantShare(security),
       .daemon_max_concurrent_unary = config.limits().max_concurrent_unary(),
       .daemon_max_shm_connections = config.shm().max_connections()});
  if (!access.ok()) return access.status();
  out.access = *std::move(access);
  if (out.access->enabled()) {
    spdlog::info("authentication on: {} principals from {} (re-read on SIGHUP)",
                 out.access->principals(), security.principals_file());
    spdlog::info(
        "each tenant may hold {} of max_models, max_leases, max_lease_tokens, the metadata "
        "budget, max_concurrent_unary and shm.max_connections "
        "(security.tenant_limits.max_share)",
        TenantShare(security));
    const uint64_t quota = security.tenant_limits().max_cached_bytes();
    const uint64_t capacity = config.host_tier().capacity_bytes();
    if (quota != 0 && out.access->tenants() * quota > capacity) {
      spdlog::warn(
          "{} tenants x security.tenant_limits.max_cached_bytes {} exceed "
          "host_tier.capacity_bytes {}: a tenant under its quota can still lose blocks "
          "to the host tier's own eviction (docs/security.md)",
          out.access->tenants(), quota, capacity);
    }
  } else {
    spdlog::info(
        "authentication off: every caller is an admin of every namespace "
        "(security.principals_file turns it on)");
  }
  if (security.require_block_checksums()) {
    spdlog::info(
        "block checksums: required; an append without them is refused "
        "(security.require_block_checksums)");
  } else {
    spdlog::warn(
        "block checksums: not required (security.require_block_checksums is false): an append "
        "without them is stored with no proof that its KV is what the worker computed");
  }
  out.tls = {.cert_file = security.tls().cert_file(),
             .key_file = security.tls().key_file(),
             .client_ca_file = security.tls().client_ca_file(),
             .reload_interval = absl::Seconds(security.tls().reload_interval_seconds())};
  // gRPC reads the TLS files through a mirror that installs only matching
  // sets, so a key renewed before its certificate fails no handshake.
  if (out.tls.enabled()) {
    absl::StatusOr<std::unique_ptr<TlsMirror>> mirror =
        TlsMirror::Start(out.tls, RuntimeDirectory());
    if (!mirror.ok()) return mirror.status();
    out.tls_mirror = *std::move(mirror);
  }
  return out;
}

void DaemonSecurity::Reload() const {
  if (tls_mirror != nullptr && tls_mirror->Refresh()) {
    spdlog::info("received SIGHUP: TLS files re-read (set {} in use)", tls_mirror->installed());
  }
  if (!access->enabled()) {
    spdlog::info("received SIGHUP: nothing to reload (security.principals_file is not set)");
  } else if (absl::Status s = access->Reload(); s.ok()) {
    spdlog::info("received SIGHUP: {} principals reloaded", access->principals());
  } else {
    spdlog::error(
        "received SIGHUP: the principals file did not load, the previous {} "
        "principals stay in force: {}",
        access->principals(), s.ToString());
  }
}

}  // namespace kvcache
