// The compressed block format: one cached block whose tokens are kept at full
// precision, demoted to INT8, or pruned.
//
// A raw block holds block_tokens tokens of every layer as
//   [layer][kv (K=0, V=1)][kv_head][token][head_dim]  elements of `dtype`
// (docs/api.md). A compressed block holds the same tokens with a precision per
// token (TokenPrecision). Keys and values of INT8 tokens are quantized with
// the kernels' symmetric INT8 (kvcache/kernels/quantize.h): keys per channel
// (one scale per (layer, head, channel) over the block's INT8 tokens), values
// per token (one scale per (layer, head, INT8 token)). Full tokens keep their
// exact bytes. Pruned tokens are not stored.
//
// Byte layout (little-endian, every section starts 4-byte aligned):
//   header, 48 bytes:
//     u32 magic 0x3151564B ("KVQ1")   u16 version (1)   u16 header_bytes (48)
//     u32 num_layers  u32 num_kv_heads  u32 head_dim  u32 block_tokens
//     u32 dtype (kvcache.v1.DType: 1 fp16, 2 bf16, 3 fp32)
//     u32 num_full  u32 num_int8  u32 num_pruned (sum = block_tokens)
//     u32 payload_bytes (the whole encoding, header included)  u32 reserved (0)
//   precision map: u8[block_tokens] (0 full, 1 int8, 2 pruned), zero-padded to 4
//   then for each layer, K then V, each:
//     full rows  [num_kv_heads][num_full][head_dim] of dtype, in token order,
//                zero-padded to 4 (only 16-bit dtypes with an odd element count pad)
//     int8 codes [num_kv_heads][num_int8][head_dim] int8, in token order,
//                zero-padded to 4
//     scales     f32, K: [num_kv_heads][head_dim]  V: [num_kv_heads][num_int8]
// A section with no tokens is empty (0 bytes); with num_int8 == 0 there are no
// codes and no scales.
//
// Decoding to the raw layout writes full tokens bit for bit, INT8 tokens as
// q * scale rounded to dtype (the kernels' error bound: at most half a
// quantization step), and pruned tokens as zeros.
//
// Thread-safety: every function is pure.
#ifndef KVCACHE_SERVER_IMPORTANCE_BLOCK_CODEC_H_
#define KVCACHE_SERVER_IMPORTANCE_BLOCK_CODEC_H_

#include <cstddef>
#include <cstdint>
#include <span>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace kvcache::importance {

enum class TokenPrecision : uint8_t { kFull = 0, kInt8 = 1, kPruned = 2 };

inline constexpr uint32_t kCompressedMagic = 0x3151564B;  // "KVQ1"
inline constexpr uint32_t kCompressedHeaderBytes = 48;

// The shape of a block; dtype uses kvcache.v1.DType numbering (1 fp16, 2 bf16, 3 fp32).
struct BlockShape {
  uint32_t num_layers = 0;
  uint32_t num_kv_heads = 0;
  uint32_t head_dim = 0;
  uint32_t block_tokens = 0;
  uint32_t dtype = 0;

  // Bytes of the raw block; 0 for an invalid shape (a zero dimension, a dimension above
  // kernels::kMaxDimension, unknown dtype, or more than 2^56 bytes).
  uint64_t raw_bytes() const;
};

// Bytes of the encoding of a block of `shape` with these precisions.
// INVALID_ARGUMENT for an invalid shape, precision.size() != block_tokens,
// an unknown precision value, or an encoding above 2^32 - 1 bytes (payload_bytes is u32).
absl::StatusOr<uint64_t> CompressedSize(const BlockShape& shape,
                                        std::span<const TokenPrecision> precision);

// Encodes the raw block `raw` (shape.raw_bytes() bytes) into `out`, which must
// be exactly CompressedSize(shape, precision) bytes. INVALID_ARGUMENT (nothing
// useful written) on any size or shape mismatch.
// REQUIRES: raw and out do not overlap.
absl::Status EncodeBlock(const BlockShape& shape, std::span<const std::byte> raw,
                         std::span<const TokenPrecision> precision, std::span<std::byte> out);

// A validated view of an encoding; points into the caller's bytes.
struct CompressedBlockView {
  BlockShape shape;
  uint32_t num_full = 0;
  uint32_t num_int8 = 0;
  uint32_t num_pruned = 0;
  std::span<const TokenPrecision> precision;  // block_tokens entries
  std::span<const std::byte> bytes;           // the whole encoding
};

// Checks magic, version, header_bytes, reserved == 0, shape, counts against
// the precision map, and that payload_bytes equals both the size the shape and
// counts imply and bytes.size(); DATA_LOSS with the reason when anything is
// off. Never reads outside `bytes`.
absl::StatusOr<CompressedBlockView> ParseCompressedBlock(std::span<const std::byte> bytes);

// Decodes to the raw layout: `out` must be exactly view.shape.raw_bytes().
// INVALID_ARGUMENT on a size mismatch or a view whose shape, counts, precision
// map and bytes disagree (one not made by ParseCompressedBlock).
absl::Status DecodeBlock(const CompressedBlockView& view, std::span<std::byte> out);

// Sets to kFull every token of `precision` that has a non-finite element
// (Inf or NaN) anywhere in the raw block, so INT8 never sees one: a single
// Inf would otherwise turn its key channel's scale, and every code sharing
// it, into NaN. Such tokens then round-trip exactly. Returns how many tokens
// it changed; 0 (and nothing changed) when the sizes do not match the shape.
uint32_t KeepNonFiniteTokensFull(const BlockShape& shape, std::span<const std::byte> raw,
                                 std::span<TokenPrecision> precision);

// True when `bytes` starts with the compressed magic (a cheap test, not validation).
bool LooksCompressed(std::span<const std::byte> bytes);

}  // namespace kvcache::importance

#endif  // KVCACHE_SERVER_IMPORTANCE_BLOCK_CODEC_H_
