// UnixAcceptor: the gRPC Unix socket's listener.
//
// kvcached accepts the socket's connections itself and hands each to gRPC
// (grpc::AddInsecureChannelFromFd), so that a call can be told the uid of the
// process at the other end. (A socket gRPC listens on itself gives its
// handlers no way to that.) gRPC names such a connection's peer "fd:N". The
// peer's credentials are read when the connection is accepted and bound to
// descriptor N (UnixPeers, unix_peers.h), not read from N when a call runs:
// gRPC may close N while calls are pending and a later connection may get N,
// so reading N then could name another process.
#ifndef KVCACHE_SERVER_RPC_UNIX_ACCEPTOR_H_
#define KVCACHE_SERVER_RPC_UNIX_ACCEPTOR_H_

#include <grpcpp/server.h>
#include <sys/types.h>

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <thread>

#include "absl/status/statusor.h"
#include "server/frontdoor/unix_socket.h"

namespace kvcache {

class UnixAcceptor {
 public:
  // Claims `path` and listens on it (ListenOnUnixSocket); connections wait
  // in the backlog until Start().
  static absl::StatusOr<std::unique_ptr<UnixAcceptor>> Listen(const std::string& path, int64_t gid);
  ~UnixAcceptor();  // Stop(), and the socket file is removed
  UnixAcceptor(const UnixAcceptor&) = delete;
  UnixAcceptor& operator=(const UnixAcceptor&) = delete;

  // Hands every connection to `server` from now on. `server` outlives Stop().
  void Start(grpc::Server* server);
  // Stops accepting; connections already handed over stay gRPC's. Idempotent.
  void Stop();

 private:
  UnixAcceptor(std::string path, UniqueFd listener, UniqueFd wake)
      : path_(std::move(path)), listener_(std::move(listener)), wake_(std::move(wake)) {}
  void AcceptLoop(grpc::Server* server);

  const std::string path_;
  UniqueFd listener_;
  UniqueFd wake_;  // an eventfd that ends the loop
  std::thread thread_;
};

// The uid of the process at the other end of the connection gRPC calls
// `peer`, as read when a UnixAcceptor accepted it ("fd:N", while N is still
// that connection's socket: UnixPeers::UidOf); nullopt for any other peer
// (TCP, or a connection that is gone).
std::optional<uid_t> PeerUidOf(std::string_view peer);

}  // namespace kvcache

#endif  // KVCACHE_SERVER_RPC_UNIX_ACCEPTOR_H_
