#include "server/rpc/append_decoder.h"

#include <algorithm>
#include <string>

#include "absl/strings/str_cat.h"

namespace kvcache {
namespace {

// A cursor over a sequence of slices.
class SliceCursor {
 public:
  explicit SliceCursor(std::span<const grpc::Slice> slices) : slices_(slices) { Skip(0); }

  bool done() const { return slice_ == slices_.size(); }

  bool ReadByte(uint8_t* b) {
    if (done()) return false;
    *b = slices_[slice_].begin()[offset_];
    Skip(1);
    return true;
  }

  bool ReadVarint(uint64_t* v) {
    *v = 0;
    for (int shift = 0; shift < 64; shift += 7) {
      uint8_t b;
      if (!ReadByte(&b)) return false;
      *v |= uint64_t{b & 0x7Fu} << shift;
      if ((b & 0x80) == 0) return true;
    }
    return false;  // more than 10 bytes
  }

  // Calls `fn` with consecutive pieces covering the next `n` bytes.
  bool ForEachPiece(uint64_t n, absl::FunctionRef<bool(std::span<const std::byte>)> fn) {
    while (n > 0) {
      if (done()) return false;
      const grpc::Slice& s = slices_[slice_];
      const size_t take = std::min<uint64_t>(n, s.size() - offset_);
      if (!fn({reinterpret_cast<const std::byte*>(s.begin()) + offset_, take})) return false;
      Skip(take);
      n -= take;
    }
    return true;
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

absl::Status Malformed(std::string_view what) {
  return absl::InvalidArgumentError(absl::StrCat("malformed AppendRequest: ", std::string(what)));
}

}  // namespace

absl::Status DecodeAppendRequest(std::span<const grpc::Slice> slices,
                                 absl::FunctionRef<absl::Status(std::span<const std::byte>)> on_kv,
                                 DecodedAppend* out) {
  SliceCursor cursor(slices);
  while (!cursor.done()) {
    uint64_t tag;
    if (!cursor.ReadVarint(&tag)) return Malformed("truncated tag");
    const uint64_t field = tag >> 3;
    const uint32_t wire_type = tag & 7;
    uint64_t value;
    switch (wire_type) {
      case 0:  // varint
        if (!cursor.ReadVarint(&value)) return Malformed("truncated varint");
        continue;
      case 1:  // 64-bit
      case 5:  // 32-bit
        if (!cursor.ForEachPiece(wire_type == 1 ? 8 : 4, [](auto) { return true; })) {
          return Malformed("truncated fixed field");
        }
        continue;
      case 2:
        break;
      default:
        return Malformed(absl::StrCat("wire type ", wire_type, " of field ", field));
    }
    uint64_t length;
    if (!cursor.ReadVarint(&length)) return Malformed("truncated length");
    if (field == 2) {
      absl::Status status;
      const bool complete = cursor.ForEachPiece(length, [&](std::span<const std::byte> piece) {
        status = on_kv(piece);
        out->kv_bytes += piece.size();
        return status.ok();
      });
      if (!status.ok()) return status;
      if (!complete) return Malformed("kv_chunk runs past the message");
    } else if (field == 1) {
      std::string bytes;
      if (!cursor.ForEachPiece(length, [&](std::span<const std::byte> piece) {
            bytes.append(reinterpret_cast<const char*>(piece.data()), piece.size());
            return true;
          })) {
        return Malformed("header runs past the message");
      }
      if (!out->header.ParseFromString(bytes)) return Malformed("header does not parse");
      out->has_header = true;
    } else if (!cursor.ForEachPiece(length, [](auto) { return true; })) {
      return Malformed("field runs past the message");
    }
  }
  return absl::OkStatus();
}

}  // namespace kvcache
