#include "server/rpc/append_decoder.h"

#include <algorithm>
#include <string>

#include "absl/strings/str_cat.h"
#include "kvcache/slice_cursor.h"

namespace kvcache {
namespace {

using wire::SliceCursor;

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
        if (!cursor.SkipBytes(wire_type == wire::kFixed64 ? 8 : 4)) {
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
    } else if (!cursor.SkipBytes(length)) {
      return Malformed("field runs past the message");
    }
  }
  return absl::OkStatus();
}

}  // namespace kvcache
