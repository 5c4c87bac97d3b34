// The daemon's security as its config sets it up (docs/security.md): who may
// call (AccessControl) and the TLS files gRPC reads (TlsMirror), with the
// start-up and SIGHUP log lines an operator reads.
#ifndef KVCACHE_SERVER_DAEMON_DAEMON_SECURITY_H_
#define KVCACHE_SERVER_DAEMON_DAEMON_SECURITY_H_

#include <functional>
#include <memory>

#include "absl/status/statusor.h"
#include "kvcache/v1/config.pb.h"
#include "server/core/block_hasher.h"
#include "server/core/layout.h"
#include "server/security/access_control.h"
#include "server/security/daemon_secret.h"
#include "server/security/tls_files.h"
#include "server/security/tls_mirror.h"

namespace kvcache {

// The daemon's secret as the config places it (config.h SecretFilePath):
// loaded or created, or random when there is no file. Its errors stop the
// start. Logs where it came from.
absl::StatusOr<DaemonSecret> LoadDaemonSecret(const v1::ServerConfig& config);

// CacheOptions::block_hash_keys from the daemon's secret: each model's keys
// are HMAC-SHA256(Derive("block-lookup-hash") or Derive("chain-key"),
// namespace NUL model_id), so they differ per (namespace, model) and per
// daemon secret (block_hasher.h).
std::function<BlockHashKeys(const ModelKey&)> BlockHashKeysFrom(const DaemonSecret& secret);

struct DaemonSecurity {
  std::unique_ptr<AccessControl> access;
  std::unique_ptr<TlsMirror> tls_mirror;  // null: no TLS
  TlsFiles tls;                           // as configured (enabled(), mutual())

  // Loads the principals file and the TLS files; their errors stop the start.
  // Logs whether authentication is on, and warns when the tenants' quotas
  // overcommit the host tier.
  static absl::StatusOr<DaemonSecurity> Start(const v1::ServerConfig& config);

  // What gRPC watches: the mirror's files, or none.
  TlsFiles ServedTls() const { return tls_mirror != nullptr ? tls_mirror->mirrored() : TlsFiles{}; }

  // SIGHUP: re-reads the TLS files and the principals file, logging the outcome.
  void Reload() const;
};

}  // namespace kvcache

#endif  // KVCACHE_SERVER_DAEMON_DAEMON_SECURITY_H_
