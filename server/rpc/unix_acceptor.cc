#include "server/rpc/unix_acceptor.h"

#include <grpcpp/server_posix.h>
#include <poll.h>
#include <spdlog/spdlog.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <charconv>

#include "absl/strings/str_cat.h"
#include "server/rpc/unix_peers.h"

namespace kvcache {

absl::StatusOr<std::unique_ptr<UnixAcceptor>> UnixAcceptor::Listen(const std::string& path,
                                                                   int64_t gid) {
  absl::StatusOr<UniqueFd> listener = ListenOnUnixSocket(path, gid, "listen.unix_socket");
  if (!listener.ok()) return listener.status();
  UniqueFd wake(::eventfd(0, EFD_CLOEXEC));
  if (!wake.valid()) {
    ::unlink(path.c_str());
    return absl::InternalError(absl::StrCat("listen.unix_socket: eventfd: ", ErrnoText(errno)));
  }
  return std::unique_ptr<UnixAcceptor>(
      new UnixAcceptor(path, *std::move(listener), std::move(wake)));
}

UnixAcceptor::~UnixAcceptor() {
  Stop();
  ::unlink(path_.c_str());
}

void UnixAcceptor::Start(grpc::Server* server) {
  thread_ = std::thread([this, server] { AcceptLoop(server); });
}

void UnixAcceptor::Stop() {
  if (!thread_.joinable()) return;
  const uint64_t one = 1;
  (void)!::write(wake_.get(), &one, sizeof(one));
  thread_.join();
  listener_.Reset();
}

void UnixAcceptor::AcceptLoop(grpc::Server* server) {
  for (;;) {
    pollfd fds[2] = {{listener_.get(), POLLIN, 0}, {wake_.get(), POLLIN, 0}};
    if (::poll(fds, 2, -1) < 0) {
      if (errno == EINTR) continue;
      spdlog::error("unix socket: poll: {}", ErrnoText(errno));
      return;
    }
    if (fds[1].revents != 0) return;
    if (fds[0].revents == 0) continue;
    const int fd = ::accept4(listener_.get(), nullptr, nullptr, SOCK_CLOEXEC | SOCK_NONBLOCK);
    if (fd < 0) {
      if (errno != EINTR && errno != EAGAIN && errno != ECONNABORTED) {
        spdlog::warn("unix socket: accept: {}", ErrnoText(errno));
        if (errno == EMFILE || errno == ENFILE) ::usleep(10000);  // let descriptors free up
      }
      continue;
    }
    // Its peer's credentials, bound to the descriptor gRPC gets.
    absl::StatusOr<int> adopted = UnixPeers::Process().Adopt(fd);
    if (!adopted.ok()) {
      spdlog::warn("unix socket: connection refused: {}", adopted.status().ToString());
      continue;
    }
    grpc::AddInsecureChannelFromFd(server, *adopted);  // gRPC owns and closes it from here
  }
}

std::optional<uid_t> PeerUidOf(std::string_view peer) {
  constexpr std::string_view kPrefix = "fd:";
  if (peer.substr(0, kPrefix.size()) != kPrefix) return std::nullopt;
  int fd = -1;
  const char* begin = peer.data() + kPrefix.size();
  const char* end = peer.data() + peer.size();
  if (auto [p, ec] = std::from_chars(begin, end, fd); ec != std::errc() || p != end || fd < 0) {
    return std::nullopt;
  }
  return UnixPeers::Process().UidOf(fd);
}

}  // namespace kvcache
