// The compressed block format: one cached block whose KV is kept at full
// precision, demoted to INT8 or INT4, or pruned.
//
// A raw block holds block_tokens tokens of every layer as
//   [layer][kv (K=0, V=1)][kv_head][token][head_dim]  elements of `dtype`
// (docs/api.md). Two versions share the magic and the 48-byte header:
//   version 1: one precision per TOKEN (full, INT8, pruned), shared by every
//              layer and KV head.
//   version 2: one precision per ENTRY (layer, kv_head, token): full, INT8,
//              INT4 or pruned.
// Both decode with ParseCompressedBlock + DecodeBlock; EncodeBlock writes
// version 1, EncodeBlockV2 version 2.
//
// Version 1. Keys and values of INT8 tokens are quantized with the kernels'
// symmetric INT8 (kvcache/kernels/quantize.h): keys per channel (one scale per
// (layer, head, channel) over the block's INT8 tokens), values per token (one
// scale per (layer, head, INT8 token)). Full tokens keep their exact bytes.
// Pruned tokens are not stored.
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
// Version 2 (E = layers * kv_heads * block_tokens entries):
//   header, 48 bytes: as version 1, but num_full, num_int8, num_pruned count
//     entries, and the version-1 `reserved` field is u32 num_int4
//     (num_full + num_int8 + num_pruned + num_int4 = E).
//   precision map: 2 bits per entry over [layer][kv_head][token]; entry i in
//     bits 2*(i%4)..2*(i%4)+1 of byte i/4 (0 full, 1 int8, 2 pruned, 3 int4),
//     zero-filled to ceil(E/4) bytes and zero-padded to 4.
//   then for each layer, for each kv head, K then V (a group); with nf, n8, n4
//   the (layer, head)'s full, INT8 and INT4 entries, each group has these
//   sections, each zero-padded to 4 bytes (an empty one takes 0 bytes):
//     1. full rows   [nf][head_dim] of dtype, token order, bit-exact copies
//     2. int8 codes  [n8][head_dim] int8, token order
//     3. int4 codes  [n4][head_dim] 4-bit codes 0..15, rows packed contiguously,
//                    element 2j in the low nibble of byte j, 2j+1 in the high
//                    one: ceil(n4 * head_dim / 2) bytes
//     4. int8 ranges in dtype; K: [head_dim] (per channel, the largest |x| over
//                    the group's INT8 entries), only when n8 > 0;
//                    V: [n8] (per token, the largest |x| of its row)
//     5. int4 ranges in dtype; K: [head_dim][2] (per channel, min then max over
//                    the group's INT4 entries), only when n4 > 0;
//                    V: [n4][2] (per token, min then max of its row)
//   Ranges are values of the group, so dtype holds them exactly and a reader
//   derives the writer's scale. In float arithmetic, round half to even:
//     INT8 (range A):      A > 0: q = rint(clamp(x * (127 / A), -127, 127)),
//                          x' = q * (A / 127); A == 0: q = 0, x' = 0
//     INT4 (range lo, hi): s = (hi - lo) / 15; s > 0: q = rint(clamp((x - lo) / s,
//                          0, 15)), x' = lo + q * s; s == 0: q = 0, x' = lo
//   then x' is rounded to dtype. (This is tests/eval/kv_quant.py's int8_sym and
//   int4_asym, operation for operation.) Groups whose float arithmetic would
//   overflow (127 / A or hi - lo not finite: fp32/bf16 ranges near the float
//   limits) use the same formulas in double, so the error bounds still hold:
//   an INT8 element is off by at most half a step (A / 254), an INT4 one by
//   half its group's step (s / 2), each plus the rounding to dtype.
//   Decoding writes full entries bit for bit, pruned entries as zeros.
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

// The precision of a token (version 1) or of an entry (version 2). kInt4 exists
// only in version 2; the version-1 functions reject it.
enum class TokenPrecision : uint8_t { kFull = 0, kInt8 = 1, kPruned = 2, kInt4 = 3 };

inline constexpr uint32_t kCompressedMagic = 0x3151564B;  // "KVQ1"
inline constexpr uint32_t kCompressedHeaderBytes = 48;
inline constexpr uint16_t kCompressedVersion1 = 1;
inline constexpr uint16_t kCompressedVersion2 = 2;

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
  // Entries of a version-2 map: num_layers * num_kv_heads * block_tokens (0 for an invalid shape).
  uint64_t entries() const;
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

// Version 2: bytes of the encoding of a block of `shape` whose entry
// (layer, head, token) has precision[(layer * num_kv_heads + head) *
// block_tokens + token]. INVALID_ARGUMENT for an invalid shape, precision.size()
// != shape.entries(), an unknown precision value, or an encoding above
// 2^32 - 1 bytes.
absl::StatusOr<uint64_t> CompressedSizeV2(const BlockShape& shape,
                                          std::span<const TokenPrecision> precision);

// Version 2: encodes `raw` (shape.raw_bytes() bytes) with one precision per
// entry (as CompressedSizeV2) into `out`, which must be exactly
// CompressedSizeV2(shape, precision) bytes. INVALID_ARGUMENT on any size or
// shape mismatch. Non-finite values in INT8/INT4 entries give unspecified
// (but in-bounds) codes: keep those entries full (KeepNonFiniteEntriesFull).
// REQUIRES: raw and out do not overlap.
absl::Status EncodeBlockV2(const BlockShape& shape, std::span<const std::byte> raw,
                           std::span<const TokenPrecision> precision, std::span<std::byte> out);

// A validated view of an encoding; points into the caller's bytes.
struct CompressedBlockView {
  uint16_t version = kCompressedVersion1;
  BlockShape shape;
  // Version 1: tokens; version 2: entries.
  uint32_t num_full = 0;
  uint32_t num_int8 = 0;
  uint32_t num_pruned = 0;
  uint32_t num_int4 = 0;                      // version 2 only
  std::span<const TokenPrecision> precision;  // version 1: block_tokens entries; version 2: empty
  std::span<const std::byte> entry_map;       // version 2: the packed map, ceil(entries / 4) bytes
  std::span<const std::byte> bytes;           // the whole encoding

  // The precision of entry (layer, head, token) in either version.
  // REQUIRES: a view from ParseCompressedBlock, indices within the shape.
  TokenPrecision EntryPrecision(uint32_t layer, uint32_t head, uint32_t token) const;
  // True when some entry of `token` is not pruned (version 1: the token is not pruned).
  bool TokenKept(uint32_t token) const;
};

// Checks magic, version (1 or 2), header_bytes, reserved == 0 (version 1),
// shape, counts against the precision map (version 2: also the map's unused
// bits and padding are zero), and that payload_bytes equals both the size the
// shape and map imply and bytes.size(); DATA_LOSS with the reason when
// anything is off. Never reads outside `bytes`.
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

// Version 2: sets to kFull every entry (layer, head, token) of `precision`
// (shape.entries() values) whose K or V row has a non-finite element. Returns
// how many entries it changed; 0 (and nothing changed) when the sizes do not
// match the shape.
uint32_t KeepNonFiniteEntriesFull(const BlockShape& shape, std::span<const std::byte> raw,
                                  std::span<TokenPrecision> precision);

// True when `bytes` starts with the compressed magic (a cheap test, not validation).
bool LooksCompressed(std::span<const std::byte> bytes);

}  // namespace kvcache::importance

#endif  // KVCACHE_SERVER_IMPORTANCE_BLOCK_CODEC_H_
