#include "server/shm/shm_server.h"

#include <fcntl.h>
#include <spdlog/spdlog.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "kvcache/shm_frame.h"
#include "kvcache/v1/shm.pb.h"

namespace kvcache {

namespace {

// Tags of the loop's own descriptors in epoll (connections are tagged with
// their Connection*).
char kListenerTag;
char kWakeTag;

// Sends what it can of `bytes` from `*sent` on without blocking. OK with
// `*sent` short of the end when the socket is full; UNAVAILABLE when the
// peer is gone.
absl::Status SendSome(int fd, const std::string& bytes, size_t* sent) {
  while (*sent < bytes.size()) {
    const ssize_t w =
        ::send(fd, bytes.data() + *sent, bytes.size() - *sent, MSG_DONTWAIT | MSG_NOSIGNAL);
    if (w < 0) {
      if (errno == EINTR) continue;
      if (errno == EAGAIN || errno == EWOULDBLOCK) return absl::OkStatus();
      return absl::UnavailableError(absl::StrCat("shared-memory socket write: ", ErrnoText(errno)));
    }
    *sent += static_cast<size_t>(w);
  }
  return absl::OkStatus();
}

// epoll_ctl. Under ThreadSanitizer the call goes around its interceptor,
// which counts it as an access to `fd` that nothing orders before the close
// by the worker the event then wakes (epoll is not a hand-over it models);
// Connection::handovers orders everything else.
int EpollCtl(int epfd, int op, int fd, epoll_event* event) {
#if defined(__SANITIZE_THREAD__)
  return static_cast<int>(::syscall(SYS_epoll_ctl, epfd, op, fd, event));
#else
  return ::epoll_ctl(epfd, op, fd, event);
#endif
}

// An error answer sent once, without waiting (a refusal, a frame that could
// not be read): a fresh or idle socket has room for it; a peer that does not
// read simply misses it.
void AnswerOnce(int fd, const absl::Status& status) {
  v1::ShmResponse response;
  response.set_code(static_cast<int>(status.code()));
  response.set_message(std::string(status.message()));
  std::string frame;
  if (!shm::EncodeFrame(response, &frame).ok()) return;
  size_t sent = 0;
  (void)SendSome(fd, frame, &sent);
}

}  // namespace

// What a connection waits for, and so which deadline applies (for the log).
enum class Waiting : uint8_t { kHello, kFrame, kNextFrame, kAnswerRead };

struct ShmServer::Connection {
  explicit Connection(uint64_t hello_frame_bytes) : frame(hello_frame_bytes) {}

  // Set before the connection is armed, read by the janitor under the
  // server's mu_ (Close removes it from open_ under mu_ before closing it).
  UniqueFd fd;
  ucred peer{};
  absl::Time accepted;
  // The rest is touched only by the worker the connection's last event woke
  // (it is armed one-shot), or by the thread that answers its request while
  // it is unarmed (ShmSession::Handle), so it needs no lock.
  std::unique_ptr<ShmSession> session;
  shm::FrameAssembler frame;  // the frame being read
  bool greeted = false;       // a hello was answered OK
  std::string out;            // the answer being sent, and how much went
  size_t out_sent = 0;
  bool close_after_answer = false;  // a refused session, or a send that failed
  // When the connection is cut off unless its wait ends (unix nanoseconds;
  // INT64_MAX: never), and what it waits for: set by its owner, read by the
  // janitor.
  std::atomic<int64_t> deadline_ns{std::numeric_limits<int64_t>::max()};
  std::atomic<Waiting> waiting{Waiting::kHello};
  // Bumped (release) each time the connection is armed and read (acquire)
  // by whoever its event wakes: epoll hands the connection over, and this
  // makes the hand-over one a race detector sees too.
  std::atomic<uint64_t> handovers{0};

  bool writing() const { return out_sent < out.size(); }
  void SetDeadline(Waiting what, absl::Time at) {
    waiting.store(what, std::memory_order_relaxed);
    deadline_ns.store(
        at == absl::InfiniteFuture() ? std::numeric_limits<int64_t>::max() : absl::ToUnixNanos(at),
        std::memory_order_relaxed);
  }
};

absl::StatusOr<std::unique_ptr<ShmServer>> ShmServer::Start(const ShmServerOptions& options,
                                                            Cache* cache, RpcObserver* observer) {
  absl::StatusOr<UniqueFd> listener =
      ListenOnUnixSocket(options.socket_path, options.socket_gid, "listen.shm_socket");
  if (!listener.ok()) return listener.status();
  const int flags = ::fcntl(listener->get(), F_GETFL);
  if (flags < 0 || ::fcntl(listener->get(), F_SETFL, flags | O_NONBLOCK) != 0) {
    return absl::InternalError(
        absl::StrCat("listen.shm_socket: cannot make it non-blocking: ", ErrnoText(errno)));
  }
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
      epoll_(::epoll_create1(EPOLL_CLOEXEC)),
      wake_(::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK)) {
  // The listener is one-shot like the connections (whoever is woken accepts
  // and arms it again); the wake descriptor is level-triggered, so once
  // written it wakes every worker, and stays readable.
  epoll_event listen_event{.events = EPOLLIN | EPOLLONESHOT, .data = {.ptr = &kListenerTag}};
  epoll_event wake_event{.events = EPOLLIN, .data = {.ptr = &kWakeTag}};
  if (!epoll_.valid() || !wake_.valid() ||
      ::epoll_ctl(epoll_.get(), EPOLL_CTL_ADD, listener_.get(), &listen_event) != 0 ||
      ::epoll_ctl(epoll_.get(), EPOLL_CTL_ADD, wake_.get(), &wake_event) != 0) {
    spdlog::critical("shm socket: cannot set up its epoll set: {}", ErrnoText(errno));
    std::abort();
  }
  uint32_t workers = options.worker_threads;
  if (workers == 0) workers = std::max(8u, 4 * std::thread::hardware_concurrency());
  for (uint32_t i = 0; i < workers; ++i) workers_.emplace_back([this] { Work(); });
  janitor_ = std::thread([this] { Janitor(); });
}

ShmServer::~ShmServer() { Shutdown(); }

int ShmServer::connections() const {
  MutexLock lock(&mu_);
  return static_cast<int>(open_.size());
}

int ShmServer::threads() const { return static_cast<int>(workers_.size()) + 1; }

void ShmServer::Shutdown() {
  const auto all_closed = [this] {
    mu_.AssertHeld();
    return open_.empty();
  };
  mu_.Lock();  // closed_ waits on the Mutex itself, which the analysis follows
  if (shut_down_) {
    mu_.Unlock();
    return;
  }
  shut_down_ = true;
  stopping_ = true;
  // No more accepts. An idle connection reads EOF and closes; one being
  // served finishes its request (its answer may still go out), then reads
  // EOF and closes.
  (void)::epoll_ctl(epoll_.get(), EPOLL_CTL_DEL, listener_.get(), nullptr);
  for (Connection* c : open_) ::shutdown(c->fd.get(), SHUT_RD);
  if (!closed_.wait_for(mu_, absl::ToChronoNanoseconds(options_.drain_timeout), all_closed)) {
    // Still open after the bound: busy with a request, or an answer the
    // peer does not read. Their sockets are shut down both ways, so what
    // reads or writes them fails at once and the worker closes them after
    // the step it is in.
    for (Connection* c : open_) {
      spdlog::warn(
          "shm socket: shutting down: cut off the connection of pid {} (uid {}) still busy after "
          "{}",
          c->peer.pid, c->peer.uid, absl::FormatDuration(options_.drain_timeout));
      ::shutdown(c->fd.get(), SHUT_RDWR);
    }
    closed_.wait(mu_, all_closed);
  }
  mu_.Unlock();
  closed_.notify_all();  // the janitor
  const uint64_t one = 1;
  (void)!::write(wake_.get(), &one, sizeof(one));
  for (std::thread& t : workers_) t.join();
  janitor_.join();
  listener_.Reset();
  ::unlink(options_.socket_path.c_str());
}

// ---- the workers ---------------------------------------------------------------

void ShmServer::Work() {
  for (;;) {
    epoll_event event;
    const int n = ::epoll_wait(epoll_.get(), &event, 1, -1);
    if (n < 0) {
      if (errno == EINTR) continue;
      spdlog::error("shm socket: epoll_wait: {}", ErrnoText(errno));
      absl::SleepFor(absl::Milliseconds(10));
      continue;
    }
    void* tag = event.data.ptr;
    if (tag == &kWakeTag) return;
    if (tag == &kListenerTag) {
      AcceptAll();
      continue;
    }
    Step(static_cast<Connection*>(tag));
  }
}

void ShmServer::AcceptAll() {
  for (;;) {
    UniqueFd fd(::accept4(listener_.get(), nullptr, nullptr, SOCK_CLOEXEC));
    if (!fd.valid()) {
      if (errno == EINTR || errno == ECONNABORTED) continue;
      if (errno != EAGAIN && errno != EWOULDBLOCK) {
        spdlog::warn("shm socket: accept: {}", ErrnoText(errno));
      }
      break;
    }
    Admit(std::move(fd));
  }
  MutexLock lock(&mu_);
  if (stopping_) return;  // Shutdown() took the listener out of the set
  epoll_event event{.events = EPOLLIN | EPOLLONESHOT, .data = {.ptr = &kListenerTag}};
  if (::epoll_ctl(epoll_.get(), EPOLL_CTL_MOD, listener_.get(), &event) != 0) {
    spdlog::error("shm socket: cannot arm the listener again: {}", ErrnoText(errno));
  }
}

void ShmServer::Admit(UniqueFd fd) {
  auto connection =
      std::make_unique<Connection>(std::min(kMaxHelloFrameBytes, options_.limits.max_frame_bytes));
  connection->accepted = absl::Now();
  socklen_t length = sizeof(connection->peer);
  if (::getsockopt(fd.get(), SOL_SOCKET, SO_PEERCRED, &connection->peer, &length) != 0) {
    return AnswerOnce(fd.get(),
                      absl::InternalError("cannot read the peer's credentials (SO_PEERCRED)"));
  }
  // No check of the peer's uid or gid here: the socket file's mode (0660,
  // the socket's group) decides who can connect, supplementary group members
  // included; authentication, when on, decides what the session may do.
  const ucred& peer = connection->peer;
  connection->SetDeadline(Waiting::kHello, connection->accepted + options_.hello_timeout);
  Connection* c = connection.get();
  {
    MutexLock lock(&mu_);
    if (stopping_) {
      return AnswerOnce(fd.get(), absl::UnavailableError("the daemon is shutting down"));
    }
    if (open_.size() >= options_.max_connections) {
      observer_->OnLimitReached("ShmConnect", "shm.max_connections");
      return AnswerOnce(fd.get(), absl::ResourceExhaustedError(
                                      absl::StrCat("the daemon serves ", open_.size(),
                                                   " shared-memory connections, the limit "
                                                   "(shm.max_connections)")));
    }
    c->fd = std::move(fd);
    open_.insert(connection.release());
  }
  spdlog::debug("shm socket: connection from pid {} (uid {}, gid {})", peer.pid, peer.uid,
                peer.gid);
  // Not armed yet, so still this worker's alone (the janitor and Shutdown()
  // touch only its socket).
  c->session = std::make_unique<ShmSession>(
      options_.limits, cache_, &copier_, observer_,
      ShmPeer{.peer = absl::StrCat("shm:pid=", peer.pid, ",uid=", peer.uid),
              .inflight = options_.inflight,
              .uid = peer.uid,
              .access = options_.access,
              .fair = options_.fair,
              .shared = options_.shared},
      budget_.get());
  epoll_event event{.events = EPOLLIN | EPOLLONESHOT, .data = {.ptr = c}};
  const int socket = c->fd.get();  // read before the hand-over: c is the next owner's after it
  c->handovers.fetch_add(1, std::memory_order_release);
  if (EpollCtl(epoll_.get(), EPOLL_CTL_ADD, socket, &event) != 0) {
    spdlog::warn("shm socket: epoll_ctl: {}; closing the connection of pid {}", ErrnoText(errno),
                 peer.pid);
    Close(c);
  }
}

void ShmServer::Step(Connection* c) {
  (void)c->handovers.load(std::memory_order_acquire);
  if (c->writing()) {
    if (!SendSome(c->fd.get(), c->out, &c->out_sent).ok()) return Close(c);
    if (c->writing()) return Rearm(c);
    c->out.clear();
    c->out_sent = 0;
    if (c->close_after_answer) return Close(c);
    return Rearm(c);  // reading again
  }
  absl::StatusOr<bool> whole = c->frame.ReadAvailable(c->fd.get());
  if (!whole.ok()) {
    // Closed, broken, or unusable after a refused frame (told why).
    if (absl::IsResourceExhausted(whole.status()) || absl::IsInvalidArgument(whole.status())) {
      AnswerOnce(c->fd.get(), whole.status());
    }
    return Close(c);
  }
  if (!*whole) {
    // A frame once begun must come whole in time (a stranger's hello
    // deadline stands).
    if (c->greeted && c->frame.begun() &&
        c->waiting.load(std::memory_order_relaxed) != Waiting::kFrame) {
      c->SetDeadline(Waiting::kFrame, absl::Now() + options_.io_timeout);
    }
    return Rearm(c);
  }
  Answer(c);
}

void ShmServer::Rearm(Connection* c) {
  // Waiting for a next frame that has not begun: no deadline (pooled
  // connections idle). A stranger's hello deadline, a frame begun and an
  // answer being sent keep theirs.
  if (!c->writing() && c->greeted && !c->frame.begun()) {
    c->SetDeadline(Waiting::kNextFrame, absl::InfiniteFuture());
  }
  epoll_event event{
      .events = static_cast<uint32_t>((c->writing() ? EPOLLOUT : EPOLLIN) | EPOLLONESHOT),
      .data = {.ptr = c}};
  const int fd = c->fd.get();  // read before the hand-over: c is the next owner's after it
  c->handovers.fetch_add(1, std::memory_order_release);
  if (EpollCtl(epoll_.get(), EPOLL_CTL_MOD, fd, &event) != 0) {
    spdlog::warn("shm socket: epoll_ctl: {}; closing the connection of pid {}", ErrnoText(errno),
                 c->peer.pid);
    Close(c);
  }
}

void ShmServer::Close(Connection* c) {
  (void)::epoll_ctl(epoll_.get(), EPOLL_CTL_DEL, c->fd.get(), nullptr);
  {
    MutexLock lock(&mu_);
    open_.erase(c);
  }
  closed_.notify_all();
  c->session.reset();  // its regions unmap here
  delete c;            // closes the socket
}

void ShmServer::Answer(Connection* c) {
  std::vector<UniqueFd> fds;
  for (int f : c->frame.TakeFds()) fds.emplace_back(f);
  v1::ShmRequest request;
  v1::ShmResponse refusal;
  if (!request.ParseFromString(c->frame.body())) {
    refusal.set_code(static_cast<int>(absl::StatusCode::kInvalidArgument));
    refusal.set_message("the request frame is not a kvcache.v1.ShmRequest");
    return Respond(c, std::move(refusal));
  }
  if (!c->greeted && request.op_case() != v1::ShmRequest::kHello) {
    refusal.set_code(static_cast<int>(absl::StatusCode::kFailedPrecondition));
    refusal.set_message(
        "the first request on a shared-memory connection is a hello (its version, and the "
        "token with authentication on)");
    return Respond(c, std::move(refusal));
  }
  // The connection stays unarmed until the answer is sent: whichever
  // thread the session answers on owns it meanwhile.
  c->session->Handle(std::move(request), std::move(fds),
                     [this, c](v1::ShmResponse response) { Respond(c, std::move(response)); });
}

void ShmServer::Respond(Connection* c, v1::ShmResponse response) {
  if (!c->greeted && response.has_hello() && response.code() == 0) c->greeted = true;
  c->frame.Reset(c->greeted ? options_.limits.max_frame_bytes
                            : std::min(kMaxHelloFrameBytes, options_.limits.max_frame_bytes));
  // A session refused its tenant's connection share is closed once told.
  c->close_after_answer = c->session->refused();
  c->out_sent = 0;
  if (!shm::EncodeFrame(response, &c->out).ok() ||
      !SendSome(c->fd.get(), c->out, &c->out_sent).ok()) {
    c->out.clear();
    c->out_sent = 0;
    c->close_after_answer = true;
  }
  if (c->writing()) {
    // A stranger's hello deadline stands whatever it leaves unread.
    if (c->greeted) {
      c->SetDeadline(Waiting::kAnswerRead, absl::Now() + options_.io_timeout);
    } else {
      c->SetDeadline(Waiting::kHello, std::min(absl::Now() + options_.io_timeout,
                                               c->accepted + options_.hello_timeout));
    }
  } else if (c->close_after_answer) {
    return Close(c);
  }
  Rearm(c);
}

// ---- the janitor ---------------------------------------------------------------

void ShmServer::Janitor() {
  // Deadlines are seconds long: a check every tenth of the shortest is close
  // enough, and costs a walk of the open connections.
  const absl::Duration tick = std::clamp(std::min(options_.hello_timeout, options_.io_timeout) / 10,
                                         absl::Milliseconds(5), absl::Milliseconds(100));
  MutexLock lock(&mu_);
  while (!stopping_) {
    const int64_t now = absl::ToUnixNanos(absl::Now());
    for (Connection* c : open_) {
      if (c->deadline_ns.load(std::memory_order_relaxed) > now) continue;
      c->SetDeadline(c->waiting.load(std::memory_order_relaxed), absl::InfiniteFuture());
      const char* what = "no frame began";
      switch (c->waiting.load(std::memory_order_relaxed)) {
        case Waiting::kHello:
          what = "no hello answered";
          break;
        case Waiting::kFrame:
          what = "a frame did not arrive whole";
          break;
        case Waiting::kAnswerRead:
          what = "an answer was not read";
          break;
        case Waiting::kNextFrame:
          break;
      }
      spdlog::info("shm socket: cut off pid {} (uid {}): {} in time", c->peer.pid, c->peer.uid,
                   what);
      // The owner of its next event (the hang-up) closes it.
      ::shutdown(c->fd.get(), SHUT_RDWR);
    }
    closed_.wait_for(mu_, absl::ToChronoNanoseconds(tick));
  }
}

}  // namespace kvcache
