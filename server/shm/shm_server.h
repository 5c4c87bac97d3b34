// ShmServer: the daemon's shared-memory data plane endpoint.
//
// Listens on a Unix stream socket (listen.shm_socket, mode 0660 like the gRPC
// socket) and serves kvcache.v1 shm.proto: each accepted connection gets a
// thread of its own and an ShmSession, and is served one request at a time
// (read a frame, answer it). A connection is accepted only from a peer whose
// credentials (SO_PEERCRED) show the daemon's user, root, or the socket's
// group (as a primary group: SO_PEERCRED carries no supplementary groups); one past
// shm.max_connections, or from another user, is answered with an error frame and closed. A
// connection that closes (the worker exits or crashes) ends its session, which unmaps its regions.
//
// Shutdown() stops accepting, lets each connection finish the request it is
// serving, closes them all and joins their threads.
//
// Thread-safe. The Cache and RpcObserver must outlive the server.
#ifndef KVCACHE_SERVER_SHM_SHM_SERVER_H_
#define KVCACHE_SERVER_SHM_SHM_SERVER_H_

#include <sys/types.h>

#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <thread>

#include "absl/container/flat_hash_set.h"
#include "absl/status/statusor.h"
#include "server/core/cache.h"
#include "server/rpc/inflight_calls.h"
#include "server/rpc/rpc_observer.h"
#include "server/rpc/unix_socket.h"
#include "server/shm/copy_engine.h"
#include "server/shm/shm_session.h"

namespace kvcache {

struct ShmServerOptions {
  std::string socket_path;
  // Group the socket is given to and whose members may connect besides the
  // daemon's user and root; -1: the daemon's primary group.
  int64_t socket_gid = -1;
  uint32_t max_connections = 256;
  ShmLimits limits;
  uint32_t copy_threads = 0;
  uint64_t parallel_copy_min_bytes = uint64_t{8} << 20;
  // Where fetch_into and append_from register while they run; null: nowhere.
  // Outlives the server.
  InflightCalls* inflight = nullptr;
  // Who may call what, by the peer's uid; null: everyone, everywhere.
  AccessControl* access = nullptr;
};

class ShmServer {
 public:
  // UNAVAILABLE when another process listens on the path, FAILED_PRECONDITION
  // when the path exists and is not a socket, INVALID_ARGUMENT when it is too
  // long (as the gRPC socket).
  static absl::StatusOr<std::unique_ptr<ShmServer>> Start(const ShmServerOptions& options,
                                                          Cache* cache, RpcObserver* observer);
  ~ShmServer();  // Shutdown()
  ShmServer(const ShmServer&) = delete;
  ShmServer& operator=(const ShmServer&) = delete;

  const std::string& socket_path() const { return options_.socket_path; }
  // Connections being served now.
  int connections() const;

  // Idempotent; removes the socket file.
  void Shutdown();

 private:
  struct Connection;
  ShmServer(const ShmServerOptions& options, Cache* cache, RpcObserver* observer,
            UniqueFd listener);

  void AcceptLoop();
  // Admits or refuses a new connection; an admitted one gets its thread.
  void Admit(UniqueFd fd);
  void Serve(Connection* connection);
  // Joins and frees the connections whose threads are done. REQUIRES: mu_ held.
  void ReapFinishedLocked();

  const ShmServerOptions options_;
  Cache* const cache_;
  RpcObserver* const observer_;
  CopyEngine copier_;
  UniqueFd listener_;
  UniqueFd wake_;  // an eventfd that wakes the accept loop for shutdown
  std::thread acceptor_;
  // A std::mutex, which ThreadSanitizer sees (server/core/mutex.h says why
  // not absl::Mutex); it guards the three fields after it.
  mutable std::mutex mu_;
  std::condition_variable finished_;  // a connection finished
  bool stopping_ = false;
  absl::flat_hash_set<Connection*> connections_;  // serving or finished
  int active_ = 0;                                // serving
  bool shut_down_ = false;
};

}  // namespace kvcache

#endif  // KVCACHE_SERVER_SHM_SHM_SERVER_H_
