// Version 2 of the compressed block format: one precision per (layer, KV head,
// token) entry, INT4 beside INT8 (block_codec.h has the layout).
#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "absl/strings/str_cat.h"
#include "kvcache/kernels/convert.h"
#include "server/common/status_macros.h"
#include "server/importance/block_codec.h"
#include "server/importance/block_codec_internal.h"

namespace kvcache::importance {
namespace {

using namespace codec_internal;  // NOLINT: the codec's own helpers

constexpr uint8_t kFullCode = static_cast<uint8_t>(TokenPrecision::kFull);
constexpr uint8_t kInt8Code = static_cast<uint8_t>(TokenPrecision::kInt8);
constexpr uint8_t kPrunedCode = static_cast<uint8_t>(TokenPrecision::kPruned);
constexpr uint8_t kInt4Code = static_cast<uint8_t>(TokenPrecision::kInt4);

// Entries per precision (indexed by the precision's value).
struct Counts4 {
  uint64_t n[4] = {0, 0, 0, 0};
  uint64_t full() const { return n[kFullCode]; }
  uint64_t int8() const { return n[kInt8Code]; }
  uint64_t pruned() const { return n[kPrunedCode]; }
  uint64_t int4() const { return n[kInt4Code]; }
};

// The sections of one group (a (layer, head)'s K or V), in bytes, padded.
struct GroupSections {
  uint64_t full = 0;
  uint64_t code8 = 0;
  uint64_t code4 = 0;
  uint64_t range8 = 0;
  uint64_t range4 = 0;
  uint64_t total() const { return full + code8 + code4 + range8 + range4; }
};

// kv: 0 for K, 1 for V; c: the (layer, head)'s counts.
GroupSections SectionsOf(const Counts4& c, int kv, uint64_t dim, uint64_t element) {
  GroupSections g;
  g.full = Pad4(c.full() * dim * element);
  g.code8 = Pad4(c.int8() * dim);
  g.code4 = Pad4((c.int4() * dim + 1) / 2);
  if (kv == 0) {
    g.range8 = c.int8() > 0 ? Pad4(dim * element) : 0;
    g.range4 = c.int4() > 0 ? Pad4(2 * dim * element) : 0;
  } else {
    g.range8 = Pad4(c.int8() * element);
    g.range4 = Pad4(2 * c.int4() * element);
  }
  return g;
}

uint64_t MapBytes(uint64_t entries) { return Pad4((entries + 3) / 4); }

uint8_t PackedAt(std::span<const std::byte> map, uint64_t i) {
  return (static_cast<uint8_t>(map[i / 4]) >> (2 * (i % 4))) & 3;
}

// Walks every (layer, head), calling visit(layer, head, counts of its entries).
// at(i) gives entry i's precision value (0..3).
template <typename At, typename Visit>
void ForEachGroup(const BlockShape& shape, const At& at, const Visit& visit) {
  uint64_t i = 0;
  for (uint32_t layer = 0; layer < shape.num_layers; ++layer) {
    for (uint32_t h = 0; h < shape.num_kv_heads; ++h) {
      Counts4 c;
      for (uint32_t t = 0; t < shape.block_tokens; ++t) ++c.n[at(i++)];
      visit(layer, h, c);
    }
  }
}

// Total bytes of a version-2 encoding and its counts. REQUIRES: shape valid, at(i) in 0..3.
template <typename At>
uint64_t EncodingBytes(const BlockShape& shape, const At& at, Counts4* totals) {
  const uint64_t dim = shape.head_dim, element = ElementBytes(shape.dtype);
  uint64_t total = kCompressedHeaderBytes + MapBytes(shape.entries());
  ForEachGroup(shape, at, [&](uint32_t, uint32_t, const Counts4& c) {
    for (int v = 0; v < 4; ++v) totals->n[v] += c.n[v];
    total += SectionsOf(c, 0, dim, element).total() + SectionsOf(c, 1, dim, element).total();
  });
  return total;
}

float Load(const std::byte* p, uint32_t dtype) {
  if (dtype == 3) {
    float f;
    std::memcpy(&f, p, sizeof(f));
    return f;
  }
  uint16_t bits;
  std::memcpy(&bits, p, sizeof(bits));
  return dtype == 1 ? kernels::HalfBitsToFloat(bits) : kernels::BFloat16BitsToFloat(bits);
}

void Store(std::byte* p, uint32_t dtype, float v) {
  if (dtype == 3) {
    std::memcpy(p, &v, sizeof(v));
    return;
  }
  const uint16_t bits = dtype == 1 ? kernels::FloatToHalfBits(v) : kernels::FloatToBFloat16Bits(v);
  std::memcpy(p, &bits, sizeof(bits));
}

// rint(clamp(v, lo, hi)) as an int; NaN (a non-finite input) gives 0.
int CodeOf(double v, double lo, double hi) {
  if (std::isnan(v)) return 0;
  return static_cast<int>(std::nearbyint(std::clamp(v, lo, hi)));
}

// INT8, symmetric, range a = the group's largest magnitude.
int QuantInt8(float x, float a) {
  if (!(a > 0)) return 0;
  const float inv = 127.0f / a;
  if (std::isfinite(inv)) {
    const float scaled = x * inv;
    return CodeOf(scaled, -127, 127);
  }
  return CodeOf(static_cast<double>(x) * 127.0 / static_cast<double>(a), -127, 127);
}

float DequantInt8(int q, float a) {
  if (!(a > 0)) return 0.0f;
  if (std::isfinite(127.0f / a)) {
    const float step = a / 127.0f;
    return static_cast<float>(q) * step;
  }
  return static_cast<float>(static_cast<double>(q) * (static_cast<double>(a) / 127.0));
}

// INT4, asymmetric over [lo, hi].
struct Int4Range {
  float lo = 0;
  float step = 0;     // (hi - lo) / 15 in float
  bool wide = false;  // hi - lo overflows float: double arithmetic
  double step_d = 0;

  static Int4Range Of(float lo, float hi) {
    Int4Range r{.lo = lo};
    const float span = hi - lo;
    if (std::isfinite(span) || std::isnan(span)) {
      r.step = span / 15.0f;
    } else {
      r.wide = true;
      r.step_d = (static_cast<double>(hi) - static_cast<double>(lo)) / 15.0;
    }
    return r;
  }

  int Quantize(float x) const {
    if (wide) return CodeOf((static_cast<double>(x) - lo) / step_d, 0, 15);
    if (!(step > 0)) return 0;
    const float offset = x - lo;
    const float scaled = offset / step;
    return CodeOf(scaled, 0, 15);
  }

  float Dequantize(int q) const {
    if (wide) return static_cast<float>(lo + q * step_d);
    if (!(step > 0)) return lo;
    const float delta = static_cast<float>(q) * step;  // two statements: no fused multiply-add
    return lo + delta;
  }
};

// Token indices of one (layer, head), per precision, in token order.
struct GroupTokens {
  std::vector<uint32_t> full, int8, int4;
  void Clear() {
    full.clear();
    int8.clear();
    int4.clear();
  }
};

struct ScratchV2 {
  GroupTokens tokens;
  std::vector<float> range_a;   // INT8 ranges of a group
  std::vector<float> range_lo;  // INT4 ranges of a group
  std::vector<float> range_hi;
  std::vector<Int4Range> int4;  // per channel (K)
};

ScratchV2& ThreadScratchV2() {
  thread_local ScratchV2 scratch;
  return scratch;
}

absl::Status CheckShapeAndMap(const BlockShape& shape, std::span<const TokenPrecision> precision) {
  if (shape.raw_bytes() == 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("compressed block: invalid shape (", ShapeString(shape), ")"));
  }
  if (precision.size() != shape.entries()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "compressed block: precision has ", precision.size(), " entries, version 2 needs ",
        shape.entries(), " (num_layers x num_kv_heads x block_tokens)"));
  }
  for (size_t i = 0; i < precision.size(); ++i) {
    if (static_cast<uint8_t>(precision[i]) > 3) {
      return absl::InvalidArgumentError(
          absl::StrCat("compressed block: precision[", i, "] has unknown value ",
                       static_cast<int>(static_cast<uint8_t>(precision[i]))));
    }
  }
  return absl::OkStatus();
}

// Writes one group (the K or V of one (layer, head)) at `o`; `src` is the
// group's [block_tokens][head_dim] rows in the raw block. Returns the bytes written.
uint64_t EncodeGroup(const BlockShape& shape, int kv, const std::byte* src, const Counts4& c,
                     ScratchV2& s, std::byte* o) {
  const uint32_t dtype = shape.dtype;
  const uint64_t dim = shape.head_dim, element = ElementBytes(dtype);
  const uint64_t row = dim * element;
  const GroupSections g = SectionsOf(c, kv, dim, element);
  std::byte* full = o;
  auto* code8 = reinterpret_cast<int8_t*>(o + g.full);
  auto* code4 = reinterpret_cast<uint8_t*>(o + g.full + g.code8);
  std::byte* range8 = o + g.full + g.code8 + g.code4;
  std::byte* range4 = range8 + g.range8;
  const GroupTokens& t = s.tokens;

  for (size_t i = 0; i < t.full.size(); ++i) {
    std::memcpy(full + i * row, src + t.full[i] * row, row);
  }
  auto x = [&](uint32_t token, uint64_t d) { return Load(src + token * row + d * element, dtype); };

  // INT8: ranges (K per channel, V per token), then codes.
  if (!t.int8.empty()) {
    s.range_a.assign(kv == 0 ? dim : t.int8.size(), 0.0f);
    for (size_t i = 0; i < t.int8.size(); ++i) {
      for (uint64_t d = 0; d < dim; ++d) {
        float& a = s.range_a[kv == 0 ? d : i];
        a = std::max(a, std::fabs(x(t.int8[i], d)));
      }
    }
    for (size_t r = 0; r < s.range_a.size(); ++r) Store(range8 + r * element, dtype, s.range_a[r]);
    for (size_t i = 0; i < t.int8.size(); ++i) {
      for (uint64_t d = 0; d < dim; ++d) {
        const float a = s.range_a[kv == 0 ? d : i];
        code8[i * dim + d] = static_cast<int8_t>(QuantInt8(x(t.int8[i], d), a));
      }
    }
  }
  // INT4: ranges (min, max), then packed codes.
  if (!t.int4.empty()) {
    const size_t groups = kv == 0 ? dim : t.int4.size();
    s.range_lo.assign(groups, std::numeric_limits<float>::infinity());
    s.range_hi.assign(groups, -std::numeric_limits<float>::infinity());
    for (size_t i = 0; i < t.int4.size(); ++i) {
      for (uint64_t d = 0; d < dim; ++d) {
        const size_t r = kv == 0 ? d : i;
        const float v = x(t.int4[i], d);
        s.range_lo[r] = std::min(s.range_lo[r], v);
        s.range_hi[r] = std::max(s.range_hi[r], v);
      }
    }
    s.int4.resize(groups);
    for (size_t r = 0; r < groups; ++r) {
      Store(range4 + 2 * r * element, dtype, s.range_lo[r]);
      Store(range4 + (2 * r + 1) * element, dtype, s.range_hi[r]);
      // Read back: what a reader derives its scale from.
      s.int4[r] = Int4Range::Of(Load(range4 + 2 * r * element, dtype),
                                Load(range4 + (2 * r + 1) * element, dtype));
    }
    for (size_t i = 0; i < t.int4.size(); ++i) {
      for (uint64_t d = 0; d < dim; ++d) {
        const uint64_t e = i * dim + d;
        const auto q = static_cast<uint8_t>(s.int4[kv == 0 ? d : i].Quantize(x(t.int4[i], d)));
        code4[e / 2] |= static_cast<uint8_t>(e % 2 == 0 ? q : q << 4);
      }
    }
  }
  return g.total();
}

// Decodes one group written by EncodeGroup into `dst` ([block_tokens][head_dim]
// rows). `at(t)` is token t's precision value within this (layer, head).
template <typename At>
uint64_t DecodeGroup(const BlockShape& shape, int kv, const std::byte* in, const Counts4& c,
                     const At& at, ScratchV2& s, std::byte* dst) {
  const uint32_t dtype = shape.dtype;
  const uint64_t dim = shape.head_dim, element = ElementBytes(dtype);
  const uint64_t row = dim * element;
  const GroupSections g = SectionsOf(c, kv, dim, element);
  const std::byte* full = in;
  const auto* code8 = reinterpret_cast<const int8_t*>(in + g.full);
  const auto* code4 = reinterpret_cast<const uint8_t*>(in + g.full + g.code8);
  const std::byte* range8 = in + g.full + g.code8 + g.code4;
  const std::byte* range4 = range8 + g.range8;
  if (kv == 0) {  // per-channel ranges, read once
    if (c.int8() > 0) {
      s.range_a.resize(dim);
      for (uint64_t d = 0; d < dim; ++d) s.range_a[d] = Load(range8 + d * element, dtype);
    }
    if (c.int4() > 0) {
      s.int4.resize(dim);
      for (uint64_t d = 0; d < dim; ++d) {
        s.int4[d] = Int4Range::Of(Load(range4 + 2 * d * element, dtype),
                                  Load(range4 + (2 * d + 1) * element, dtype));
      }
    }
  }
  uint64_t rf = 0, r8 = 0, r4 = 0;
  for (uint32_t t = 0; t < shape.block_tokens; ++t) {
    std::byte* out = dst + t * row;
    switch (at(t)) {
      case kFullCode:
        std::memcpy(out, full + rf++ * row, row);
        break;
      case kInt8Code: {
        const float token_a = kv == 0 ? 0.0f : Load(range8 + r8 * element, dtype);
        for (uint64_t d = 0; d < dim; ++d) {
          const float a = kv == 0 ? s.range_a[d] : token_a;
          Store(out + d * element, dtype, DequantInt8(code8[r8 * dim + d], a));
        }
        ++r8;
        break;
      }
      case kInt4Code: {
        Int4Range token_range;
        if (kv == 1) {
          token_range = Int4Range::Of(Load(range4 + 2 * r4 * element, dtype),
                                      Load(range4 + (2 * r4 + 1) * element, dtype));
        }
        for (uint64_t d = 0; d < dim; ++d) {
          const uint64_t e = r4 * dim + d;
          const int q = e % 2 == 0 ? code4[e / 2] & 0xF : code4[e / 2] >> 4;
          const Int4Range& r = kv == 0 ? s.int4[d] : token_range;
          Store(out + d * element, dtype, r.Dequantize(q));
        }
        ++r4;
        break;
      }
      default:  // pruned
        std::memset(out, 0, row);
        break;
    }
  }
  return g.total();
}

}  // namespace

absl::StatusOr<uint64_t> CompressedSizeV2(const BlockShape& shape,
                                          std::span<const TokenPrecision> precision) {
  KVCACHE_RETURN_IF_ERROR(CheckShapeAndMap(shape, precision));
  Counts4 totals;
  const uint64_t total = EncodingBytes(
      shape, [&](uint64_t i) { return static_cast<uint8_t>(precision[i]); }, &totals);
  return codec_internal::WithinPayloadLimit(total);
}

absl::Status EncodeBlockV2(const BlockShape& shape, std::span<const std::byte> raw,
                           std::span<const TokenPrecision> precision, std::span<std::byte> out) {
  const absl::StatusOr<uint64_t> size = CompressedSizeV2(shape, precision);
  if (!size.ok()) return size.status();
  if (raw.size() != shape.raw_bytes()) {
    return absl::InvalidArgumentError(absl::StrCat("compressed block: raw block is ", raw.size(),
                                                   " bytes, shape needs ", shape.raw_bytes()));
  }
  if (out.size() != *size) {
    return absl::InvalidArgumentError(absl::StrCat("compressed block: output buffer is ",
                                                   out.size(), " bytes, encoding needs ", *size));
  }
  auto at = [&](uint64_t i) { return static_cast<uint8_t>(precision[i]); };
  Counts4 totals;
  EncodingBytes(shape, at, &totals);

  std::byte* o = out.data();
  std::memset(o, 0, out.size());  // every padding byte and nibble starts at zero
  PutU32(o + kOffMagic, kCompressedMagic);
  PutU16(o + kOffVersion, kCompressedVersion2);
  PutU16(o + kOffHeaderBytes, static_cast<uint16_t>(kCompressedHeaderBytes));
  PutU32(o + kOffLayers, shape.num_layers);
  PutU32(o + kOffHeads, shape.num_kv_heads);
  PutU32(o + kOffHeadDim, shape.head_dim);
  PutU32(o + kOffTokens, shape.block_tokens);
  PutU32(o + kOffDType, shape.dtype);
  PutU32(o + kOffFull, static_cast<uint32_t>(totals.full()));
  PutU32(o + kOffInt8, static_cast<uint32_t>(totals.int8()));
  PutU32(o + kOffPruned, static_cast<uint32_t>(totals.pruned()));
  PutU32(o + kOffPayload, static_cast<uint32_t>(*size));
  PutU32(o + kOffReserved, static_cast<uint32_t>(totals.int4()));
  auto* map = reinterpret_cast<uint8_t*>(o + kCompressedHeaderBytes);
  for (uint64_t i = 0; i < precision.size(); ++i) {
    map[i / 4] |= static_cast<uint8_t>(at(i) << (2 * (i % 4)));
  }
  uint64_t off = kCompressedHeaderBytes + MapBytes(shape.entries());

  ScratchV2& s = ThreadScratchV2();
  const uint64_t element = ElementBytes(shape.dtype);
  const uint64_t group_bytes = uint64_t{shape.block_tokens} * shape.head_dim * element;
  uint64_t i = 0;
  for (uint32_t layer = 0; layer < shape.num_layers; ++layer) {
    for (uint32_t h = 0; h < shape.num_kv_heads; ++h) {
      s.tokens.Clear();
      Counts4 c;
      for (uint32_t t = 0; t < shape.block_tokens; ++t, ++i) {
        const uint8_t p = at(i);
        ++c.n[p];
        if (p == kFullCode) s.tokens.full.push_back(t);
        if (p == kInt8Code) s.tokens.int8.push_back(t);
        if (p == kInt4Code) s.tokens.int4.push_back(t);
      }
      for (int kv = 0; kv < 2; ++kv) {
        const std::byte* src =
            raw.data() + ((uint64_t{layer} * 2 + kv) * shape.num_kv_heads + h) * group_bytes;
        off += EncodeGroup(shape, kv, src, c, s, o + off);
      }
    }
  }
  if (off != *size) {
    return absl::InternalError(
        absl::StrCat("compressed block: wrote ", off, " bytes, expected ", *size));
  }
  return absl::OkStatus();
}

namespace codec_internal {

absl::StatusOr<CompressedBlockView> ParseV2(std::span<const std::byte> bytes) {
  const std::byte* b = bytes.data();
  CompressedBlockView view;
  view.version = kCompressedVersion2;
  absl::StatusOr<BlockShape> shape = ReadShape(b);
  if (!shape.ok()) return shape.status();
  view.shape = *shape;
  view.num_full = GetU32(b + kOffFull);
  view.num_int8 = GetU32(b + kOffInt8);
  view.num_pruned = GetU32(b + kOffPruned);
  view.num_int4 = GetU32(b + kOffReserved);
  const uint64_t entries = view.shape.entries();
  if (uint64_t{view.num_full} + view.num_int8 + view.num_pruned + view.num_int4 != entries) {
    return DataLoss(absl::StrCat("num_full ", view.num_full, " + num_int8 ", view.num_int8,
                                 " + num_pruned ", view.num_pruned, " + num_int4 ", view.num_int4,
                                 " != entries ", entries,
                                 " (num_layers x num_kv_heads x block_tokens)"));
  }
  const uint32_t payload = GetU32(b + kOffPayload);
  if (bytes.size() != payload) {
    return DataLoss(absl::StrCat("buffer is ", bytes.size(), " bytes, payload_bytes is ", payload));
  }
  const uint64_t map_bytes = MapBytes(entries);
  if (payload < kCompressedHeaderBytes + map_bytes) {
    return DataLoss(absl::StrCat("payload_bytes is ", payload, ", the header and precision map of ",
                                 entries, " entries take ", kCompressedHeaderBytes + map_bytes));
  }
  const uint64_t used = (entries + 3) / 4;
  view.entry_map = bytes.subspan(kCompressedHeaderBytes, used);
  if (entries % 4 != 0 &&
      (static_cast<uint8_t>(view.entry_map[used - 1]) >> (2 * (entries % 4))) != 0) {
    return DataLoss("precision map has bits set past its last entry");
  }
  for (uint64_t i = used; i < map_bytes; ++i) {
    if (b[kCompressedHeaderBytes + i] != std::byte{0}) {
      return DataLoss("precision map padding is not zero");
    }
  }
  Counts4 counts;
  const uint64_t total = EncodingBytes(
      view.shape, [&](uint64_t i) { return PackedAt(view.entry_map, i); }, &counts);
  if (counts.full() != view.num_full || counts.int8() != view.num_int8 ||
      counts.pruned() != view.num_pruned || counts.int4() != view.num_int4) {
    return DataLoss(absl::StrCat("precision map has ", counts.full(), " full / ", counts.int8(),
                                 " int8 / ", counts.pruned(), " pruned / ", counts.int4(),
                                 " int4 entries, header says ", view.num_full, " / ", view.num_int8,
                                 " / ", view.num_pruned, " / ", view.num_int4));
  }
  if (total != payload) {
    return DataLoss(
        absl::StrCat("payload_bytes is ", payload, ", shape and precision map imply ", total));
  }
  view.bytes = bytes;
  return view;
}

absl::Status DecodeV2(const CompressedBlockView& view, std::span<std::byte> out) {
  const BlockShape& shape = view.shape;
  const uint64_t raw_bytes = shape.raw_bytes();
  if (raw_bytes == 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("compressed block: invalid shape (", ShapeString(shape), ")"));
  }
  const uint64_t entries = shape.entries();
  if (view.entry_map.size() != (entries + 3) / 4) {
    return absl::InvalidArgumentError(absl::StrCat("compressed block: view's precision map has ",
                                                   view.entry_map.size(), " bytes, ", entries,
                                                   " entries need ", (entries + 3) / 4));
  }
  auto at = [&](uint64_t i) { return PackedAt(view.entry_map, i); };
  Counts4 counts;
  const uint64_t total = EncodingBytes(shape, at, &counts);
  if (counts.full() != view.num_full || counts.int8() != view.num_int8 ||
      counts.pruned() != view.num_pruned || counts.int4() != view.num_int4) {
    return absl::InvalidArgumentError(
        "compressed block: view counts disagree with its precision map");
  }
  if (view.bytes.size() != total) {
    return absl::InvalidArgumentError(absl::StrCat(
        "compressed block: view holds ", view.bytes.size(), " bytes, encoding needs ", total));
  }
  if (out.size() != raw_bytes) {
    return absl::InvalidArgumentError(absl::StrCat(
        "compressed block: output buffer is ", out.size(), " bytes, raw block needs ", raw_bytes));
  }
  ScratchV2& s = ThreadScratchV2();
  const uint64_t group_bytes =
      uint64_t{shape.block_tokens} * shape.head_dim * ElementBytes(shape.dtype);
  const std::byte* in = view.bytes.data();
  uint64_t off = kCompressedHeaderBytes + MapBytes(entries);
  ForEachGroup(shape, at, [&](uint32_t layer, uint32_t h, const Counts4& c) {
    const uint64_t first = (uint64_t{layer} * shape.num_kv_heads + h) * shape.block_tokens;
    auto token_at = [&](uint32_t t) { return at(first + t); };
    for (int kv = 0; kv < 2; ++kv) {
      std::byte* dst =
          out.data() + ((uint64_t{layer} * 2 + kv) * shape.num_kv_heads + h) * group_bytes;
      off += DecodeGroup(shape, kv, in + off, c, token_at, s, dst);
    }
  });
  return absl::OkStatus();
}

}  // namespace codec_internal

uint32_t KeepNonFiniteEntriesFull(const BlockShape& shape, std::span<const std::byte> raw,
                                  std::span<TokenPrecision> precision) {
  if (shape.raw_bytes() == 0 || raw.size() != shape.raw_bytes() ||
      precision.size() != shape.entries()) {
    return 0;
  }
  const uint64_t element = ElementBytes(shape.dtype);
  const uint64_t row = uint64_t{shape.head_dim} * element;
  const uint64_t group_bytes = uint64_t{shape.block_tokens} * row;
  auto row_finite = [&](const std::byte* p) {
    for (uint64_t d = 0; d < shape.head_dim; ++d) {
      if (!std::isfinite(Load(p + d * element, shape.dtype))) return false;
    }
    return true;
  };
  uint32_t changed = 0;
  uint64_t i = 0;
  for (uint32_t layer = 0; layer < shape.num_layers; ++layer) {
    for (uint32_t h = 0; h < shape.num_kv_heads; ++h) {
      const std::byte* k =
          raw.data() + ((uint64_t{layer} * 2) * shape.num_kv_heads + h) * group_bytes;
      const std::byte* v =
          raw.data() + ((uint64_t{layer} * 2 + 1) * shape.num_kv_heads + h) * group_bytes;
      for (uint32_t t = 0; t < shape.block_tokens; ++t, ++i) {
        if (precision[i] == TokenPrecision::kFull) continue;
        if (!row_finite(k + t * row) || !row_finite(v + t * row)) {
          precision[i] = TokenPrecision::kFull;
          ++changed;
        }
      }
    }
  }
  return changed;
}

}  // namespace kvcache::importance
