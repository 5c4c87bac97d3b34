// Framing of the shared-memory data plane's socket (kvcache/v1/shm.proto):
// a 4-byte little-endian length, then that many bytes of one serialized
// message. File descriptors travel as SCM_RIGHTS ancillary data on the
// frame's first byte. Shared by the daemon and the client library.
//
// Blocking I/O on a connected Unix stream socket; EINTR is retried, partial
// reads and writes are completed, writes never raise SIGPIPE. For event
// loops, FrameAssembler reads a frame without blocking, as its bytes come,
// and EncodeFrame lays a frame out for non-blocking sends.
//
// The reader is safe against a hostile peer: a frame carries at most
// kMaxFrameFds descriptors (more, or ancillary data the kernel had to cut,
// fail the frame and every descriptor that did arrive is closed); the body's
// buffer grows only as its bytes arrive (in steps of at most kReadStepBytes
// or the bytes already read), so a header that claims a long frame costs
// nothing until the bytes come; and ReadOptions puts deadlines on the wait
// for a frame and on the frame itself.
#ifndef KVCACHE_PROTO_SHM_FRAME_H_
#define KVCACHE_PROTO_SHM_FRAME_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "google/protobuf/message_lite.h"

namespace kvcache::shm {

inline constexpr uint64_t kFrameHeaderBytes = 4;
// Most descriptors one frame may carry; more fail the frame (all are closed).
inline constexpr int kMaxFrameFds = 4;
// The body's buffer grows by at most this much (or by what was already read,
// whichever is more) before the bytes to fill it have arrived.
inline constexpr uint64_t kReadStepBytes = uint64_t{64} << 10;

// Writes `message` as one frame, with `fd` (when >= 0) attached.
// UNAVAILABLE when the peer is gone or a send timed out (SO_SNDTIMEO);
// INVALID_ARGUMENT when the message does not fit a frame.
absl::Status WriteFrame(int socket, const google::protobuf::MessageLite& message, int fd = -1);

struct ReadOptions {
  // Longest body accepted; a longer frame is RESOURCE_EXHAUSTED.
  uint64_t max_bytes = uint64_t{64} << 20;
  // Longest wait for the first byte of a frame; infinite: no limit (but the
  // socket's SO_RCVTIMEO, if set, bounds each read: DEADLINE_EXCEEDED).
  absl::Duration idle_timeout = absl::InfiniteDuration();
  // Longest a frame may take from its first byte to its last; infinite: no limit.
  absl::Duration frame_timeout = absl::InfiniteDuration();
  // No read waits past this time, whatever the timeouts say; infinite future: none.
  absl::Time deadline = absl::InfiniteFuture();
};

// Reads one frame's bytes into `body`; descriptors that came with it are
// appended to `fds` (the caller owns them, close-on-exec). On any error the
// frame's descriptors are closed and `fds` is left as it was. Errors:
// UNAVAILABLE ("closed") when the peer closed the connection before a frame
// began or broke off inside one; RESOURCE_EXHAUSTED for a frame longer than
// `max_bytes`; INVALID_ARGUMENT for a frame with more than kMaxFrameFds
// descriptors or cut ancillary data (MSG_CTRUNC); DEADLINE_EXCEEDED when a
// timeout of `options` passed. After any error but the first the connection
// is unusable (the rest of the frame was not read).
absl::Status ReadFrame(int socket, const ReadOptions& options, std::string* body,
                       std::vector<int>* fds);
// A frame laid out for sending: the 4-byte length, then `message`.
// INVALID_ARGUMENT when the message does not fit a frame.
absl::Status EncodeFrame(const google::protobuf::MessageLite& message, std::string* out);

// One frame read without blocking, a piece at a time as the socket has bytes
// (an event loop calls ReadAvailable each time the socket is readable). The
// same checks as ReadFrame: at most kMaxFrameFds descriptors, a body buffer
// that grows only as its bytes arrive, nothing read past the frame's end
// (a pipelined next frame stays in the socket). Deadlines are the caller's
// (begun() says whether the frame's first byte came). Descriptors not taken
// are closed by Reset() and the destructor.
//
//   FrameAssembler frame(max_bytes);
//   absl::StatusOr<bool> whole = frame.ReadAvailable(fd);   // on readable
//   if (whole.ok() && *whole) Handle(frame.body(), frame.TakeFds()), frame.Reset(max);
class FrameAssembler {
 public:
  explicit FrameAssembler(uint64_t max_bytes) : max_bytes_(max_bytes) {}
  ~FrameAssembler();
  FrameAssembler(const FrameAssembler&) = delete;
  FrameAssembler& operator=(const FrameAssembler&) = delete;

  // Reads what `socket` has of the frame now (MSG_DONTWAIT): true once the
  // frame is whole, false when it needs more bytes. Errors as ReadFrame's
  // (UNAVAILABLE: closed before the frame began, or broke off in it); after
  // one the connection is unusable.
  absl::StatusOr<bool> ReadAvailable(int socket);
  // Whether the frame's first byte has come.
  bool begun() const { return header_have_ > 0; }
  // The whole frame's body (valid once ReadAvailable said true).
  std::string& body() { return body_; }
  // The descriptors that came with the frame (the caller owns them then).
  std::vector<int> TakeFds();
  // Starts the next frame (closing descriptors not taken) with a new limit.
  void Reset(uint64_t max_bytes);

 private:
  // One recvmsg of at most `n` bytes into `out`, without waiting: the bytes
  // read (0: none available now).
  absl::StatusOr<size_t> ReadSome(int socket, char* out, size_t n);

  uint64_t max_bytes_;
  unsigned char header_[kFrameHeaderBytes] = {};
  size_t header_have_ = 0;
  uint32_t length_ = 0;
  size_t have_ = 0;  // body bytes read
  std::string body_;
  std::vector<int> fds_;
};

// ReadFrame without deadlines.
inline absl::Status ReadFrame(int socket, uint64_t max_bytes, std::string* body,
                              std::vector<int>* fds) {
  return ReadFrame(socket, ReadOptions{.max_bytes = max_bytes}, body, fds);
}

}  // namespace kvcache::shm

#endif  // KVCACHE_PROTO_SHM_FRAME_H_
