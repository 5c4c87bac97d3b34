// Internal to the compressed block codec (block_codec.cc, block_codec_v2.cc):
// the header's field offsets and the small helpers both versions share. Not a
// public interface.
#ifndef KVCACHE_SERVER_IMPORTANCE_BLOCK_CODEC_INTERNAL_H_
#define KVCACHE_SERVER_IMPORTANCE_BLOCK_CODEC_INTERNAL_H_

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <limits>
#include <span>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "server/importance/block_codec.h"

namespace kvcache::importance::codec_internal {

// Header field offsets (see block_codec.h).
inline constexpr size_t kOffMagic = 0;
inline constexpr size_t kOffVersion = 4;
inline constexpr size_t kOffHeaderBytes = 6;
inline constexpr size_t kOffLayers = 8;
inline constexpr size_t kOffHeads = 12;
inline constexpr size_t kOffHeadDim = 16;
inline constexpr size_t kOffTokens = 20;
inline constexpr size_t kOffDType = 24;
inline constexpr size_t kOffFull = 28;
inline constexpr size_t kOffInt8 = 32;
inline constexpr size_t kOffPruned = 36;
inline constexpr size_t kOffPayload = 40;
inline constexpr size_t kOffReserved = 44;  // version 2: num_int4

inline uint64_t Pad4(uint64_t n) { return (n + 3) & ~uint64_t{3}; }

// `total`, or INVALID_ARGUMENT when an encoding that large cannot be described
// by the header's u32 payload_bytes.
inline absl::StatusOr<uint64_t> WithinPayloadLimit(uint64_t total) {
  if (total > std::numeric_limits<uint32_t>::max()) {
    return absl::InvalidArgumentError(absl::StrCat("compressed block: encoding would be ", total,
                                                   " bytes, payload_bytes is limited to ",
                                                   std::numeric_limits<uint32_t>::max()));
  }
  return total;
}

// Bytes per element of a kvcache.v1.DType; 0 for an unknown value.
inline uint64_t ElementBytes(uint32_t dtype) {
  switch (dtype) {
    case 1:  // fp16
    case 2:  // bf16
      return 2;
    case 3:  // fp32
      return 4;
    default:
      return 0;
  }
}

inline void PutU16(std::byte* p, uint16_t v) { std::memcpy(p, &v, sizeof(v)); }
inline void PutU32(std::byte* p, uint32_t v) { std::memcpy(p, &v, sizeof(v)); }
inline uint16_t GetU16(const std::byte* p) {
  uint16_t v;
  std::memcpy(&v, p, sizeof(v));
  return v;
}
inline uint32_t GetU32(const std::byte* p) {
  uint32_t v;
  std::memcpy(&v, p, sizeof(v));
  return v;
}

inline std::string ShapeString(const BlockShape& s) {
  return absl::StrCat("num_layers=", s.num_layers, " num_kv_heads=", s.num_kv_heads,
                      " head_dim=", s.head_dim, " block_tokens=", s.block_tokens,
                      " dtype=", s.dtype);
}

inline absl::Status DataLoss(const std::string& reason) {
  return absl::DataLossError(absl::StrCat("compressed block: ", reason));
}

// The block shape a header (at least kCompressedHeaderBytes) names; DATA_LOSS
// when it is not a valid shape.
inline absl::StatusOr<BlockShape> ReadShape(const std::byte* header) {
  BlockShape shape;
  shape.num_layers = GetU32(header + kOffLayers);
  shape.num_kv_heads = GetU32(header + kOffHeads);
  shape.head_dim = GetU32(header + kOffHeadDim);
  shape.block_tokens = GetU32(header + kOffTokens);
  shape.dtype = GetU32(header + kOffDType);
  if (shape.raw_bytes() == 0) {
    return DataLoss(absl::StrCat("invalid shape (", ShapeString(shape), ")"));
  }
  return shape;
}

// Version 2's parts of ParseCompressedBlock and DecodeBlock (block_codec_v2.cc).
// REQUIRES (ParseV2): bytes.size() >= kCompressedHeaderBytes, magic, version 2 and
// header_bytes already checked.
absl::StatusOr<CompressedBlockView> ParseV2(std::span<const std::byte> bytes);
absl::Status DecodeV2(const CompressedBlockView& view, std::span<std::byte> out);

}  // namespace kvcache::importance::codec_internal

#endif  // KVCACHE_SERVER_IMPORTANCE_BLOCK_CODEC_INTERNAL_H_
