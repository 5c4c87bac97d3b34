#include "server/frontdoor/unix_socket.h"

#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "server/common/status_macros.h"

namespace kvcache {

std::string ErrnoText(int err) { return std::strerror(err); }

UniqueFd::~UniqueFd() { Reset(); }

void UniqueFd::Reset(int fd) {
  if (fd_ >= 0) ::close(fd_);
  fd_ = fd;
}

absl::Status ClaimUnixSocketPath(const std::string& path, const char* setting) {
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  if (path.size() >= sizeof(addr.sun_path)) {
    return absl::InvalidArgumentError(absl::StrCat(setting, " \"", path, "\" is ", path.size(),
                                                   " bytes; the limit is ",
                                                   sizeof(addr.sun_path) - 1));
  }
  std::memcpy(addr.sun_path, path.data(), path.size());
  struct stat st;
  if (::lstat(path.c_str(), &st) != 0) {
    if (errno == ENOENT) return absl::OkStatus();
    return absl::FailedPreconditionError(
        absl::StrCat("unix socket ", path, ": cannot stat it: ", ErrnoText(errno)));
  }
  if (!S_ISSOCK(st.st_mode)) {
    return absl::FailedPreconditionError(
        absl::StrCat("unix socket ", path,
                     " exists and is not a socket; not replacing it (remove it or choose "
                     "another ",
                     setting, ")"));
  }
  const int fd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) {
    return absl::InternalError(absl::StrCat("unix socket: socket(): ", ErrnoText(errno)));
  }
  int connect_errno = 0;
  {
    UniqueFd closer(fd);
    if (::connect(fd, reinterpret_cast<const sockaddr*>(&addr), sizeof(addr)) != 0) {
      connect_errno = errno;
    }
  }
  if (connect_errno == 0) {
    return absl::UnavailableError(
        absl::StrCat("cannot listen on unix socket ", path,
                     ": another process is listening on it (another kvcached?)"));
  }
  if (connect_errno != ECONNREFUSED) {
    return absl::UnavailableError(absl::StrCat("cannot listen on unix socket ", path,
                                               ": probing it failed: ", ErrnoText(connect_errno)));
  }
  // A stale socket from an earlier run that did not stop cleanly.
  if (::unlink(path.c_str()) != 0 && errno != ENOENT) {
    return absl::FailedPreconditionError(
        absl::StrCat("cannot remove the stale unix socket ", path, ": ", ErrnoText(errno)));
  }
  return absl::OkStatus();
}

absl::StatusOr<UniqueFd> ListenOnUnixSocket(const std::string& path, int64_t gid,
                                            const char* setting) {
  KVCACHE_RETURN_IF_ERROR(ClaimUnixSocketPath(path, setting));
  UniqueFd listener(::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0));
  if (!listener.valid()) {
    return absl::InternalError(absl::StrCat(setting, ": socket(): ", ErrnoText(errno)));
  }
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  std::memcpy(addr.sun_path, path.data(), path.size());
  // Created rw for owner and group only; the umask closes the window before
  // the chmod below.
  const mode_t old_umask = ::umask(0777 & ~kUnixSocketMode);
  const int bound = ::bind(listener.get(), reinterpret_cast<const sockaddr*>(&addr), sizeof(addr));
  const int bind_errno = errno;
  ::umask(old_umask);
  if (bound != 0) {
    return absl::UnavailableError(
        absl::StrCat("cannot listen on ", setting, " ", path, ": ", ErrnoText(bind_errno)));
  }
  if ((gid >= 0 && ::chown(path.c_str(), static_cast<uid_t>(-1), static_cast<gid_t>(gid)) != 0) ||
      ::chmod(path.c_str(), kUnixSocketMode) != 0 || ::listen(listener.get(), 128) != 0) {
    const int err = errno;
    ::unlink(path.c_str());
    return absl::UnavailableError(
        absl::StrCat("cannot listen on ", setting, " ", path, ": ", ErrnoText(err)));
  }
  return listener;
}

}  // namespace kvcache
