// GrpcServer: the daemon's gRPC front door.
//
// Listens on TCP and/or a Unix socket, serves kvcache.v1.Cache and
// kvcache.v1.Admin, the standard grpc.health.v1 health service and server
// reflection, with the configured message-size limit, a gRPC memory quota
// and HTTP/2 keepalive pings that detect dead peers. Shutdown() stops
// accepting calls, lets in-flight ones finish until the deadline, then
// cancels the rest.
//
// Start() leaves a running daemon alone: it checks the TCP address is free
// before it touches the Unix socket path, removes a socket file there only
// when nothing listens on it (a stale socket of an earlier run), and never
// removes anything that is not a socket. The socket is made mode 0660
// (owner and group may connect).
#ifndef KVCACHE_SERVER_RPC_SERVER_H_
#define KVCACHE_SERVER_RPC_SERVER_H_

#include <grpcpp/server.h>
#include <sys/types.h>

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "server/core/cache.h"
#include "server/frontdoor/rpc_observer.h"
#include "server/rpc/admin_service.h"
#include "server/rpc/cache_service.h"
#include "server/rpc/unix_acceptor.h"
#include "server/security/access_control.h"
#include "server/security/tls_files.h"

namespace kvcache {

// Binds (and at once releases) every address `tcp_address` resolves to, the
// way gRPC will (SO_REUSEADDR, no SO_REUSEPORT), so a port another process
// holds is found before anything else is touched: UNAVAILABLE then. An
// address this cannot parse or resolve is left for gRPC to judge (OK).
absl::Status CheckTcpAddressFree(const std::string& tcp_address);

struct GrpcServerOptions {
  std::string tcp_address;  // empty: no TCP
  std::string unix_socket;  // empty: no Unix socket
  int64_t socket_gid = -1;  // group the Unix socket is given to; -1: the daemon's
  uint64_t max_message_bytes = uint64_t{64} << 20;
  uint64_t grpc_memory_quota_bytes = uint64_t{1} << 30;  // grpc::ResourceQuota
  absl::Duration keepalive_time = absl::Seconds(30);     // ping every connection this often
  absl::Duration keepalive_timeout = absl::Seconds(10);  // then close it unanswered
  CacheServiceOptions cache_service;
  ServerIdentity identity;  // listen_addresses is filled in by Start()
  // The Admin service's checkpoint calls; null: checkpoints are off.
  checkpoint::CheckpointService* checkpoints = nullptr;
  // GetStats' per-method counts (pass the same tally as the observer); null: none.
  const RpcTally* rpc_tally = nullptr;
  // The calls in flight: Append and Fetch register there, DumpMemory lists
  // them; null: not kept. Outlives the server.
  InflightCalls* inflight = nullptr;
  // TLS on the TCP listener (the Unix socket stays local and plaintext).
  TlsFiles tls;
  // Who may call what, in which namespaces; null: everyone, everywhere.
  // Outlives the server.
  AccessControl* access = nullptr;
  // GetStats' memory breakdown; empty: not reported.
  MemorySource memory;
  // GetServerInfo's remote tier; empty: the remote tier is off.
  std::function<v1::RemoteTierStatus()> remote_tier;
};

class GrpcServer {
 public:
  // UNAVAILABLE when a listener cannot bind (the TCP address is in use,
  // another process listens on the Unix socket); FAILED_PRECONDITION when the
  // socket path exists and is not a socket; INVALID_ARGUMENT with no listener
  // or a socket path too long.
  static absl::StatusOr<std::unique_ptr<GrpcServer>> Start(GrpcServerOptions options, Cache* cache,
                                                           RpcObserver* observer);
  ~GrpcServer();

  const std::vector<std::string>& listen_addresses() const { return listen_addresses_; }
  int tcp_port() const { return tcp_port_; }

  void Shutdown(absl::Duration drain);
  void Wait();

 private:
  GrpcServer() = default;

  std::unique_ptr<CacheService> cache_service_;
  std::unique_ptr<AdminService> admin_service_;
  std::unique_ptr<grpc::Server> server_;
  std::unique_ptr<UnixAcceptor> unix_acceptor_;  // the Unix socket's; null: none
  std::vector<std::string> listen_addresses_;
  int tcp_port_ = 0;
  bool shut_down_ = false;
};

}  // namespace kvcache

#endif  // KVCACHE_SERVER_RPC_SERVER_H_
