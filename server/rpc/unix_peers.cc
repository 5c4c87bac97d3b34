#include "server/rpc/unix_peers.h"

#include <fcntl.h>
#include <spdlog/spdlog.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "absl/strings/str_cat.h"

namespace kvcache {

UnixPeers::UnixPeers(UnixPeersOptions options)
    : options_(options), placeholder_(::open("/dev/null", O_RDONLY | O_CLOEXEC)) {}

UnixPeers::~UnixPeers() {
  MutexLock lock(&mu_);
  for (const auto& [fd, since] : held_) ::close(fd);
  if (placeholder_ >= 0) ::close(placeholder_);
}

UnixPeers& UnixPeers::Process() {
  static UnixPeers* const peers = new UnixPeers();  // never destroyed: handlers may run late
  return *peers;
}

absl::StatusOr<int> UnixPeers::Adopt(int fd) {
  ucred cred{};
  socklen_t length = sizeof(cred);
  struct stat st {};
  if (::getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cred, &length) != 0 || ::fstat(fd, &st) != 0) {
    const int err = errno;
    ::close(fd);
    return absl::InternalError(
        absl::StrCat("cannot read the peer's credentials (SO_PEERCRED): ", std::strerror(err)));
  }
  MutexLock lock(&mu_);
  const absl::Time now = options_.clock->Now();
  ReleaseLocked(now);
  // A number in the table was a connection's, and is free again only because
  // gRPC closed it: calls of that connection may still ask for its uid.
  while (peers_.contains(fd)) {
    const int moved = ::fcntl(fd, F_DUPFD_CLOEXEC, 0);
    if (moved < 0 || placeholder_ < 0 || ::dup3(placeholder_, fd, O_CLOEXEC) < 0) {
      const int err = moved < 0 ? errno : placeholder_ < 0 ? EBADF : errno;
      if (moved >= 0) ::close(moved);
      ::close(fd);
      return absl::InternalError(
          absl::StrCat("cannot move a connection off a reused descriptor: ", std::strerror(err)));
    }
    peers_.erase(fd);
    held_.emplace_back(fd, now);
    fd = moved;
  }
  peers_[fd] = Peer{.uid = cred.uid, .dev = st.st_dev, .ino = st.st_ino};
  ReleaseLocked(now);
  return fd;
}

void UnixPeers::ReleaseLocked(absl::Time now) {
  while (!held_.empty() && (now - held_.front().second >= options_.quarantine ||
                            held_.size() > options_.max_quarantined)) {
    if (now - held_.front().second < options_.quarantine) {
      spdlog::warn("unix socket: {} descriptors of closed connections held; releasing one early",
                   held_.size());
    }
    ::close(held_.front().first);
    held_.pop_front();
  }
}

std::optional<uid_t> UnixPeers::UidOf(int fd) const {
  struct stat st {};
  if (fd < 0 || ::fstat(fd, &st) != 0) return std::nullopt;
  MutexLock lock(&mu_);
  auto it = peers_.find(fd);
  if (it == peers_.end() || it->second.dev != st.st_dev || it->second.ino != st.st_ino) {
    return std::nullopt;
  }
  return it->second.uid;
}

size_t UnixPeers::quarantined() const {
  MutexLock lock(&mu_);
  return held_.size();
}

}  // namespace kvcache
