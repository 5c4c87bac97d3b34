// SliceCursor: reads protobuf wire data across the slices of a gRPC message
// without copying it. The daemon decodes AppendRequests with it
// (server/rpc/append_decoder.cc) and the client FetchResponses
// (client/src/fetch_decoder.cc), both registered raw so payload bytes go
// straight from gRPC's slices to where they belong.
//
// Not thread-safe; the slices must outlive the cursor.
#ifndef KVCACHE_PROTO_SLICE_CURSOR_H_
#define KVCACHE_PROTO_SLICE_CURSOR_H_

#include <grpcpp/support/slice.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <span>

namespace kvcache::wire {

// Wire types of the protobuf encoding.
inline constexpr uint32_t kVarint = 0;
inline constexpr uint32_t kFixed64 = 1;
inline constexpr uint32_t kLengthDelimited = 2;
inline constexpr uint32_t kFixed32 = 5;

class SliceCursor {
 public:
  explicit SliceCursor(std::span<const grpc::Slice> slices) : slices_(slices) { Skip(0); }

  bool done() const { return slice_ == slices_.size(); }

  // False when the message ends inside the varint or it is longer than 10 bytes.
  bool ReadVarint(uint64_t* v) {
    *v = 0;
    for (int shift = 0; shift < 64; shift += 7) {
      if (done()) return false;
      const uint8_t b = slices_[slice_].begin()[offset_];
      Skip(1);
      *v |= uint64_t{b & 0x7Fu} << shift;
      if ((b & 0x80) == 0) return true;
    }
    return false;
  }

  // Calls `fn` with consecutive pieces covering the next `n` bytes. False
  // when the message ends first or `fn` returns false (which stops it).
  template <typename F>
  bool ForEachPiece(uint64_t n, F&& fn) {
    while (n > 0) {
      if (done()) return false;
      const grpc::Slice& s = slices_[slice_];
      const size_t take = std::min<uint64_t>(n, s.size() - offset_);
      if (!fn(std::span<const std::byte>(reinterpret_cast<const std::byte*>(s.begin()) + offset_,
                                         take))) {
        return false;
      }
      Skip(take);
      n -= take;
    }
    return true;
  }

  // Skips the next `n` bytes; false when the message ends first.
  bool SkipBytes(uint64_t n) {
    return ForEachPiece(n, [](std::span<const std::byte>) { return true; });
  }

 private:
  // Advances by n bytes within the current slice, then past empty slices.
  void Skip(size_t n) {
    offset_ += n;
    while (slice_ < slices_.size() && offset_ == slices_[slice_].size()) {
      ++slice_;
      offset_ = 0;
    }
  }

  std::span<const grpc::Slice> slices_;
  size_t slice_ = 0;
  size_t offset_ = 0;
};

}  // namespace kvcache::wire

#endif  // KVCACHE_PROTO_SLICE_CURSOR_H_
