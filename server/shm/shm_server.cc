#include "server/shm/shm_server.h"

#include <poll.h>
#include <spdlog/spdlog.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "kvcache/shm_frame.h"
#include "server/rpc/server.h"

namespace kvcache {

struct ShmServer::Connection {
  UniqueFd fd;
  ucred peer{};
  std::thread thread;
  bool finished = false;  // guarded by the server's mu_
};

absl::StatusOr<std::unique_ptr<ShmServer>> ShmServer::Start(const ShmServerOptions& options,
                                                            Cache* cache, RpcObserver* observer) {
  absl::StatusOr<UniqueFd> listener =
      ListenOnUnixSocket(options.socket_path, options.socket_gid, "listen.shm_socket");
  if (!listener.ok()) return listener.status();
  return std::unique_ptr<ShmServer>(new ShmServer(options, cache, observer, *std::move(listener)));
}

ShmServer::ShmServer(const ShmServerOptions& options, Cache* cache, RpcObserver* observer,
                     UniqueFd listener)
    : options_(options),
      cache_(cache),
      observer_(observer),
      copier_(options.copy_threads, options.parallel_copy_min_bytes),
      listener_(std::move(listener)),
      wake_(::eventfd(0, EFD_CLOEXEC)) {
  acceptor_ = std::thread([this] { AcceptLoop(); });
}

ShmServer::~ShmServer() { Shutdown(); }

int ShmServer::connections() const {
  std::lock_guard<std::mutex> lock(mu_);
  return active_;
}

void ShmServer::ReapFinishedLocked() {
  for (auto it = connections_.begin(); it != connections_.end();) {
    Connection* c = *it;
    if (!c->finished) {
      ++it;
      continue;
    }
    c->thread.join();  // it only returns now; it needs no lock
    connections_.erase(it++);
    delete c;
  }
}

void ShmServer::Shutdown() {
  if (shut_down_) return;
  shut_down_ = true;
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
    // A connection thread blocked reading its next request wakes with EOF;
    // one serving a request finishes it (its answer may still go out).
    for (Connection* c : connections_) {
      if (!c->finished) ::shutdown(c->fd.get(), SHUT_RD);
    }
  }
  const uint64_t one = 1;
  (void)!::write(wake_.get(), &one, sizeof(one));
  acceptor_.join();
  std::unique_lock<std::mutex> lock(mu_);
  finished_.wait(lock, [this] { return active_ == 0; });
  ReapFinishedLocked();
  ::unlink(options_.socket_path.c_str());
}

void ShmServer::AcceptLoop() {
  for (;;) {
    pollfd fds[2] = {{listener_.get(), POLLIN, 0}, {wake_.get(), POLLIN, 0}};
    if (::poll(fds, 2, -1) < 0) {
      if (errno == EINTR) continue;
      spdlog::error("shm socket: poll: {}", ErrnoText(errno));
      return;
    }
    if (fds[1].revents != 0) return;
    if (fds[0].revents == 0) continue;
    UniqueFd fd(::accept4(listener_.get(), nullptr, nullptr, SOCK_CLOEXEC));
    if (!fd.valid()) {
      if (errno != EINTR && errno != EAGAIN && errno != ECONNABORTED) {
        spdlog::warn("shm socket: accept: {}", ErrnoText(errno));
      }
      continue;
    }
    Admit(std::move(fd));
  }
}

void ShmServer::Admit(UniqueFd fd) {
  auto refuse = [&](const absl::Status& status) {
    v1::ShmResponse response;
    response.set_code(static_cast<int>(status.code()));
    response.set_message(std::string(status.message()));
    (void)shm::WriteFrame(fd.get(), response);
  };
  auto connection = std::make_unique<Connection>();
  socklen_t length = sizeof(connection->peer);
  if (::getsockopt(fd.get(), SOL_SOCKET, SO_PEERCRED, &connection->peer, &length) != 0) {
    return refuse(absl::InternalError("cannot read the peer's credentials (SO_PEERCRED)"));
  }
  const ucred& peer = connection->peer;
  const gid_t group =
      options_.socket_gid >= 0 ? static_cast<gid_t>(options_.socket_gid) : ::getegid();
  if (peer.uid != ::geteuid() && peer.uid != 0 && peer.gid != group) {
    spdlog::warn("shm socket: refused pid {} (uid {}, gid {}): not the daemon's user or group",
                 peer.pid, peer.uid, peer.gid);
    return refuse(absl::PermissionDeniedError(
        "the shared-memory socket serves the daemon's user, root and the socket's group only"));
  }
  std::lock_guard<std::mutex> lock(mu_);
  if (stopping_) return refuse(absl::UnavailableError("the daemon is shutting down"));
  ReapFinishedLocked();
  if (static_cast<uint32_t>(active_) >= options_.max_connections) {
    observer_->OnLimitReached("ShmConnect", "shm.max_connections");
    return refuse(absl::ResourceExhaustedError(
        absl::StrCat("the daemon serves ", active_,
                     " shared-memory connections, the limit (shm.max_connections)")));
  }
  spdlog::debug("shm socket: connection from pid {} (uid {})", peer.pid, peer.uid);
  connection->fd = std::move(fd);
  Connection* c = connection.release();
  connections_.insert(c);
  ++active_;
  c->thread = std::thread([this, c] { Serve(c); });
}

void ShmServer::Serve(Connection* connection) {
  {
    const ucred& peer = connection->peer;
    ShmSession session(options_.limits, cache_, &copier_, observer_,
                       {.peer = absl::StrCat("shm:pid=", peer.pid, ",uid=", peer.uid),
                        .inflight = options_.inflight,
                        .uid = peer.uid,
                        .access = options_.access});
    std::string frame;
    for (;;) {
      std::vector<int> received;
      absl::Status read =
          shm::ReadFrame(connection->fd.get(), options_.limits.max_frame_bytes, &frame, &received);
      std::vector<UniqueFd> fds;
      for (int fd : received) fds.emplace_back(fd);
      if (!read.ok()) {
        if (absl::IsResourceExhausted(read)) {
          v1::ShmResponse response;
          response.set_code(static_cast<int>(read.code()));
          response.set_message(std::string(read.message()));
          (void)shm::WriteFrame(connection->fd.get(), response);
        }
        break;  // closed, broken, or unusable after an oversized frame
      }
      v1::ShmRequest request;
      v1::ShmResponse response;
      if (!request.ParseFromString(frame)) {
        response.set_code(static_cast<int>(absl::StatusCode::kInvalidArgument));
        response.set_message("the request frame is not a kvcache.v1.ShmRequest");
      } else {
        response = session.Handle(request, std::move(fds));
      }
      if (!shm::WriteFrame(connection->fd.get(), response).ok() || session.refused()) break;
    }
  }  // the session's regions unmap here
  {
    std::lock_guard<std::mutex> lock(mu_);
    connection->fd.Reset();       // under mu_: Shutdown() reads it
    connection->finished = true;  // reaped (joined, freed) by Admit or Shutdown
    --active_;
  }
  finished_.notify_all();
}

}  // namespace kvcache
