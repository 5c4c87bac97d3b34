// ShmServer: the daemon's shared-memory data plane endpoint.
//
// Listens on a Unix stream socket (listen.shm_socket, mode 0660 like the gRPC
// socket) and serves kvcache.v1 shm.proto: each accepted connection gets an
// ShmSession and is served one request at a time (read a frame, answer it).
// The socket file's mode is the gate: whoever can connect to it (the
// daemon's user, root, members of the socket's group, supplementary ones
// included) is served; with authentication on, the session's principal (the
// hello's token, or the peer's uid from SO_PEERCRED) decides what each
// request may do. One connection past shm.max_connections is answered with an
// error frame and closed. A connection that closes (the worker exits or
// crashes) ends its session, which unmaps its regions.
//
// Threads: no connection has a thread of its own. A pool of workers
// (shm.worker_threads) waits on one epoll set in which every connection is
// armed one-shot: the worker woken for a connection owns it until it arms it
// again, so its session sees one request at a time. That worker reads what
// the socket has of the next frame without blocking (a frame is assembled as
// its bytes come, shm::FrameAssembler); once the frame is whole it hands it
// to the session (ShmSession::Handle), which answers at once (a lookup, a
// fetch from host memory, an append) or, when the request must wait for a
// data-path slot or for reads below host memory, later from the thread that
// finishes it: no worker waits for either. Whoever has the answer sends it
// without blocking, then arms the connection for the next frame, or for the
// rest of an answer the peer was slow to take. A request costs one wakeup, as a thread per
// connection did, and a peer that does not read its answers, or sends a frame slowly, holds no
// thread. A janitor thread shuts down the sockets of connections past their
// deadlines (the owner of the next event closes them).
//
// Until a hello is answered OK a connection is a stranger: its frames may be
// at most kMaxHelloFrameBytes, the first request must be a hello, and the
// hello must be answered within hello_timeout of the accept, or the
// connection is closed. After it, a frame once begun must arrive whole
// within io_timeout, and an answer not taken by the peer within io_timeout
// cuts the connection off; the wait for the next frame is unbounded. Frame
// buffers grow only as bytes arrive (kvcache/shm_frame.h).
//
// Regions count against a MappingBudget shared by every connection
// (shm.max_mappings, shm.max_mapped_bytes, and their per-tenant twins).
//
// Shutdown() stops accepting and closes idle connections, lets each
// connection finish the request it is serving for up to drain_timeout, then
// shuts down the sockets of the connections still busy (logging each one cut
// off) and joins every thread.
//
// Thread-safe. The Cache and RpcObserver must outlive the server.
#ifndef KVCACHE_SERVER_SHM_SHM_SERVER_H_
#define KVCACHE_SERVER_SHM_SHM_SERVER_H_

#include <sys/types.h>

#include <condition_variable>
#include <cstdint>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_set.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "server/common/mutex.h"
#include "server/core/cache.h"
#include "server/frontdoor/inflight_calls.h"
#include "server/frontdoor/rpc_observer.h"
#include "server/frontdoor/unix_socket.h"
#include "server/shm/copy_engine.h"
#include "server/shm/mapping_budget.h"
#include "server/shm/shm_session.h"

namespace kvcache {

struct ShmServerOptions {
  std::string socket_path;
  // Group the socket is given to (mode 0660: its members may connect besides
  // the daemon's user and root); -1: the daemon's primary group.
  int64_t socket_gid = -1;
  uint32_t max_connections = 256;
  // Threads that answer requests (the event loop is one more); 0: four per
  // core, at least 8 (a request may wait for a data-path slot or the SSD).
  uint32_t worker_threads = 0;
  ShmLimits limits;
  // Caps on the regions mapped by all connections together, and per tenant:
  // `budget` when set (shared with whoever reports it), else a budget of
  // `mappings` of the server's own.
  MappingLimits mappings;
  std::shared_ptr<MappingBudget> budget;
  // Before a hello is answered OK: the time from accept to that answer.
  absl::Duration hello_timeout = absl::Seconds(5);
  // After it: the time a frame may take from its first byte to its last, and
  // an answer the peer may leave unread before the connection is closed.
  absl::Duration io_timeout = absl::Seconds(30);
  // How long Shutdown() waits for requests being served before it cuts their
  // connections off.
  absl::Duration drain_timeout = absl::Seconds(5);
  uint32_t copy_threads = 0;
  uint64_t parallel_copy_min_bytes = uint64_t{8} << 20;
  // Where fetch_into and append_from register while they run; null: nowhere.
  // Outlives the server.
  InflightCalls* inflight = nullptr;
  // Who may call what, by the peer's uid; null: everyone, everywhere.
  AccessControl* access = nullptr;
  // Admission of fetch_into and append_from (ShmPeer::fair); null: none.
  // Outlives the server.
  FairScheduler* fair = nullptr;
  // The tier shared with other daemons (ShmPeer::shared); null: none.
  // Outlives the server.
  SharedTier* shared = nullptr;
};

class ShmServer {
 public:
  // Largest frame a connection may send before its hello is answered OK.
  static constexpr uint64_t kMaxHelloFrameBytes = uint64_t{16} << 10;

  // UNAVAILABLE when another process listens on the path, FAILED_PRECONDITION
  // when the path exists and is not a socket, INVALID_ARGUMENT when it is too
  // long (as the gRPC socket).
  static absl::StatusOr<std::unique_ptr<ShmServer>> Start(const ShmServerOptions& options,
                                                          Cache* cache, RpcObserver* observer);
  ~ShmServer();  // Shutdown()
  ShmServer(const ShmServer&) = delete;
  ShmServer& operator=(const ShmServer&) = delete;

  const std::string& socket_path() const { return options_.socket_path; }
  // Connections open now (idle or being served).
  int connections() const;
  // Threads the server runs: the workers and the janitor.
  int threads() const;
  // The regions mapped now, and their caps.
  const MappingBudget& mapping_budget() const { return *budget_; }

  // Idempotent; removes the socket file. Returns within about drain_timeout
  // plus the time the requests being served take to notice their sockets
  // closed (a copy in progress finishes).
  void Shutdown();

 private:
  struct Connection;
  ShmServer(const ShmServerOptions& options, Cache* cache, RpcObserver* observer,
            UniqueFd listener);

  // A worker: waits on the epoll set and serves what it is woken for, until
  // Shutdown() makes the wake descriptor readable.
  void Work();
  // Accepts what the listener has (the listener is armed one-shot too).
  void AcceptAll();
  // Admits or refuses a new connection.
  void Admit(UniqueFd fd);
  // Serves one event of a connection this worker owns: reads, answers,
  // sends, and arms it again (or closes it).
  void Step(Connection* c);
  // Hands the whole frame the connection read to its session, which answers
  // (Respond) on this thread or, when the request waits, on another.
  void Answer(Connection* c);
  // Starts sending an answer, and arms the connection again (or closes it).
  // Runs on the thread that owns the connection while it is unarmed.
  void Respond(Connection* c, v1::ShmResponse response);
  // Arms the connection one-shot for its next event (reading, or writing
  // the rest of an answer), with the deadline that goes with it.
  void Rearm(Connection* c);
  void Close(Connection* c);
  // The janitor: shuts down the sockets of connections past their deadlines.
  void Janitor();

  const ShmServerOptions options_;
  Cache* const cache_;
  RpcObserver* const observer_;
  CopyEngine copier_;
  const std::shared_ptr<MappingBudget> budget_;
  UniqueFd listener_;
  UniqueFd epoll_;
  UniqueFd wake_;  // an eventfd, readable from Shutdown() on: the workers return
  std::vector<std::thread> workers_;
  std::thread janitor_;
  mutable Mutex mu_;
  std::condition_variable_any closed_;  // a connection closed, or stopping_ (the janitor)
  // Every open connection: the janitor walks it, Shutdown() shuts them down.
  absl::flat_hash_set<Connection*> open_ ABSL_GUARDED_BY(mu_);
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  bool shut_down_ ABSL_GUARDED_BY(mu_) = false;
};

}  // namespace kvcache

#endif  // KVCACHE_SERVER_SHM_SHM_SERVER_H_
