// Framing of the shared-memory data plane's socket (kvcache/v1/shm.proto):
// a 4-byte little-endian length, then that many bytes of one serialized
// message. File descriptors travel as SCM_RIGHTS ancillary data on the
// frame's first byte. Shared by the daemon and the client library.
//
// Blocking I/O on a connected Unix stream socket; EINTR is retried, partial
// reads and writes are completed, writes never raise SIGPIPE.
#ifndef KVCACHE_PROTO_SHM_FRAME_H_
#define KVCACHE_PROTO_SHM_FRAME_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "google/protobuf/message_lite.h"

namespace kvcache::shm {

inline constexpr uint64_t kFrameHeaderBytes = 4;
// Most descriptors one frame may carry; more are closed and refused.
inline constexpr int kMaxFrameFds = 4;

// Writes `message` as one frame, with `fd` (when >= 0) attached.
// UNAVAILABLE when the peer is gone; INVALID_ARGUMENT when the message does
// not fit a frame.
absl::Status WriteFrame(int socket, const google::protobuf::MessageLite& message, int fd = -1);

// Reads one frame's bytes into `body`; descriptors that came with it are
// appended to `fds` (the caller owns them, close-on-exec). UNAVAILABLE
// ("closed") when the peer closed the connection before a frame began or
// broke off inside one; RESOURCE_EXHAUSTED for a frame longer than
// `max_bytes` (its bytes are not read: the connection is unusable after).
absl::Status ReadFrame(int socket, uint64_t max_bytes, std::string* body, std::vector<int>* fds);

}  // namespace kvcache::shm

#endif  // KVCACHE_PROTO_SHM_FRAME_H_
