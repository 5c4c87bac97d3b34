#include "kvcache/shm_frame.h"

#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "absl/strings/str_cat.h"

namespace kvcache::shm {
namespace {

absl::Status Errno(const char* what) {
  const int err = errno;
  if (err == EPIPE || err == ECONNRESET || err == ENOTCONN) {
    return absl::UnavailableError(absl::StrCat(what, ": the connection is closed"));
  }
  return absl::UnavailableError(absl::StrCat(what, ": ", std::strerror(err)));
}

// Collects the descriptors of `msg`'s SCM_RIGHTS messages into `fds`.
void TakeFds(msghdr* msg, std::vector<int>* fds) {
  for (cmsghdr* c = CMSG_FIRSTHDR(msg); c != nullptr; c = CMSG_NXTHDR(msg, c)) {
    if (c->cmsg_level != SOL_SOCKET || c->cmsg_type != SCM_RIGHTS) continue;
    const size_t n = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);
    const int* received = reinterpret_cast<const int*>(CMSG_DATA(c));
    for (size_t i = 0; i < n; ++i) {
      int fd;
      std::memcpy(&fd, received + i, sizeof(fd));
      fds->push_back(fd);
    }
  }
}

// Reads exactly `n` bytes into `out`, taking any descriptors that arrive.
// `*got_any` tells whether a byte was read before an EOF.
absl::Status ReadFull(int socket, char* out, size_t n, std::vector<int>* fds, bool* got_any) {
  alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int) * kMaxFrameFds)];
  size_t done = 0;
  while (done < n) {
    iovec iov{out + done, n - done};
    msghdr msg{};
    msg.msg_iov = &iov;
    msg.msg_iovlen = 1;
    msg.msg_control = control;
    msg.msg_controllen = sizeof(control);
    const ssize_t r = ::recvmsg(socket, &msg, MSG_CMSG_CLOEXEC);
    if (r < 0) {
      if (errno == EINTR) continue;
      return Errno("shared-memory socket read");
    }
    TakeFds(&msg, fds);
    if (r == 0) return absl::UnavailableError("the shared-memory connection is closed");
    done += static_cast<size_t>(r);
    *got_any = true;
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status WriteFrame(int socket, const google::protobuf::MessageLite& message, int fd) {
  const size_t size = message.ByteSizeLong();
  if (size > UINT32_MAX) {
    return absl::InvalidArgumentError(absl::StrCat("a frame of ", size, " bytes is too long"));
  }
  std::string buffer(kFrameHeaderBytes + size, '\0');
  const uint32_t length = static_cast<uint32_t>(size);
  for (int i = 0; i < 4; ++i) buffer[i] = static_cast<char>((length >> (8 * i)) & 0xff);
  if (!message.SerializeWithCachedSizesToArray(
          reinterpret_cast<uint8_t*>(buffer.data() + kFrameHeaderBytes))) {
    return absl::InternalError("cannot serialize a shared-memory frame");
  }
  size_t done = 0;
  bool fd_sent = fd < 0;
  while (done < buffer.size()) {
    iovec iov{buffer.data() + done, buffer.size() - done};
    msghdr msg{};
    msg.msg_iov = &iov;
    msg.msg_iovlen = 1;
    alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int))];
    if (!fd_sent) {
      msg.msg_control = control;
      msg.msg_controllen = sizeof(control);
      cmsghdr* c = CMSG_FIRSTHDR(&msg);
      c->cmsg_level = SOL_SOCKET;
      c->cmsg_type = SCM_RIGHTS;
      c->cmsg_len = CMSG_LEN(sizeof(int));
      std::memcpy(CMSG_DATA(c), &fd, sizeof(int));
    }
    const ssize_t w = ::sendmsg(socket, &msg, MSG_NOSIGNAL);
    if (w < 0) {
      if (errno == EINTR) continue;
      return Errno("shared-memory socket write");
    }
    fd_sent = true;
    done += static_cast<size_t>(w);
  }
  return absl::OkStatus();
}

absl::Status ReadFrame(int socket, uint64_t max_bytes, std::string* body, std::vector<int>* fds) {
  unsigned char header[kFrameHeaderBytes];
  bool got_any = false;
  absl::Status s = ReadFull(socket, reinterpret_cast<char*>(header), sizeof(header), fds, &got_any);
  if (!s.ok()) {
    if (got_any) return absl::UnavailableError("the shared-memory connection broke off in a frame");
    return s;
  }
  uint32_t length = 0;
  for (int i = 0; i < 4; ++i) length |= static_cast<uint32_t>(header[i]) << (8 * i);
  if (length > max_bytes) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "a shared-memory frame of ", length, " bytes is longer than the limit of ", max_bytes));
  }
  body->resize(length);
  s = ReadFull(socket, body->data(), length, fds, &got_any);
  if (!s.ok() && length > 0) {
    return absl::UnavailableError("the shared-memory connection broke off in a frame");
  }
  return absl::OkStatus();
}

}  // namespace kvcache::shm
