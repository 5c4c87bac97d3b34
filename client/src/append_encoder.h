// AppendEncoder: the wire bytes of AppendRequest{kv_chunk} as gRPC slices
// that point into the caller's memory, so an Append sends the caller's KV
// without copying it into a protobuf string first.
//
// Each chunk is one grpc::ByteBuffer of two slices: a small one holding the
// field's tag (kv_chunk = 2, length-delimited) and the varint length, then one
// over the caller's bytes. gRPC references the second slice until the
// transport has written it or dropped it, which can be a little after the call
// has finished (a stream that fails while a socket write is in flight). The
// encoder counts the slices gRPC still holds; WaitUntilReleased() blocks until
// it holds none, so the caller may reuse its memory.
//
// Thread-safe: gRPC releases slices on its own threads. The count lives apart
// from the encoder (the slices share it), so the encoder may be destroyed
// while gRPC still holds slices.
#ifndef KVCACHE_CLIENT_SRC_APPEND_ENCODER_H_
#define KVCACHE_CLIENT_SRC_APPEND_ENCODER_H_

#include <grpcpp/support/byte_buffer.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

namespace kvcache::internal {

// The most bytes KvChunkPrefix writes: a one-byte tag and a 10-byte varint.
inline constexpr size_t kMaxKvChunkPrefixBytes = 11;

// Writes the tag and length of a kv_chunk of `size` bytes to `out`; returns
// how many bytes it wrote (2 to kMaxKvChunkPrefixBytes).
size_t KvChunkPrefix(uint64_t size, uint8_t out[kMaxKvChunkPrefixBytes]);

class AppendEncoder {
 public:
  AppendEncoder();
  AppendEncoder(const AppendEncoder&) = delete;
  AppendEncoder& operator=(const AppendEncoder&) = delete;

  // AppendRequest{kv_chunk = data}, with `data` borrowed, not copied.
  // REQUIRES: `data` stays valid and unchanged until gRPC has released the
  // buffer (WaitUntilReleased() returned true).
  grpc::ByteBuffer KvChunk(std::span<const std::byte> data);

  // Blocks until gRPC has released every slice KvChunk() made, or `timeout`
  // passed; true when all are released.
  bool WaitUntilReleased(absl::Duration timeout);

  // Slices over caller memory not yet released.
  int64_t borrowed() const;

 private:
  struct Count {
    mutable absl::Mutex mu;
    int64_t borrowed ABSL_GUARDED_BY(mu) = 0;
  };
  static void Release(void* count);  // takes a std::shared_ptr<Count>*

  const std::shared_ptr<Count> count_;
};

}  // namespace kvcache::internal

#endif  // KVCACHE_CLIENT_SRC_APPEND_ENCODER_H_
