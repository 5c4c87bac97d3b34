#include "server/shm/shm_server.h"

#include <poll.h>
#include <spdlog/spdlog.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "kvcache/shm_frame.h"

namespace kvcache {

namespace {

void Answer(int fd, const absl::Status& status) {
  v1::ShmResponse response;
  response.set_code(static_cast<int>(status.code()));
  response.set_message(std::string(status.message()));
  (void)shm::WriteFrame(fd, response);
}

void SetSendTimeout(int fd, absl::Duration timeout) {
  const timeval tv = absl::ToTimeval(timeout);
  (void)::setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv));
}

}  // namespace

struct ShmServer::Connection {
  UniqueFd fd;  // reset under the server's mu_ (Shutdown() reads it)
  ucred peer{};
  absl::Time accepted;
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
      budget_(options.budget != nullptr ? options.budget
                                        : std::make_shared<MappingBudget>(options.mappings)),
      listener_(std::move(listener)),
      wake_(::eventfd(0, EFD_CLOEXEC)) {
  acceptor_ = std::thread([this] { AcceptLoop(); });
}

ShmServer::~ShmServer() { Shutdown(); }

int ShmServer::connections() const {
  MutexLock lock(&mu_);
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
  {
    MutexLock lock(&mu_);
    if (shut_down_) return;
    shut_down_ = true;
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
  const auto drained = [this] {
    mu_.AssertHeld();
    return active_ == 0;
  };
  mu_.Lock();  // finished_ waits on the Mutex itself, which the analysis follows
  if (!finished_.wait_for(mu_, absl::ToChronoNanoseconds(options_.drain_timeout), drained)) {
    // Requests still being served after the bound: their sockets are shut
    // down both ways, so a blocked write (a peer that does not read) or read
    // fails at once and the thread ends after the step it is in.
    for (Connection* c : connections_) {
      if (c->finished) continue;
      spdlog::warn(
          "shm socket: shutting down: cut off the connection of pid {} (uid {}) still busy after "
          "{}",
          c->peer.pid, c->peer.uid, absl::FormatDuration(options_.drain_timeout));
      ::shutdown(c->fd.get(), SHUT_RDWR);
    }
    finished_.wait(mu_, drained);
  }
  ReapFinishedLocked();
  mu_.Unlock();
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
  auto connection = std::make_unique<Connection>();
  connection->accepted = absl::Now();
  // Every answer, refusals included, is sent with a deadline: a peer that
  // does not read cannot hold a thread. Until the hello, the hello's.
  SetSendTimeout(fd.get(), std::min(options_.hello_timeout, options_.io_timeout));
  socklen_t length = sizeof(connection->peer);
  if (::getsockopt(fd.get(), SOL_SOCKET, SO_PEERCRED, &connection->peer, &length) != 0) {
    return Answer(fd.get(),
                  absl::InternalError("cannot read the peer's credentials (SO_PEERCRED)"));
  }
  // No check of the peer's uid or gid here: the socket file's mode (0660,
  // the socket's group) decides who can connect, supplementary group members
  // included; authentication, when on, decides what the session may do.
  const ucred& peer = connection->peer;
  MutexLock lock(&mu_);
  if (stopping_) return Answer(fd.get(), absl::UnavailableError("the daemon is shutting down"));
  ReapFinishedLocked();
  if (static_cast<uint32_t>(active_) >= options_.max_connections) {
    observer_->OnLimitReached("ShmConnect", "shm.max_connections");
    return Answer(fd.get(), absl::ResourceExhaustedError(absl::StrCat(
                                "the daemon serves ", active_,
                                " shared-memory connections, the limit (shm.max_connections)")));
  }
  spdlog::debug("shm socket: connection from pid {} (uid {}, gid {})", peer.pid, peer.uid,
                peer.gid);
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
                        .access = options_.access,
                        .fair = options_.fair},
                       budget_.get());
    ServeRequests(*connection, session);
  }  // the session's regions unmap here
  {
    MutexLock lock(&mu_);
    connection->fd.Reset();       // under mu_: Shutdown() reads it
    connection->finished = true;  // reaped (joined, freed) by Admit or Shutdown
    --active_;
  }
  finished_.notify_all();
}

void ShmServer::ServeRequests(Connection& connection, ShmSession& session) {
  const int fd = connection.fd.get();
  const ucred& peer = connection.peer;
  const absl::Time hello_deadline = connection.accepted + options_.hello_timeout;
  bool greeted = false;  // a hello was answered OK
  std::string frame;
  for (;;) {
    shm::ReadOptions read_options{.max_bytes = options_.limits.max_frame_bytes,
                                  .frame_timeout = options_.io_timeout};
    if (!greeted) {
      read_options = {.max_bytes = std::min(kMaxHelloFrameBytes, options_.limits.max_frame_bytes),
                      .deadline = hello_deadline};
    }
    std::vector<int> received;
    absl::Status read = shm::ReadFrame(fd, read_options, &frame, &received);
    std::vector<UniqueFd> fds;
    for (int f : received) fds.emplace_back(f);
    if (!read.ok()) {
      if (absl::IsResourceExhausted(read) || absl::IsInvalidArgument(read)) {
        Answer(fd, read);
      }
      if (absl::IsDeadlineExceeded(read)) {
        spdlog::info("shm socket: cut off pid {} (uid {}): {}{}", peer.pid, peer.uid,
                     std::string(read.message()), greeted ? "" : " (before its hello)");
      }
      return;  // closed, broken, late, or unusable after a refused frame
    }
    v1::ShmRequest request;
    v1::ShmResponse response;
    if (!request.ParseFromString(frame)) {
      response.set_code(static_cast<int>(absl::StatusCode::kInvalidArgument));
      response.set_message("the request frame is not a kvcache.v1.ShmRequest");
    } else if (!greeted && request.op_case() != v1::ShmRequest::kHello) {
      response.set_code(static_cast<int>(absl::StatusCode::kFailedPrecondition));
      response.set_message(
          "the first request on a shared-memory connection is a hello (its version, and the "
          "token with authentication on)");
    } else {
      response = session.Handle(request, std::move(fds));
      if (!greeted && request.op_case() == v1::ShmRequest::kHello && response.code() == 0) {
        greeted = true;
        SetSendTimeout(fd, options_.io_timeout);
      }
    }
    // A session refused its tenant's connection share is closed once told.
    if (!shm::WriteFrame(fd, response).ok() || session.refused()) return;
  }
}

}  // namespace kvcache
