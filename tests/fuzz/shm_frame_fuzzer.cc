// Fuzz target: the shared-memory socket's framing (proto/kvcache/shm_frame.h),
// the first thing the daemon reads from a peer that has not authenticated,
// with file descriptors riding on the bytes as SCM_RIGHTS.
//
// Input: byte 0 picks the frame limit (its low 4 bits: 2^bits bytes, 16 at
// least); then pieces, each a length byte, a descriptor count byte (low 3
// bits: 0..7 copies of one pipe end) and that many bytes. Every piece is one
// sendmsg on a socketpair (a piece that would block ends the input); then the
// sending end is closed and ReadFrame reads frames until it fails.
// Properties: it never crashes or blocks; it fails only with UNAVAILABLE,
// RESOURCE_EXHAUSTED or INVALID_ARGUMENT; a frame it accepts is at most the
// limit and carries at most kMaxFrameFds descriptors, each open; and once
// the caller has closed those and the socket, no descriptor is left open.
#include <fcntl.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <string>
#include <vector>

#include "kvcache/shm_frame.h"
#include "tests/fuzz/fuzz_check.h"

namespace {

int OpenFds() {
  int n = 0;
  for (int fd = 0; fd < 1024; ++fd) {
    if (::fcntl(fd, F_GETFD) != -1) ++n;
  }
  return n;
}

// Sends `bytes` with `n` copies of `fd`; false when the socket is full.
bool Send(int socket, const uint8_t* bytes, size_t size, int fd, int n) {
  iovec iov{const_cast<uint8_t*>(bytes), size};
  msghdr msg{};
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int) * 8)];
  if (n > 0) {
    msg.msg_control = control;
    msg.msg_controllen = CMSG_SPACE(sizeof(int) * n);
    cmsghdr* c = CMSG_FIRSTHDR(&msg);
    c->cmsg_level = SOL_SOCKET;
    c->cmsg_type = SCM_RIGHTS;
    c->cmsg_len = CMSG_LEN(sizeof(int) * n);
    for (int i = 0; i < n; ++i) std::memcpy(CMSG_DATA(c) + i * sizeof(int), &fd, sizeof(int));
  }
  return ::sendmsg(socket, &msg, MSG_NOSIGNAL | MSG_DONTWAIT) == static_cast<ssize_t>(size);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const int before = OpenFds();
  kvcache::fuzz::InputReader in(data, size);
  const uint64_t max_bytes = uint64_t{1} << std::max(4, in.Byte() & 0x0f);
  int pair[2];
  int pipe[2];
  FUZZ_CHECK(::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, pair) == 0);
  FUZZ_CHECK(::pipe2(pipe, O_CLOEXEC) == 0);
  while (in.rest_size() > 0) {
    const size_t wanted = in.Byte();
    const int fds = in.Byte() & 7;
    const size_t length = std::min(wanted, in.rest_size());
    if (length == 0) continue;  // a descriptor needs a byte to ride on
    const uint8_t* bytes = in.rest();
    for (size_t i = 0; i < length; ++i) in.Byte();
    if (!Send(pair[1], bytes, length, pipe[0], fds)) break;
  }
  ::close(pair[1]);
  ::close(pipe[0]);
  ::close(pipe[1]);
  for (;;) {
    std::string body;
    std::vector<int> fds;
    const absl::Status s = kvcache::shm::ReadFrame(
        pair[0], kvcache::shm::ReadOptions{.max_bytes = max_bytes}, &body, &fds);
    if (!s.ok()) {
      FUZZ_CHECK(s.code() == absl::StatusCode::kUnavailable ||
                 s.code() == absl::StatusCode::kResourceExhausted ||
                 s.code() == absl::StatusCode::kInvalidArgument);
      FUZZ_CHECK(fds.empty());
      break;
    }
    FUZZ_CHECK(body.size() <= max_bytes);
    FUZZ_CHECK(fds.size() <= static_cast<size_t>(kvcache::shm::kMaxFrameFds));
    for (int fd : fds) {
      FUZZ_CHECK(::fcntl(fd, F_GETFD) != -1);
      ::close(fd);
    }
  }
  ::close(pair[0]);
  FUZZ_CHECK(OpenFds() == before);
  return 0;
}
