#include "kvcache/shm_frame.h"

#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"

namespace kvcache::shm {
namespace {

absl::Status Errno(const char* what) {
  const int err = errno;
  if (err == EPIPE || err == ECONNRESET || err == ENOTCONN) {
    return absl::UnavailableError(absl::StrCat(what, ": the connection is closed"));
  }
  if (err == EAGAIN || err == EWOULDBLOCK) {
    return absl::UnavailableError(
        absl::StrCat(what, ": timed out (SO_SNDTIMEO; the peer does not read)"));
  }
  return absl::UnavailableError(absl::StrCat(what, ": ", std::strerror(err)));
}

// Collects the descriptors of `msg`'s SCM_RIGHTS messages into `fds`.
void CollectFds(msghdr* msg, std::vector<int>* fds) {
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

// What one read of a frame's bytes got: bytes, the end of the stream, or
// nothing yet (a read that was not to wait).
struct Piece {
  size_t bytes = 0;
  bool closed = false;
  bool nothing_yet = false;
};

// One recvmsg of at most `n` bytes into `out`, waiting unless `dont_wait`;
// the descriptors that came with them are added to `fds`, which may hold at
// most kMaxFrameFds in all.
absl::StatusOr<Piece> ReceivePiece(int socket, char* out, size_t n, bool dont_wait,
                                   std::vector<int>* fds) {
  alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int) * kMaxFrameFds)];
  for (;;) {
    iovec iov{out, n};
    msghdr msg{};
    msg.msg_iov = &iov;
    msg.msg_iovlen = 1;
    msg.msg_control = control;
    msg.msg_controllen = sizeof(control);
    const ssize_t r = ::recvmsg(socket, &msg, MSG_CMSG_CLOEXEC | (dont_wait ? MSG_DONTWAIT : 0));
    if (r < 0) {
      if (errno == EINTR) continue;
      if (errno == EAGAIN || errno == EWOULDBLOCK) return Piece{.nothing_yet = true};
      return Errno("shared-memory socket read");
    }
    CollectFds(&msg, fds);
    if ((msg.msg_flags & MSG_CTRUNC) != 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          "a shared-memory frame came with more ancillary data than ", kMaxFrameFds,
          " descriptors (cut by the kernel); the descriptors that arrived were closed"));
    }
    if (fds->size() > static_cast<size_t>(kMaxFrameFds)) {
      return absl::InvalidArgumentError(absl::StrCat("a shared-memory frame carries more than ",
                                                     kMaxFrameFds,
                                                     " file descriptors; all of them were closed"));
    }
    if (r == 0) return Piece{.closed = true};
    return Piece{.bytes = static_cast<size_t>(r)};
  }
}

// Reads the bytes of one frame: the deadlines, the descriptors that came
// with it, and whether any byte came at all.
class FrameReader {
 public:
  FrameReader(int socket, const ReadOptions& options) : socket_(socket), options_(options) {
    deadline_ = DeadlineAfter(options.idle_timeout);
  }
  ~FrameReader() {
    for (int fd : taken_) ::close(fd);
  }
  FrameReader(const FrameReader&) = delete;
  FrameReader& operator=(const FrameReader&) = delete;

  bool got_any() const { return got_any_; }
  // Hands the frame's descriptors to `fds` (the reader closes none then).
  void Release(std::vector<int>* fds) {
    fds->insert(fds->end(), taken_.begin(), taken_.end());
    taken_.clear();
  }

  // Reads at least one and at most `n` bytes into `out`; `*got` says how many.
  absl::Status ReadSome(char* out, size_t n, size_t* got) {
    for (;;) {
      // With no deadline the read blocks (within the socket's SO_RCVTIMEO,
      // if the caller set one); with one, poll() waits for it.
      const bool bounded = deadline_ != absl::InfiniteFuture();
      if (bounded) {
        if (absl::Status s = WaitReadable(); !s.ok()) return s;
      }
      absl::StatusOr<Piece> piece = ReceivePiece(socket_, out, n, bounded, &taken_);
      if (!piece.ok()) return piece.status();
      if (piece->nothing_yet) {
        if (bounded) continue;  // woken for nothing: poll again
        return absl::DeadlineExceededError("a shared-memory socket read timed out (SO_RCVTIMEO)");
      }
      if (piece->closed) return absl::UnavailableError("the shared-memory connection is closed");
      if (!got_any_) {
        got_any_ = true;
        deadline_ = DeadlineAfter(options_.frame_timeout);
      }
      *got = piece->bytes;
      return absl::OkStatus();
    }
  }

  // Reads exactly `n` bytes into `out`.
  absl::Status ReadFull(char* out, size_t n) {
    for (size_t done = 0; done < n;) {
      size_t got = 0;
      if (absl::Status s = ReadSome(out + done, n - done, &got); !s.ok()) return s;
      done += got;
    }
    return absl::OkStatus();
  }

 private:
  absl::Time DeadlineAfter(absl::Duration timeout) const {
    const absl::Time after =
        timeout == absl::InfiniteDuration() ? absl::InfiniteFuture() : absl::Now() + timeout;
    return std::min(after, options_.deadline);
  }

  // Waits until the socket has bytes (or an EOF or error) to read, or the
  // deadline passes.
  absl::Status WaitReadable() {
    for (;;) {
      int wait_ms = -1;
      if (deadline_ != absl::InfiniteFuture()) {
        const absl::Duration left = deadline_ - absl::Now();
        if (left <= absl::ZeroDuration()) return TimedOut();
        wait_ms = static_cast<int>(std::min<int64_t>(
            absl::ToInt64Milliseconds(absl::Ceil(left, absl::Milliseconds(1))), 1 << 30));
      }
      pollfd p{socket_, POLLIN, 0};
      const int n = ::poll(&p, 1, wait_ms);
      if (n < 0) {
        if (errno == EINTR) continue;
        return Errno("shared-memory socket poll");
      }
      if (n == 0) continue;  // the deadline is checked above
      return absl::OkStatus();
    }
  }

  absl::Status TimedOut() const {
    if (deadline_ == options_.deadline) {
      return absl::DeadlineExceededError(
          got_any_ ? "a shared-memory frame did not arrive whole by the connection's deadline"
                   : "no shared-memory frame began by the connection's deadline");
    }
    return absl::DeadlineExceededError(
        got_any_ ? absl::StrCat("a shared-memory frame did not arrive whole within ",
                                absl::FormatDuration(options_.frame_timeout))
                 : absl::StrCat("no shared-memory frame began within ",
                                absl::FormatDuration(options_.idle_timeout)));
  }

  const int socket_;
  const ReadOptions& options_;
  absl::Time deadline_;
  std::vector<int> taken_;  // this frame's descriptors, until Release()
  bool got_any_ = false;
};

}  // namespace

absl::Status EncodeFrame(const google::protobuf::MessageLite& message, std::string* out) {
  const size_t size = message.ByteSizeLong();
  if (size > UINT32_MAX) {
    return absl::InvalidArgumentError(absl::StrCat("a frame of ", size, " bytes is too long"));
  }
  std::string& buffer = *out;
  buffer.assign(kFrameHeaderBytes + size, '\0');
  const uint32_t length = static_cast<uint32_t>(size);
  for (int i = 0; i < 4; ++i) buffer[i] = static_cast<char>((length >> (8 * i)) & 0xff);
  if (!message.SerializeWithCachedSizesToArray(
          reinterpret_cast<uint8_t*>(buffer.data() + kFrameHeaderBytes))) {
    return absl::InternalError("cannot serialize a shared-memory frame");
  }
  return absl::OkStatus();
}

absl::Status WriteFrame(int socket, const google::protobuf::MessageLite& message, int fd) {
  std::string buffer;
  if (absl::Status s = EncodeFrame(message, &buffer); !s.ok()) return s;
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

absl::Status ReadFrame(int socket, const ReadOptions& options, std::string* body,
                       std::vector<int>* fds) {
  FrameReader reader(socket, options);
  unsigned char header[kFrameHeaderBytes];
  absl::Status s = reader.ReadFull(reinterpret_cast<char*>(header), sizeof(header));
  if (!s.ok()) {
    if (reader.got_any() && absl::IsUnavailable(s)) {
      return absl::UnavailableError("the shared-memory connection broke off in a frame");
    }
    return s;
  }
  uint32_t length = 0;
  for (int i = 0; i < 4; ++i) length |= static_cast<uint32_t>(header[i]) << (8 * i);
  if (length > options.max_bytes) {
    return absl::ResourceExhaustedError(absl::StrCat("a shared-memory frame of ", length,
                                                     " bytes is longer than the limit of ",
                                                     options.max_bytes));
  }
  // The buffer grows only as bytes arrive: a header claiming a long frame
  // costs at most kReadStepBytes until its bytes come.
  body->clear();
  size_t have = 0;
  while (have < length) {
    if (body->size() == have) {
      const size_t step = std::max<size_t>(kReadStepBytes, have);
      body->resize(std::min<size_t>(length, have + step));
    }
    size_t got = 0;
    s = reader.ReadSome(body->data() + have, body->size() - have, &got);
    if (!s.ok()) {
      body->clear();
      if (absl::IsUnavailable(s)) {
        return absl::UnavailableError("the shared-memory connection broke off in a frame");
      }
      return s;
    }
    have += got;
  }
  reader.Release(fds);
  return absl::OkStatus();
}

FrameAssembler::~FrameAssembler() {
  for (int fd : fds_) ::close(fd);
}

std::vector<int> FrameAssembler::TakeFds() {
  std::vector<int> out;
  out.swap(fds_);
  return out;
}

void FrameAssembler::Reset(uint64_t max_bytes) {
  for (int fd : fds_) ::close(fd);
  fds_.clear();
  max_bytes_ = max_bytes;
  header_have_ = 0;
  length_ = 0;
  have_ = 0;
  body_.clear();
}

absl::StatusOr<size_t> FrameAssembler::ReadSome(int socket, char* out, size_t n) {
  absl::StatusOr<Piece> piece = ReceivePiece(socket, out, n, /*dont_wait=*/true, &fds_);
  if (!piece.ok()) return piece.status();
  if (piece->closed) {
    return begun() ? absl::UnavailableError("the shared-memory connection broke off in a frame")
                   : absl::UnavailableError("the shared-memory connection is closed");
  }
  return piece->bytes;  // 0: nothing yet
}

absl::StatusOr<bool> FrameAssembler::ReadAvailable(int socket) {
  while (header_have_ < kFrameHeaderBytes) {
    absl::StatusOr<size_t> got = ReadSome(socket, reinterpret_cast<char*>(header_) + header_have_,
                                          kFrameHeaderBytes - header_have_);
    if (!got.ok()) return got.status();
    if (*got == 0) return false;
    header_have_ += *got;
    if (header_have_ < kFrameHeaderBytes) continue;
    for (int i = 0; i < 4; ++i) length_ |= static_cast<uint32_t>(header_[i]) << (8 * i);
    if (length_ > max_bytes_) {
      return absl::ResourceExhaustedError(absl::StrCat(
          "a shared-memory frame of ", length_, " bytes is longer than the limit of ", max_bytes_));
    }
  }
  // The buffer grows only as bytes arrive, as ReadFrame's.
  while (have_ < length_) {
    if (body_.size() == have_) {
      const size_t step = std::max<size_t>(kReadStepBytes, have_);
      body_.resize(std::min<size_t>(length_, have_ + step));
    }
    absl::StatusOr<size_t> got = ReadSome(socket, body_.data() + have_, body_.size() - have_);
    if (!got.ok()) return got.status();
    if (*got == 0) return false;
    have_ += *got;
  }
  return true;
}

}  // namespace kvcache::shm
