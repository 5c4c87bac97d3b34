#include "server/shm/shm_server.h"

#include <fcntl.h>
#include <spdlog/spdlog.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
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

int MillisecondsUntil(absl::Time deadline, absl::Time now) {
  if (deadline == absl::InfiniteFuture()) return -1;
  if (deadline <= now) return 0;
  return static_cast<int>(std::min<int64_t>(
      absl::ToInt64Milliseconds(absl::Ceil(deadline - now, absl::Milliseconds(1))), 1 << 30));
}

}  // namespace

struct ShmServer::Connection {
  explicit Connection(uint64_t hello_frame_bytes) : frame(hello_frame_bytes) {}

  UniqueFd fd;
  ucred peer{};
  absl::Time accepted;
  std::unique_ptr<ShmSession> session;
  // The frame being read, and when its first byte came (infinite future: not yet).
  shm::FrameAssembler frame;
  absl::Time frame_began = absl::InfiniteFuture();
  bool greeted = false;  // a hello was answered OK
  // The answer being sent: its bytes, how many went, and since when the
  // peer is slow to take them.
  std::string out;
  size_t out_sent = 0;
  absl::Time out_since;
  bool close_after_answer = false;  // a refused session, or a send that failed
  // The loop's view: handed to a worker (queued or being answered), and
  // whether the socket is in epoll.
  bool with_worker = false;
  bool armed = false;

  bool writing() const { return out_sent < out.size(); }
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
  epoll_event listen_event{.events = EPOLLIN, .data = {.ptr = &kListenerTag}};
  epoll_event wake_event{.events = EPOLLIN, .data = {.ptr = &kWakeTag}};
  if (!epoll_.valid() || !wake_.valid() ||
      ::epoll_ctl(epoll_.get(), EPOLL_CTL_ADD, listener_.get(), &listen_event) != 0 ||
      ::epoll_ctl(epoll_.get(), EPOLL_CTL_ADD, wake_.get(), &wake_event) != 0) {
    spdlog::critical("shm socket: cannot set up the event loop: {}", ErrnoText(errno));
    std::abort();
  }
  uint32_t workers = options.worker_threads;
  if (workers == 0) workers = std::max(8u, 4 * std::thread::hardware_concurrency());
  for (uint32_t i = 0; i < workers; ++i) workers_.emplace_back([this] { Work(); });
  loop_ = std::thread([this] { Loop(); });
}

ShmServer::~ShmServer() { Shutdown(); }

int ShmServer::connections() const {
  MutexLock lock(&mu_);
  return open_count_;
}

int ShmServer::threads() const { return 1 + static_cast<int>(workers_.size()); }

void ShmServer::Shutdown() {
  {
    MutexLock lock(&mu_);
    if (shut_down_) return;
    shut_down_ = true;
    stopping_ = true;
  }
  // The loop stops accepting and closes every connection not being served.
  const uint64_t one = 1;
  (void)!::write(wake_.get(), &one, sizeof(one));
  const auto drained = [this] {
    mu_.AssertHeld();
    return busy_.empty();
  };
  mu_.Lock();  // drained_ waits on the Mutex itself, which the analysis follows
  if (!drained_.wait_for(mu_, absl::ToChronoNanoseconds(options_.drain_timeout), drained)) {
    // Requests still being served after the bound: their sockets are shut
    // down both ways, so what reads or writes them fails at once and the
    // worker is free after the step it is in.
    for (Connection* c : busy_) {
      spdlog::warn(
          "shm socket: shutting down: cut off the connection of pid {} (uid {}) still busy after "
          "{}",
          c->peer.pid, c->peer.uid, absl::FormatDuration(options_.drain_timeout));
      ::shutdown(c->fd.get(), SHUT_RDWR);
    }
    drained_.wait(mu_, drained);
  }
  loop_done_ = true;
  mu_.Unlock();
  work_ready_.notify_all();
  (void)!::write(wake_.get(), &one, sizeof(one));
  loop_.join();
  for (std::thread& t : workers_) t.join();
  ::unlink(options_.socket_path.c_str());
}

// ---- the event loop ------------------------------------------------------------

void ShmServer::Loop() {
  constexpr int kEvents = 64;
  epoll_event events[kEvents];
  bool accepting = true;
  for (;;) {
    const int n =
        ::epoll_wait(epoll_.get(), events, kEvents, MillisecondsUntil(next_deadline_, absl::Now()));
    if (n < 0 && errno != EINTR) {
      spdlog::error("shm socket: epoll_wait: {}", ErrnoText(errno));
      absl::SleepFor(absl::Milliseconds(10));
    }
    for (int i = 0; i < std::max(n, 0); ++i) {
      void* tag = events[i].data.ptr;
      if (tag == &kWakeTag) {
        uint64_t count;
        (void)!::read(wake_.get(), &count, sizeof(count));
        continue;
      }
      if (tag == &kListenerTag) {
        for (;;) {
          UniqueFd fd(::accept4(listener_.get(), nullptr, nullptr, SOCK_CLOEXEC));
          if (!fd.valid()) {
            if (errno != EINTR && errno != EAGAIN && errno != EWOULDBLOCK &&
                errno != ECONNABORTED) {
              spdlog::warn("shm socket: accept: {}", ErrnoText(errno));
            }
            if (errno == EINTR || errno == ECONNABORTED) continue;
            break;
          }
          Admit(std::move(fd));
        }
        continue;
      }
      Connection* c = static_cast<Connection*>(tag);
      if (c->with_worker || !open_.contains(c)) continue;  // closed earlier in this batch
      if (c->writing()) {
        OnWritable(c);
      } else {
        OnReadable(c);
      }
    }
    std::vector<Connection*> back;
    bool stopping = false;
    bool done = false;
    {
      MutexLock lock(&mu_);
      back.swap(returned_);
      stopping = stopping_;
      done = loop_done_;
    }
    for (Connection* c : back) TakeBack(c);
    if (stopping) {
      if (accepting) {
        (void)::epoll_ctl(epoll_.get(), EPOLL_CTL_DEL, listener_.get(), nullptr);
        listener_.Reset();
        accepting = false;
      }
      std::vector<Connection*> idle;
      for (Connection* c : open_) {
        if (!c->with_worker) idle.push_back(c);
      }
      for (Connection* c : idle) {
        if (c->writing()) {
          spdlog::warn(
              "shm socket: shutting down: cut off the connection of pid {} (uid {}), which did "
              "not read its answer",
              c->peer.pid, c->peer.uid);
        }
        Close(c);
      }
      if (done && open_.empty()) return;
    }
    // Each connection's deadline lowered next_deadline_ as it was set
    // (Watch); one that passed sends the loop round all of them.
    const absl::Time now = absl::Now();
    if (now >= next_deadline_) next_deadline_ = EnforceDeadlines(now);
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
  {
    MutexLock lock(&mu_);
    if (stopping_) {
      return AnswerOnce(fd.get(), absl::UnavailableError("the daemon is shutting down"));
    }
    if (static_cast<uint32_t>(open_count_) >= options_.max_connections) {
      observer_->OnLimitReached("ShmConnect", "shm.max_connections");
      return AnswerOnce(fd.get(), absl::ResourceExhaustedError(
                                      absl::StrCat("the daemon serves ", open_count_,
                                                   " shared-memory connections, the limit "
                                                   "(shm.max_connections)")));
    }
    ++open_count_;
  }
  spdlog::debug("shm socket: connection from pid {} (uid {}, gid {})", peer.pid, peer.uid,
                peer.gid);
  connection->fd = std::move(fd);
  connection->session = std::make_unique<ShmSession>(
      options_.limits, cache_, &copier_, observer_,
      ShmPeer{.peer = absl::StrCat("shm:pid=", peer.pid, ",uid=", peer.uid),
              .inflight = options_.inflight,
              .uid = peer.uid,
              .access = options_.access,
              .fair = options_.fair},
      budget_.get());
  Connection* c = connection.release();
  open_.insert(c);
  Arm(c, /*add=*/true);
}

void ShmServer::Arm(Connection* c, bool add) {
  epoll_event event{.events = static_cast<uint32_t>(c->writing() ? EPOLLOUT : EPOLLIN),
                    .data = {.ptr = c}};
  const int op = add ? EPOLL_CTL_ADD : EPOLL_CTL_MOD;
  if (::epoll_ctl(epoll_.get(), op, c->fd.get(), &event) != 0) {
    spdlog::warn("shm socket: epoll_ctl: {}; closing the connection of pid {}", ErrnoText(errno),
                 c->peer.pid);
    c->armed = add ? false : c->armed;
    return Close(c);
  }
  c->armed = true;
  Watch(*c);
}

void ShmServer::Watch(const Connection& c) {
  next_deadline_ = std::min(next_deadline_, DeadlineOf(c));
}

void ShmServer::Close(Connection* c) {
  if (c->armed) (void)::epoll_ctl(epoll_.get(), EPOLL_CTL_DEL, c->fd.get(), nullptr);
  open_.erase(c);
  c->session.reset();  // its regions unmap here
  c->fd.Reset();
  delete c;
  MutexLock lock(&mu_);
  --open_count_;
}

void ShmServer::OnReadable(Connection* c) {
  absl::StatusOr<bool> whole = c->frame.ReadAvailable(c->fd.get());
  if (!whole.ok()) {
    // Closed, broken, or unusable after a refused frame (told why).
    if (absl::IsResourceExhausted(whole.status()) || absl::IsInvalidArgument(whole.status())) {
      AnswerOnce(c->fd.get(), whole.status());
    }
    return Close(c);
  }
  if (c->frame.begun() && c->frame_began == absl::InfiniteFuture()) {
    c->frame_began = absl::Now();
    Watch(*c);
  }
  if (!*whole) return;
  // The whole frame goes to a worker; the socket is out of epoll until the
  // answer is sent (a pipelined next frame waits in it).
  c->frame_began = absl::InfiniteFuture();
  (void)::epoll_ctl(epoll_.get(), EPOLL_CTL_DEL, c->fd.get(), nullptr);
  c->armed = false;
  c->with_worker = true;
  {
    MutexLock lock(&mu_);
    busy_.insert(c);
    requests_.push_back(c);
  }
  work_ready_.notify_one();
}

void ShmServer::OnWritable(Connection* c) {
  if (!SendSome(c->fd.get(), c->out, &c->out_sent).ok()) return Close(c);
  if (c->writing()) return;
  c->out.clear();
  c->out_sent = 0;
  if (c->close_after_answer) return Close(c);
  Arm(c, /*add=*/false);  // reading again
}

void ShmServer::TakeBack(Connection* c) {
  c->with_worker = false;
  if (c->writing()) {
    c->out_since = absl::Now();
    return Arm(c, /*add=*/true);
  }
  c->out.clear();
  c->out_sent = 0;
  if (c->close_after_answer) return Close(c);
  Arm(c, /*add=*/true);
}

absl::Time ShmServer::DeadlineOf(const Connection& c) const {
  if (c.with_worker) return absl::InfiniteFuture();
  absl::Time deadline = absl::InfiniteFuture();
  if (!c.greeted) deadline = c.accepted + options_.hello_timeout;
  if (c.writing()) return std::min(deadline, c.out_since + options_.io_timeout);
  if (c.greeted && c.frame_began != absl::InfiniteFuture()) {
    deadline = std::min(deadline, c.frame_began + options_.io_timeout);
  }
  return deadline;
}

absl::Time ShmServer::EnforceDeadlines(absl::Time now) {
  absl::Time next = absl::InfiniteFuture();
  std::vector<Connection*> late;
  for (Connection* c : open_) {
    const absl::Time deadline = DeadlineOf(*c);
    if (deadline <= now) {
      late.push_back(c);
    } else {
      next = std::min(next, deadline);
    }
  }
  for (Connection* c : late) {
    const char* what = c->writing()       ? "an answer was not read"
                       : c->frame.begun() ? "a frame did not arrive whole"
                                          : "no frame began";
    spdlog::info("shm socket: cut off pid {} (uid {}): {} in time{}", c->peer.pid, c->peer.uid,
                 what, c->greeted ? "" : " (before its hello)");
    Close(c);
  }
  return next;
}

// ---- the workers ---------------------------------------------------------------

void ShmServer::Work() {
  for (;;) {
    Connection* c = nullptr;
    {
      MutexLock lock(&mu_);
      const auto ready = [this] {
        mu_.AssertHeld();
        return !requests_.empty() || loop_done_;
      };
      mu_.AssertHeld();
      while (!ready()) work_ready_.wait(mu_);
      if (requests_.empty()) return;  // shutting down, nothing left
      c = requests_.front();
      requests_.pop_front();
    }
    Answer(*c);
    {
      MutexLock lock(&mu_);
      busy_.erase(c);
      returned_.push_back(c);
    }
    drained_.notify_all();
    const uint64_t one = 1;
    (void)!::write(wake_.get(), &one, sizeof(one));
  }
}

void ShmServer::Answer(Connection& c) {
  std::vector<UniqueFd> fds;
  for (int f : c.frame.TakeFds()) fds.emplace_back(f);
  v1::ShmRequest request;
  v1::ShmResponse response;
  if (!request.ParseFromString(c.frame.body())) {
    response.set_code(static_cast<int>(absl::StatusCode::kInvalidArgument));
    response.set_message("the request frame is not a kvcache.v1.ShmRequest");
  } else if (!c.greeted && request.op_case() != v1::ShmRequest::kHello) {
    response.set_code(static_cast<int>(absl::StatusCode::kFailedPrecondition));
    response.set_message(
        "the first request on a shared-memory connection is a hello (its version, and the "
        "token with authentication on)");
  } else {
    response = c.session->Handle(request, std::move(fds));
    if (!c.greeted && request.op_case() == v1::ShmRequest::kHello && response.code() == 0) {
      c.greeted = true;
    }
  }
  c.frame.Reset(c.greeted ? options_.limits.max_frame_bytes
                          : std::min(kMaxHelloFrameBytes, options_.limits.max_frame_bytes));
  // A session refused its tenant's connection share is closed once told.
  c.close_after_answer = c.session->refused();
  c.out_sent = 0;
  if (!shm::EncodeFrame(response, &c.out).ok() || !SendSome(c.fd.get(), c.out, &c.out_sent).ok()) {
    c.out.clear();
    c.out_sent = 0;
    c.close_after_answer = true;
  }
}

}  // namespace kvcache
