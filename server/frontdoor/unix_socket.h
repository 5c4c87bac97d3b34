// Unix-socket helpers shared by the daemon's listeners (the gRPC socket and
// the shared-memory data plane's socket).
#ifndef KVCACHE_SERVER_FRONTDOOR_UNIX_SOCKET_H_
#define KVCACHE_SERVER_FRONTDOOR_UNIX_SOCKET_H_

#include <sys/types.h>

#include <cstdint>
#include <string>
#include <string_view>
#include <utility>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace kvcache {

// Permissions of the daemon's Unix sockets: read/write for owner and group.
inline constexpr mode_t kUnixSocketMode = 0660;

// strerror(err) as a string.
std::string ErrnoText(int err);

// Owns a file descriptor: closes it when destroyed or reset.
class UniqueFd {
 public:
  UniqueFd() = default;
  explicit UniqueFd(int fd) : fd_(fd) {}
  ~UniqueFd();
  UniqueFd(UniqueFd&& other) noexcept : fd_(std::exchange(other.fd_, -1)) {}
  UniqueFd& operator=(UniqueFd&& other) noexcept {
    if (this != &other) Reset(std::exchange(other.fd_, -1));
    return *this;
  }
  UniqueFd(const UniqueFd&) = delete;
  UniqueFd& operator=(const UniqueFd&) = delete;

  int get() const { return fd_; }
  bool valid() const { return fd_ >= 0; }
  // Gives up ownership without closing.
  int Release() { return std::exchange(fd_, -1); }
  // Closes the current descriptor and owns `fd` instead.
  void Reset(int fd = -1);

 private:
  int fd_ = -1;
};

// Makes `path` free for a listening Unix socket: nothing there, or a stale
// socket (one that refuses connections), which is removed. Anything else is
// left alone and refused: a socket a live process listens on (UNAVAILABLE),
// a path that is not a socket (FAILED_PRECONDITION), a path too long
// (INVALID_ARGUMENT). `setting` names the config field in messages.
absl::Status ClaimUnixSocketPath(const std::string& path, const char* setting);

// Claims `path` (above) and listens on it: a socket of mode 0660 owned by group
// `gid` (-1: the daemon's). UNAVAILABLE naming `setting` when it cannot.
absl::StatusOr<UniqueFd> ListenOnUnixSocket(const std::string& path, int64_t gid,
                                            const char* setting);

}  // namespace kvcache

#endif  // KVCACHE_SERVER_FRONTDOOR_UNIX_SOCKET_H_
