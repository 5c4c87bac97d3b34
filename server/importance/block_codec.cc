#include "server/importance/block_codec.h"

#include <algorithm>
#include <bit>
#include <cstring>
#include <initializer_list>
#include <limits>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "kvcache/kernels/gather.h"
#include "kvcache/kernels/quantize.h"
#include "kvcache/kernels/types.h"
#include "server/importance/block_codec_internal.h"

namespace kvcache::importance {
namespace {

using namespace codec_internal;  // NOLINT: the codec's own helpers

static_assert(std::endian::native == std::endian::little,
              "the compressed block format is little-endian and written with memcpy");
static_assert(sizeof(TokenPrecision) == 1, "the precision map is one byte per token");

constexpr uint16_t kVersion = kCompressedVersion1;
// Largest raw block accepted: keeps every size computed here far from uint64 overflow.
constexpr uint64_t kMaxRawBytes = uint64_t{1} << 56;

// kvcache.v1.DType -> kernels::DType. REQUIRES: ElementBytes(dtype) != 0.
kernels::DType KernelDType(uint32_t dtype) {
  switch (dtype) {
    case 1:
      return kernels::DType::kFloat16;
    case 2:
      return kernels::DType::kBFloat16;
    default:
      return kernels::DType::kFloat32;
  }
}

bool Aligned(const void* p, size_t alignment) {
  return reinterpret_cast<uintptr_t>(p) % alignment == 0;
}

struct Counts {
  uint64_t full = 0;
  uint64_t int8 = 0;
  uint64_t pruned = 0;
};

// Counts the precisions; false (with *bad set to the first offending index) on an unknown value.
bool CountPrecision(std::span<const TokenPrecision> precision, Counts* counts, size_t* bad) {
  uint64_t n[3] = {0, 0, 0};
  for (size_t t = 0; t < precision.size(); ++t) {
    const auto v = static_cast<uint8_t>(precision[t]);
    if (v > 2) {
      *bad = t;
      return false;
    }
    ++n[v];
  }
  *counts = Counts{n[0], n[1], n[2]};
  return true;
}

// Byte sizes of the sections of an encoding.
struct Layout {
  uint64_t map_bytes = 0;      // precision map, padded
  uint64_t full_data = 0;      // one K or V full-rows section, unpadded
  uint64_t full_bytes = 0;     // the same, padded
  uint64_t code_data = 0;      // one K or V codes section, unpadded
  uint64_t code_bytes = 0;     // the same, padded
  uint64_t k_scale_bytes = 0;  // per layer
  uint64_t v_scale_bytes = 0;  // per layer
  uint64_t total = 0;
};

// REQUIRES: shape.raw_bytes() != 0 and full + int8 <= block_tokens (so nothing overflows).
Layout ComputeLayout(const BlockShape& shape, const Counts& c) {
  const uint64_t heads = shape.num_kv_heads;
  const uint64_t dim = shape.head_dim;
  Layout l;
  l.map_bytes = Pad4(shape.block_tokens);
  l.full_data = heads * c.full * dim * ElementBytes(shape.dtype);
  l.full_bytes = Pad4(l.full_data);
  l.code_data = heads * c.int8 * dim;
  l.code_bytes = Pad4(l.code_data);
  l.k_scale_bytes = c.int8 > 0 ? heads * dim * sizeof(float) : 0;
  l.v_scale_bytes = heads * c.int8 * sizeof(float);
  const uint64_t per_layer =
      2 * l.full_bytes + 2 * l.code_bytes + l.k_scale_bytes + l.v_scale_bytes;
  l.total = kCompressedHeaderBytes + l.map_bytes + shape.num_layers * per_layer;
  return l;
}

// A maximal run of consecutive tokens with the same precision; `rank` is the index of its first
// token among the tokens of that precision (its row in the full or INT8 section).
struct Run {
  uint32_t first = 0;
  uint32_t count = 0;
  uint32_t rank = 0;
  TokenPrecision precision = TokenPrecision::kFull;
};

// Per-thread buffers reused across calls, so steady-state encoding and decoding do not allocate.
struct Scratch {
  std::vector<int32_t> full_index;
  std::vector<int32_t> int8_index;
  std::vector<Run> runs;
  std::vector<float> rows;    // gathered or dequantized INT8 rows (float storage: 4-aligned)
  std::vector<float> scales;  // scales when the caller's buffer is not 4-aligned
};

Scratch& ThreadScratch() {
  thread_local Scratch scratch;
  return scratch;
}

// A float-aligned buffer of at least `bytes` bytes.
void* RowsBuffer(Scratch& s, uint64_t bytes) {
  const size_t floats = static_cast<size_t>((bytes + sizeof(float) - 1) / sizeof(float));
  if (s.rows.size() < floats) s.rows.resize(floats);
  return s.rows.data();
}

float* ScalesBuffer(Scratch& s, uint64_t count) {
  if (s.scales.size() < count) s.scales.resize(static_cast<size_t>(count));
  return s.scales.data();
}

absl::Status KernelFailure(const char* what, kernels::KernelStatus status) {
  return absl::InternalError(
      absl::StrCat("compressed block: ", what, " failed: ", kernels::KernelStatusName(status)));
}

}  // namespace

uint64_t BlockShape::raw_bytes() const {
  const uint64_t element = ElementBytes(dtype);
  if (element == 0) return 0;
  uint64_t bytes = 2 * element;  // K and V
  for (const uint64_t d : {num_layers, num_kv_heads, head_dim, block_tokens}) {
    if (d == 0 || d > static_cast<uint64_t>(kernels::kMaxDimension)) return 0;
    if (bytes > kMaxRawBytes / d) return 0;
    bytes *= d;
  }
  return bytes;
}

absl::StatusOr<uint64_t> CompressedSize(const BlockShape& shape,
                                        std::span<const TokenPrecision> precision) {
  if (shape.raw_bytes() == 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("compressed block: invalid shape (", ShapeString(shape), ")"));
  }
  if (precision.size() != shape.block_tokens) {
    return absl::InvalidArgumentError(absl::StrCat("compressed block: precision has ",
                                                   precision.size(), " entries, block_tokens is ",
                                                   shape.block_tokens));
  }
  Counts counts;
  size_t bad = 0;
  if (!CountPrecision(precision, &counts, &bad)) {
    return absl::InvalidArgumentError(
        absl::StrCat("compressed block: precision[", bad, "] has unknown value ",
                     static_cast<int>(static_cast<uint8_t>(precision[bad]))));
  }
  const uint64_t total = ComputeLayout(shape, counts).total;
  return codec_internal::WithinPayloadLimit(total);
}

absl::Status EncodeBlock(const BlockShape& shape, std::span<const std::byte> raw,
                         std::span<const TokenPrecision> precision, std::span<std::byte> out) {
  const absl::StatusOr<uint64_t> size = CompressedSize(shape, precision);
  if (!size.ok()) return size.status();
  const uint64_t raw_bytes = shape.raw_bytes();
  if (raw.size() != raw_bytes) {
    return absl::InvalidArgumentError(absl::StrCat("compressed block: raw block is ", raw.size(),
                                                   " bytes, shape needs ", raw_bytes));
  }
  if (out.size() != *size) {
    return absl::InvalidArgumentError(absl::StrCat("compressed block: output buffer is ",
                                                   out.size(), " bytes, encoding needs ", *size));
  }

  Scratch& s = ThreadScratch();
  s.full_index.clear();
  s.int8_index.clear();
  for (size_t t = 0; t < precision.size(); ++t) {
    if (precision[t] == TokenPrecision::kFull) {
      s.full_index.push_back(static_cast<int32_t>(t));
    } else if (precision[t] == TokenPrecision::kInt8) {
      s.int8_index.push_back(static_cast<int32_t>(t));
    }
  }
  const Counts counts{s.full_index.size(), s.int8_index.size(),
                      shape.block_tokens - s.full_index.size() - s.int8_index.size()};
  const Layout layout = ComputeLayout(shape, counts);

  std::byte* o = out.data();
  std::memset(o, 0, kCompressedHeaderBytes);
  PutU32(o + kOffMagic, kCompressedMagic);
  PutU16(o + kOffVersion, kVersion);
  PutU16(o + kOffHeaderBytes, static_cast<uint16_t>(kCompressedHeaderBytes));
  PutU32(o + kOffLayers, shape.num_layers);
  PutU32(o + kOffHeads, shape.num_kv_heads);
  PutU32(o + kOffHeadDim, shape.head_dim);
  PutU32(o + kOffTokens, shape.block_tokens);
  PutU32(o + kOffDType, shape.dtype);
  PutU32(o + kOffFull, static_cast<uint32_t>(counts.full));
  PutU32(o + kOffInt8, static_cast<uint32_t>(counts.int8));
  PutU32(o + kOffPruned, static_cast<uint32_t>(counts.pruned));
  PutU32(o + kOffPayload, static_cast<uint32_t>(layout.total));
  PutU32(o + kOffReserved, 0);
  uint64_t off = kCompressedHeaderBytes;
  std::memcpy(o + off, precision.data(), precision.size());
  std::memset(o + off + precision.size(), 0, layout.map_bytes - precision.size());
  off += layout.map_bytes;

  const kernels::DType dtype = KernelDType(shape.dtype);
  const uint64_t element = ElementBytes(shape.dtype);
  const int64_t heads = shape.num_kv_heads;
  const int64_t tokens = shape.block_tokens;
  const int64_t dim = shape.head_dim;
  const int64_t num_full = static_cast<int64_t>(counts.full);
  const int64_t num_int8 = static_cast<int64_t>(counts.int8);
  const uint64_t slice_bytes = static_cast<uint64_t>(heads * tokens * dim) * element;

  for (uint32_t layer = 0; layer < shape.num_layers; ++layer) {
    for (int kv = 0; kv < 2; ++kv) {
      const std::byte* src = raw.data() + (2 * static_cast<uint64_t>(layer) + kv) * slice_bytes;
      if (num_full > 0) {
        if (num_full == tokens) {
          std::memcpy(o + off, src, slice_bytes);
        } else {
          const kernels::KernelStatus st = kernels::GatherTokensCpu(
              src, dtype, heads, tokens, dim, s.full_index.data(), num_full, o + off);
          if (st != kernels::KernelStatus::kOk) return KernelFailure("gather of full rows", st);
        }
        std::memset(o + off + layout.full_data, 0, layout.full_bytes - layout.full_data);
        off += layout.full_bytes;
      }
      if (num_int8 > 0) {
        // The quantizer reads typed elements: hand it aligned rows.
        const void* rows = src;
        if (num_int8 != tokens || !Aligned(src, element)) {
          void* gathered = RowsBuffer(s, static_cast<uint64_t>(heads * num_int8 * dim) * element);
          const kernels::KernelStatus st = kernels::GatherTokensCpu(
              src, dtype, heads, tokens, dim, s.int8_index.data(), num_int8, gathered);
          if (st != kernels::KernelStatus::kOk) return KernelFailure("gather of INT8 rows", st);
          rows = gathered;
        }
        auto* codes = reinterpret_cast<int8_t*>(o + off);
        std::memset(o + off + layout.code_data, 0, layout.code_bytes - layout.code_data);
        off += layout.code_bytes;
        const kernels::QuantAxis axis =
            kv == 0 ? kernels::QuantAxis::kPerChannel : kernels::QuantAxis::kPerToken;
        const uint64_t scale_bytes = kv == 0 ? layout.k_scale_bytes : layout.v_scale_bytes;
        const bool direct = Aligned(o + off, alignof(float));
        float* scales = direct ? reinterpret_cast<float*>(o + off)
                               : ScalesBuffer(s, scale_bytes / sizeof(float));
        const kernels::KernelStatus st =
            kernels::QuantizeInt8Cpu(rows, dtype, heads, num_int8, dim, axis, codes, scales);
        if (st != kernels::KernelStatus::kOk) return KernelFailure("INT8 quantization", st);
        if (!direct) std::memcpy(o + off, scales, scale_bytes);
        off += scale_bytes;
      }
    }
  }
  if (off != layout.total) {
    return absl::InternalError(
        absl::StrCat("compressed block: wrote ", off, " bytes, expected ", layout.total));
  }
  return absl::OkStatus();
}

absl::StatusOr<CompressedBlockView> ParseCompressedBlock(std::span<const std::byte> bytes) {
  if (bytes.size() < kCompressedHeaderBytes) {
    return DataLoss(
        absl::StrCat("truncated header: ", bytes.size(), " bytes, need ", kCompressedHeaderBytes));
  }
  const std::byte* b = bytes.data();
  const uint32_t magic = GetU32(b + kOffMagic);
  if (magic != kCompressedMagic) {
    return DataLoss(absl::StrCat("bad magic 0x", absl::Hex(magic, absl::kZeroPad8), ", expected 0x",
                                 absl::Hex(kCompressedMagic, absl::kZeroPad8)));
  }
  const uint16_t version = GetU16(b + kOffVersion);
  if (version != kCompressedVersion1 && version != kCompressedVersion2) {
    return DataLoss(absl::StrCat("unsupported version ", version, ", expected ",
                                 kCompressedVersion1, " or ", kCompressedVersion2));
  }
  const uint16_t header_bytes = GetU16(b + kOffHeaderBytes);
  if (header_bytes != kCompressedHeaderBytes) {
    return DataLoss(
        absl::StrCat("header_bytes is ", header_bytes, ", expected ", kCompressedHeaderBytes));
  }
  if (version == kCompressedVersion2) return ParseV2(bytes);
  const uint32_t reserved = GetU32(b + kOffReserved);
  if (reserved != 0) return DataLoss(absl::StrCat("reserved field is ", reserved, ", expected 0"));

  CompressedBlockView view;
  absl::StatusOr<BlockShape> shape = ReadShape(b);
  if (!shape.ok()) return shape.status();
  view.shape = *shape;
  view.num_full = GetU32(b + kOffFull);
  view.num_int8 = GetU32(b + kOffInt8);
  view.num_pruned = GetU32(b + kOffPruned);
  const uint64_t tokens = view.shape.block_tokens;
  if (uint64_t{view.num_full} + view.num_int8 + view.num_pruned != tokens) {
    return DataLoss(absl::StrCat("num_full ", view.num_full, " + num_int8 ", view.num_int8,
                                 " + num_pruned ", view.num_pruned, " != block_tokens ", tokens));
  }
  const uint32_t payload = GetU32(b + kOffPayload);
  const Layout layout =
      ComputeLayout(view.shape, Counts{view.num_full, view.num_int8, view.num_pruned});
  if (payload != layout.total) {
    return DataLoss(
        absl::StrCat("payload_bytes is ", payload, ", shape and counts imply ", layout.total));
  }
  if (bytes.size() != payload) {
    return DataLoss(absl::StrCat("buffer is ", bytes.size(), " bytes, payload_bytes is ", payload));
  }

  // The map lies inside `bytes`: layout.total >= header + map.
  view.precision = std::span<const TokenPrecision>(
      reinterpret_cast<const TokenPrecision*>(b + kCompressedHeaderBytes), tokens);
  Counts counts;
  size_t bad = 0;
  if (!CountPrecision(view.precision, &counts, &bad)) {
    return DataLoss(absl::StrCat("precision map entry ", bad, " has unknown value ",
                                 static_cast<int>(static_cast<uint8_t>(view.precision[bad]))));
  }
  if (counts.full != view.num_full || counts.int8 != view.num_int8) {
    return DataLoss(absl::StrCat("precision map has ", counts.full, " full / ", counts.int8,
                                 " int8 / ", counts.pruned, " pruned tokens, header says ",
                                 view.num_full, " / ", view.num_int8, " / ", view.num_pruned));
  }
  view.bytes = bytes;
  return view;
}

absl::Status DecodeBlock(const CompressedBlockView& view, std::span<std::byte> out) {
  if (view.version == kCompressedVersion2) return DecodeV2(view, out);
  if (view.version != kCompressedVersion1) {
    return absl::InvalidArgumentError(
        absl::StrCat("compressed block: view has unknown version ", view.version));
  }
  const BlockShape& shape = view.shape;
  const uint64_t raw_bytes = shape.raw_bytes();
  if (raw_bytes == 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("compressed block: invalid shape (", ShapeString(shape), ")"));
  }
  if (view.precision.size() != shape.block_tokens) {
    return absl::InvalidArgumentError(
        absl::StrCat("compressed block: view has ", view.precision.size(),
                     " precision entries, block_tokens is ", shape.block_tokens));
  }
  Counts counts;
  size_t bad = 0;
  if (!CountPrecision(view.precision, &counts, &bad) || counts.full != view.num_full ||
      counts.int8 != view.num_int8 || counts.pruned != view.num_pruned) {
    return absl::InvalidArgumentError(
        "compressed block: view counts disagree with its precision map");
  }
  const Layout layout = ComputeLayout(shape, counts);
  if (view.bytes.size() != layout.total) {
    return absl::InvalidArgumentError(absl::StrCat("compressed block: view holds ",
                                                   view.bytes.size(), " bytes, encoding needs ",
                                                   layout.total));
  }
  if (out.size() != raw_bytes) {
    return absl::InvalidArgumentError(absl::StrCat(
        "compressed block: output buffer is ", out.size(), " bytes, raw block needs ", raw_bytes));
  }

  Scratch& s = ThreadScratch();
  s.runs.clear();
  uint32_t rank[3] = {0, 0, 0};
  for (uint32_t t = 0; t < shape.block_tokens; ++t) {
    const TokenPrecision p = view.precision[t];
    if (s.runs.empty() || s.runs.back().precision != p) {
      s.runs.push_back(Run{t, 0, rank[static_cast<uint8_t>(p)], p});
    }
    ++s.runs.back().count;
    ++rank[static_cast<uint8_t>(p)];
  }

  const kernels::DType dtype = KernelDType(shape.dtype);
  const uint64_t element = ElementBytes(shape.dtype);
  const int64_t heads = shape.num_kv_heads;
  const int64_t tokens = shape.block_tokens;
  const int64_t dim = shape.head_dim;
  const uint64_t num_full = counts.full;
  const int64_t num_int8 = static_cast<int64_t>(counts.int8);
  const uint64_t row_bytes = static_cast<uint64_t>(dim) * element;
  const uint64_t slice_bytes = static_cast<uint64_t>(heads * tokens) * row_bytes;
  const std::byte* in = view.bytes.data();
  uint64_t off = kCompressedHeaderBytes + layout.map_bytes;

  for (uint32_t layer = 0; layer < shape.num_layers; ++layer) {
    for (int kv = 0; kv < 2; ++kv) {
      std::byte* dst = out.data() + (2 * static_cast<uint64_t>(layer) + kv) * slice_bytes;
      const std::byte* full_rows = in + off;
      off += layout.full_bytes;
      const std::byte* int8_rows = nullptr;
      if (num_int8 > 0) {
        const auto* codes = reinterpret_cast<const int8_t*>(in + off);
        off += layout.code_bytes;
        const uint64_t scale_bytes = kv == 0 ? layout.k_scale_bytes : layout.v_scale_bytes;
        const float* scales = reinterpret_cast<const float*>(in + off);
        if (!Aligned(in + off, alignof(float))) {
          float* copy = ScalesBuffer(s, scale_bytes / sizeof(float));
          std::memcpy(copy, in + off, scale_bytes);
          scales = copy;
        }
        off += scale_bytes;
        const kernels::QuantAxis axis =
            kv == 0 ? kernels::QuantAxis::kPerChannel : kernels::QuantAxis::kPerToken;
        // All tokens INT8 and an aligned destination: dequantize in place.
        const bool in_place = num_int8 == tokens && Aligned(dst, element);
        void* target = in_place
                           ? static_cast<void*>(dst)
                           : RowsBuffer(s, static_cast<uint64_t>(heads * num_int8) * row_bytes);
        const kernels::KernelStatus st =
            kernels::DequantizeInt8Cpu(codes, scales, heads, num_int8, dim, axis, dtype, target);
        if (st != kernels::KernelStatus::kOk) return KernelFailure("INT8 dequantization", st);
        if (in_place) continue;
        int8_rows = static_cast<const std::byte*>(target);
      }
      if (s.runs.size() == 1) {
        // One precision for the whole block (all INT8 was handled above).
        if (s.runs[0].precision == TokenPrecision::kFull) {
          std::memcpy(dst, full_rows, slice_bytes);
        } else if (s.runs[0].precision == TokenPrecision::kPruned) {
          std::memset(dst, 0, slice_bytes);
        } else {
          std::memcpy(dst, int8_rows, slice_bytes);
        }
        continue;
      }
      for (int64_t h = 0; h < heads; ++h) {
        std::byte* head_dst = dst + static_cast<uint64_t>(h * tokens) * row_bytes;
        const std::byte* head_full = full_rows + static_cast<uint64_t>(h) * num_full * row_bytes;
        const std::byte* head_int8 =
            int8_rows == nullptr ? nullptr
                                 : int8_rows + static_cast<uint64_t>(h * num_int8) * row_bytes;
        for (const Run& run : s.runs) {
          std::byte* d = head_dst + uint64_t{run.first} * row_bytes;
          const uint64_t n = uint64_t{run.count} * row_bytes;
          switch (run.precision) {
            case TokenPrecision::kFull:
              std::memcpy(d, head_full + uint64_t{run.rank} * row_bytes, n);
              break;
            case TokenPrecision::kInt8:
              std::memcpy(d, head_int8 + uint64_t{run.rank} * row_bytes, n);
              break;
            case TokenPrecision::kPruned:
            case TokenPrecision::kInt4:  // not in version 1 (the map was validated)
              std::memset(d, 0, n);
              break;
          }
        }
      }
    }
  }
  return absl::OkStatus();
}

uint64_t BlockShape::entries() const {
  if (raw_bytes() == 0) return 0;
  return uint64_t{num_layers} * num_kv_heads * block_tokens;
}

TokenPrecision CompressedBlockView::EntryPrecision(uint32_t layer, uint32_t head,
                                                   uint32_t token) const {
  if (version != kCompressedVersion2) return precision[token];
  const uint64_t i = (uint64_t{layer} * shape.num_kv_heads + head) * shape.block_tokens + token;
  const auto byte = static_cast<uint8_t>(entry_map[i / 4]);
  return static_cast<TokenPrecision>((byte >> (2 * (i % 4))) & 3);
}

bool CompressedBlockView::TokenKept(uint32_t token) const {
  if (version != kCompressedVersion2) return precision[token] != TokenPrecision::kPruned;
  if (num_pruned == 0) return true;
  for (uint32_t layer = 0; layer < shape.num_layers; ++layer) {
    for (uint32_t h = 0; h < shape.num_kv_heads; ++h) {
      if (EntryPrecision(layer, h, token) != TokenPrecision::kPruned) return true;
    }
  }
  return false;
}

bool LooksCompressed(std::span<const std::byte> bytes) {
  return bytes.size() >= sizeof(uint32_t) && GetU32(bytes.data()) == kCompressedMagic;
}

uint32_t KeepNonFiniteTokensFull(const BlockShape& shape, std::span<const std::byte> raw,
                                 std::span<TokenPrecision> precision) {
  const uint64_t elem = shape.dtype == 3 ? 4 : 2;
  if (shape.raw_bytes() == 0 || raw.size() != shape.raw_bytes() ||
      precision.size() != shape.block_tokens) {
    return 0;
  }
  // An element is non-finite when its exponent bits are all ones.
  auto non_finite = [&](const std::byte* p) {
    if (shape.dtype == 3) {
      uint32_t u;
      std::memcpy(&u, p, 4);
      return (u & 0x7F800000u) == 0x7F800000u;
    }
    uint16_t h;
    std::memcpy(&h, p, 2);
    const uint16_t mask = shape.dtype == 1 ? 0x7C00 : 0x7F80;  // fp16 : bf16
    return (h & mask) == mask;
  };
  const uint64_t row = uint64_t{shape.head_dim} * elem;
  const uint64_t rows = uint64_t{shape.num_layers} * 2 * shape.num_kv_heads;
  uint32_t changed = 0;
  for (uint64_t r = 0; r < rows; ++r) {
    for (uint32_t t = 0; t < shape.block_tokens; ++t) {
      if (precision[t] == TokenPrecision::kFull) continue;
      const std::byte* p = raw.data() + (r * shape.block_tokens + t) * row;
      for (uint64_t off = 0; off < row; off += elem) {
        if (non_finite(p + off)) {
          precision[t] = TokenPrecision::kFull;
          ++changed;
          break;
        }
      }
    }
  }
  return changed;
}

}  // namespace kvcache::importance
