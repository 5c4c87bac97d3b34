#include "fetch_decoder.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "kvcache/slice_cursor.h"

namespace kvcache::internal {
namespace {

using wire::kFixed32;
using wire::kFixed64;
using wire::kLengthDelimited;
using wire::kVarint;
using wire::SliceCursor;

// FetchResponse field numbers (kvcache.proto).
enum Field : uint64_t {
  kMatchedTokens = 1,
  kBlockIndex = 2,
  kBlockBytes = 3,
  kBlockChecksum = 4,
  kOffset = 5,
  kEncoding = 6,
  kKeptTokens = 7,
  kWithheldTokens = 8,
  kData = 15,
};

absl::Status Malformed(absl::string_view what) {
  return absl::DataLossError(absl::StrCat("Fetch: malformed FetchResponse: ", what));
}

}  // namespace

absl::Status DecodeFetchResponse(std::span<const grpc::Slice> slices, FetchChunk* out) {
  *out = FetchChunk();
  SliceCursor cursor(slices);
  while (!cursor.done()) {
    uint64_t tag;
    if (!cursor.ReadVarint(&tag)) return Malformed("truncated tag");
    const uint64_t field = tag >> 3;
    const uint32_t wire_type = tag & 7;
    if (field == 0) return Malformed("field number 0");
    const bool known = field <= kWithheldTokens || field == kData;
    // kept_tokens is the one known field with two wire types (packed or not).
    const uint32_t want = field == kData                                          ? kLengthDelimited
                          : field == kKeptTokens && wire_type == kLengthDelimited ? kLengthDelimited
                                                                                  : kVarint;
    if (known && wire_type != want) {
      return Malformed(
          absl::StrCat("field ", field, " has wire type ", wire_type, ", expected ", want));
    }
    uint64_t value = 0;
    switch (wire_type) {
      case kVarint:
        if (!cursor.ReadVarint(&value)) {
          return Malformed(absl::StrCat("truncated varint in field ", field));
        }
        switch (field) {
          case kMatchedTokens:
            out->matched_tokens = value;
            break;
          case kBlockIndex:
            out->block_index = static_cast<uint32_t>(value);
            break;
          case kBlockBytes:
            out->block_bytes = value;
            break;
          case kBlockChecksum:
            out->block_checksum = value;
            break;
          case kOffset:
            out->offset = value;
            break;
          case kEncoding:
            out->encoding = static_cast<int32_t>(value);
            break;
          case kKeptTokens:
            out->kept_tokens.push_back(static_cast<uint32_t>(value));
            break;
          case kWithheldTokens:
            out->withheld_tokens = value;
            break;
          default:
            break;  // unknown: skipped
        }
        continue;
      case kFixed64:
      case kFixed32:
        if (!cursor.SkipBytes(wire_type == kFixed64 ? 8 : 4)) {
          return Malformed(absl::StrCat("truncated fixed-size field ", field));
        }
        continue;
      case kLengthDelimited:
        break;
      default:
        return Malformed(absl::StrCat("wire type ", wire_type, " of field ", field));
    }
    uint64_t length;
    if (!cursor.ReadVarint(&length)) {
      return Malformed(absl::StrCat("truncated length of field ", field));
    }
    bool complete;
    if (field == kData) {
      out->data.clear();  // the last occurrence wins
      out->data_size = length;
      complete = cursor.ForEachPiece(length, [&](std::span<const std::byte> piece) {
        if (!piece.empty()) out->data.push_back(piece);
        return true;
      });
    } else if (field == kKeptTokens) {
      // Packed varints: collect the bytes (a few KB at most), then split.
      std::vector<uint8_t> packed;
      complete = cursor.ForEachPiece(length, [&](std::span<const std::byte> piece) {
        const auto* p = reinterpret_cast<const uint8_t*>(piece.data());
        packed.insert(packed.end(), p, p + piece.size());
        return true;
      });
      if (complete) {
        grpc::Slice packed_slice(packed.data(), packed.size());
        SliceCursor tokens(std::span<const grpc::Slice>(&packed_slice, 1));
        while (!tokens.done()) {
          uint64_t t;
          if (!tokens.ReadVarint(&t)) return Malformed("truncated varint in packed kept_tokens");
          out->kept_tokens.push_back(static_cast<uint32_t>(t));
        }
      }
    } else {
      complete = cursor.SkipBytes(length);
    }
    if (!complete) {
      return Malformed(
          absl::StrCat("field ", field, " declares ", length, " bytes and runs past the message"));
    }
  }
  return absl::OkStatus();
}

FetchChunk ChunkOf(const v1::FetchResponse& msg) {
  FetchChunk c;
  c.matched_tokens = msg.matched_tokens();
  c.block_index = msg.block_index();
  c.block_bytes = msg.block_bytes();
  c.block_checksum = msg.block_checksum();
  c.offset = msg.offset();
  c.encoding = msg.encoding();
  c.kept_tokens.assign(msg.kept_tokens().begin(), msg.kept_tokens().end());
  c.withheld_tokens = msg.withheld_tokens();
  if (!msg.data().empty()) {
    c.data.push_back(std::as_bytes(std::span(msg.data().data(), msg.data().size())));
  }
  c.data_size = msg.data().size();
  return c;
}

}  // namespace kvcache::internal
