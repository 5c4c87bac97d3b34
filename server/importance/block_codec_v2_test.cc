// Version 2 of the compressed block format: precision per (layer, KV head,
// token) and INT4 (block_codec.h). Sizes and quantized values are pinned
// against the evaluation's reference (tests/eval/kv_quant.py).
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "kvcache/kernels/convert.h"
#include "kvcache/kernels/types.h"
#include "server/importance/block_codec.h"

namespace kvcache::importance {
namespace {

using ::testing::HasSubstr;
using P = TokenPrecision;

constexpr uint32_t kFp16 = 1;
constexpr uint32_t kBf16 = 2;
constexpr uint32_t kFp32 = 3;

kernels::DType KernelDType(uint32_t proto) {
  return proto == kFp16   ? kernels::DType::kFloat16
         : proto == kBf16 ? kernels::DType::kBFloat16
                          : kernels::DType::kFloat32;
}

size_t ElementBytes(uint32_t proto) { return proto == kFp32 ? 4 : 2; }

size_t RawIndex(const BlockShape& s, uint32_t layer, uint32_t kv, uint32_t h, uint32_t t,
                uint32_t d) {
  return (((static_cast<size_t>(layer) * 2 + kv) * s.num_kv_heads + h) * s.block_tokens + t) *
             s.head_dim +
         d;
}

size_t Entry(const BlockShape& s, uint32_t layer, uint32_t h, uint32_t t) {
  return (static_cast<size_t>(layer) * s.num_kv_heads + h) * s.block_tokens + t;
}

std::vector<std::byte> FromFloats(const BlockShape& shape, const std::vector<float>& values) {
  std::vector<std::byte> raw(values.size() * ElementBytes(shape.dtype));
  EXPECT_EQ(kernels::ConvertCpu(values.data(), kernels::DType::kFloat32,
                                static_cast<int64_t>(values.size()), KernelDType(shape.dtype),
                                raw.data()),
            kernels::KernelStatus::kOk);
  return raw;
}

std::vector<float> ToFloats(const BlockShape& shape, std::span<const std::byte> raw) {
  const size_t n = raw.size() / ElementBytes(shape.dtype);
  std::vector<float> out(n);
  EXPECT_EQ(kernels::ConvertCpu(raw.data(), KernelDType(shape.dtype), static_cast<int64_t>(n),
                                kernels::DType::kFloat32, out.data()),
            kernels::KernelStatus::kOk);
  return out;
}

std::vector<std::byte> MakeRaw(const BlockShape& shape, uint32_t seed, float sigma = 1.0f) {
  const size_t n = shape.raw_bytes() / ElementBytes(shape.dtype);
  std::mt19937 rng(seed);
  std::normal_distribution<float> g(0.0f, sigma);
  std::vector<float> values(n);
  for (float& v : values) v = g(rng);
  return FromFloats(shape, values);
}

std::vector<P> RandomMap(const BlockShape& shape, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<P> p(shape.entries());
  for (auto& v : p) v = static_cast<P>(rng() % 4);
  return p;
}

std::vector<std::byte> Encode(const BlockShape& shape, std::span<const std::byte> raw,
                              std::span<const P> precision) {
  const absl::StatusOr<uint64_t> size = CompressedSizeV2(shape, precision);
  EXPECT_TRUE(size.ok()) << size.status();
  if (!size.ok()) return {};
  std::vector<std::byte> out(*size, std::byte{0xAB});
  const absl::Status st = EncodeBlockV2(shape, raw, precision, out);
  EXPECT_TRUE(st.ok()) << st;
  return out;
}

std::vector<std::byte> Decode(std::span<const std::byte> encoded) {
  const absl::StatusOr<CompressedBlockView> view = ParseCompressedBlock(encoded);
  EXPECT_TRUE(view.ok()) << view.status();
  if (!view.ok()) return {};
  std::vector<std::byte> out(view->shape.raw_bytes(), std::byte{0xCD});
  const absl::Status st = DecodeBlock(*view, out);
  EXPECT_TRUE(st.ok()) << st;
  return out;
}

// Checks every element of `decoded` against `raw` under `precision`: full
// entries bit-exact, pruned zero, INT8 within half a step of its group's
// range, INT4 within half its group's step (each plus the rounding to dtype).
void CheckRoundTrip(const BlockShape& s, std::span<const std::byte> raw,
                    std::span<const std::byte> decoded, std::span<const P> precision) {
  ASSERT_EQ(raw.size(), decoded.size());
  const std::vector<float> x = ToFloats(s, raw);
  const std::vector<float> y = ToFloats(s, decoded);
  const size_t e = ElementBytes(s.dtype);
  const float u = s.dtype == kFp16 ? 1.0f / 2048 : s.dtype == kBf16 ? 1.0f / 256 : 0.0f;
  const float eta = s.dtype == kFp16 ? std::ldexp(1.0f, -24) : 0.0f;
  for (uint32_t l = 0; l < s.num_layers; ++l) {
    for (uint32_t h = 0; h < s.num_kv_heads; ++h) {
      for (uint32_t kv = 0; kv < 2; ++kv) {
        // The groups' ranges, recomputed from the input.
        std::vector<float> a8(s.head_dim, 0), lo4(s.head_dim, INFINITY), hi4(s.head_dim, -INFINITY);
        for (uint32_t t = 0; t < s.block_tokens; ++t) {
          for (uint32_t d = 0; d < s.head_dim; ++d) {
            const float v = x[RawIndex(s, l, kv, h, t, d)];
            if (precision[Entry(s, l, h, t)] == P::kInt8) a8[d] = std::max(a8[d], std::fabs(v));
            if (precision[Entry(s, l, h, t)] == P::kInt4) {
              lo4[d] = std::min(lo4[d], v);
              hi4[d] = std::max(hi4[d], v);
            }
          }
        }
        for (uint32_t t = 0; t < s.block_tokens; ++t) {
          const P p = precision[Entry(s, l, h, t)];
          float row_a = 0, row_lo = INFINITY, row_hi = -INFINITY;
          for (uint32_t d = 0; d < s.head_dim; ++d) {
            const float v = x[RawIndex(s, l, kv, h, t, d)];
            row_a = std::max(row_a, std::fabs(v));
            row_lo = std::min(row_lo, v);
            row_hi = std::max(row_hi, v);
          }
          for (uint32_t d = 0; d < s.head_dim; ++d) {
            const size_t i = RawIndex(s, l, kv, h, t, d);
            const float got = y[i];
            switch (p) {
              case P::kFull:
                ASSERT_EQ(std::memcmp(&raw[i * e], &decoded[i * e], e), 0)
                    << "full entry not bit-exact at " << l << "," << kv << "," << h << "," << t;
                break;
              case P::kPruned:
                ASSERT_EQ(got, 0.0f);
                break;
              case P::kInt8: {
                const float a = kv == 0 ? a8[d] : row_a;
                const float bound = a / 254 * (1 + 1e-4f) + std::fabs(got) * u + eta;
                ASSERT_LE(std::fabs(got - x[i]), bound) << "int8 at " << i << " a=" << a;
                break;
              }
              case P::kInt4: {
                const float lo = kv == 0 ? lo4[d] : row_lo, hi = kv == 0 ? hi4[d] : row_hi;
                const float bound =
                    (hi - lo) / 30 * (1 + 1e-4f) + std::fabs(got) * u + eta + std::fabs(lo) * 1e-6f;
                ASSERT_LE(std::fabs(got - x[i]), bound)
                    << "int4 at " << i << " lo=" << lo << " hi=" << hi;
                break;
              }
            }
          }
        }
      }
    }
  }
}

// Sizes computed by tests/eval/kv_quant.py v2_block_bytes(precision, head_dim, element_bytes).
TEST(BlockCodecV2Test, SizesMatchTheEvaluationFormula) {
  struct Case {
    uint32_t layers, heads, tokens, dim, dtype;
    std::vector<uint8_t> map;  // empty: one value for every entry
    uint8_t fill;
    uint64_t python_bytes;
  };
  const std::vector<uint8_t> odd = {0, 1, 3, 2, 3, 3, 3, 1, 0, 2};
  const std::vector<uint8_t> mixed = {0, 1, 2, 3, 3, 1, 0, 0, 1, 3, 3, 2,
                                      1, 1, 3, 0, 2, 2, 3, 1, 0, 3, 1, 3};
  std::vector<uint8_t> smollm(30 * 3 * 16);
  for (size_t i = 0; i < smollm.size(); ++i) smollm[i] = (i * 7 + 3) % 4;
  const std::vector<Case> cases = {
      {2, 3, 4, 8, kFp16, {}, 0, 824},           {2, 3, 4, 8, kFp16, {}, 1, 584},
      {2, 3, 4, 8, kFp16, {}, 3, 536},           {2, 3, 4, 8, kFp16, {}, 2, 56},
      {2, 1, 5, 3, kFp16, odd, 0, 180},          {2, 1, 5, 3, kFp32, odd, 0, 244},
      {2, 2, 6, 5, kFp16, mixed, 0, 488},        {2, 2, 6, 5, kFp32, mixed, 0, 732},
      {30, 3, 16, 64, kFp16, smollm, 0, 198408}, {30, 3, 16, 64, kFp16, {}, 1, 199128},
  };
  for (const Case& c : cases) {
    const BlockShape shape{c.layers, c.heads, c.dim, c.tokens, c.dtype};
    std::vector<P> p(shape.entries(), static_cast<P>(c.fill));
    for (size_t i = 0; i < c.map.size(); ++i) p[i] = static_cast<P>(c.map[i]);
    const absl::StatusOr<uint64_t> size = CompressedSizeV2(shape, p);
    ASSERT_TRUE(size.ok()) << size.status();
    EXPECT_EQ(*size, c.python_bytes) << c.layers << "x" << c.heads << "x" << c.tokens;
    // Bf16 has the same element size as fp16.
    if (c.dtype == kFp16) {
      const BlockShape bf{c.layers, c.heads, c.dim, c.tokens, kBf16};
      EXPECT_EQ(CompressedSizeV2(bf, p).value_or(0), c.python_bytes);
    }
    // And the encoding has exactly that size and parses.
    const std::vector<std::byte> enc = Encode(shape, MakeRaw(shape, 5), p);
    EXPECT_EQ(enc.size(), c.python_bytes);
    EXPECT_TRUE(ParseCompressedBlock(enc).ok());
  }
}

// kv_quant.apply_precision on one fp16 (layer, head) of 6 tokens x 5 channels with
// precision [int8, int4, int8, int4, int4, full]: the decoded bits must be equal.
TEST(BlockCodecV2Test, QuantizersMatchTheEvaluationBitForBit) {
  const BlockShape shape{1, 1, 5, 6, kFp16};
  const std::vector<uint16_t> k_in = {50905, 48928, 17043, 50555, 46739, 17576, 50204, 15276,
                                      17927, 49531, 16552, 50800, 48507, 17254, 50450, 0,
                                      17682, 50022, 15739, 18032, 49320, 16763, 50695, 48044,
                                      17436, 50344, 13971, 17787, 49811, 16160};
  const std::vector<uint16_t> v_in = {51828, 17458, 51051, 18647, 49086, 19349, 17177, 51208,
                                      18564, 49449, 19266, 16846, 51291, 18482, 49780, 19183,
                                      16516, 51373, 18366, 50110, 19101, 15988, 51456, 18201,
                                      50308, 19018, 15294, 51539, 18036, 50473};
  const std::vector<uint16_t> k_out = {50905, 48921, 17043, 50555, 46691, 17576, 50204, 15276,
                                       17927, 49531, 16547, 50800, 48509, 17260, 50450, 0,
                                       17682, 50022, 15739, 18032, 49320, 16703, 50695, 48044,
                                       17403, 50344, 13971, 17787, 49811, 16160};
  const std::vector<uint16_t> v_out = {51828, 17451, 51051, 18644, 49081, 19349, 16782, 51208,
                                       18556, 49018, 19266, 16823, 51288, 18476, 49767, 19183,
                                       16912, 51373, 18349, 49746, 19101, 16582, 51456, 18184,
                                       50077, 19018, 15294, 51539, 18036, 50473};
  std::vector<uint16_t> raw16 = k_in;
  raw16.insert(raw16.end(), v_in.begin(), v_in.end());
  std::vector<std::byte> raw(raw16.size() * 2);
  std::memcpy(raw.data(), raw16.data(), raw.size());
  const std::vector<P> p = {P::kInt8, P::kInt4, P::kInt8, P::kInt4, P::kInt4, P::kFull};
  const std::vector<std::byte> dec = Decode(Encode(shape, raw, p));
  ASSERT_EQ(dec.size(), raw.size());
  std::vector<uint16_t> got(raw16.size());
  std::memcpy(got.data(), dec.data(), dec.size());
  std::vector<uint16_t> want = k_out;
  want.insert(want.end(), v_out.begin(), v_out.end());
  EXPECT_EQ(got, want);
}

TEST(BlockCodecV2Test, RandomMapsRoundTripInEveryDType) {
  for (uint32_t dtype : {kFp16, kBf16, kFp32}) {
    for (uint32_t seed = 1; seed <= 6; ++seed) {
      const BlockShape shape{3, 2, seed % 2 ? 7u : 16u, seed % 3 ? 5u : 16u, dtype};
      const std::vector<std::byte> raw = MakeRaw(shape, seed, seed == 3 ? 100.0f : 1.0f);
      const std::vector<P> p = RandomMap(shape, seed * 11);
      const std::vector<std::byte> dec = Decode(Encode(shape, raw, p));
      SCOPED_TRACE(testing::Message() << "dtype " << dtype << " seed " << seed);
      CheckRoundTrip(shape, raw, dec, p);
    }
  }
}

TEST(BlockCodecV2Test, OnePrecisionMaps) {
  for (uint32_t dtype : {kFp16, kBf16, kFp32}) {
    const BlockShape shape{2, 3, 9, 8, dtype};
    const std::vector<std::byte> raw = MakeRaw(shape, 17);
    for (P fill : {P::kFull, P::kInt8, P::kInt4, P::kPruned}) {
      const std::vector<P> p(shape.entries(), fill);
      const std::vector<std::byte> enc = Encode(shape, raw, p);
      const absl::StatusOr<CompressedBlockView> view = ParseCompressedBlock(enc);
      ASSERT_TRUE(view.ok()) << view.status();
      EXPECT_EQ(view->version, kCompressedVersion2);
      const uint32_t n = static_cast<uint32_t>(shape.entries());
      EXPECT_EQ(view->num_full, fill == P::kFull ? n : 0);
      EXPECT_EQ(view->num_int8, fill == P::kInt8 ? n : 0);
      EXPECT_EQ(view->num_int4, fill == P::kInt4 ? n : 0);
      EXPECT_EQ(view->num_pruned, fill == P::kPruned ? n : 0);
      EXPECT_EQ(view->TokenKept(3), fill != P::kPruned);
      EXPECT_EQ(view->EntryPrecision(1, 2, 7), fill);
      const std::vector<std::byte> dec = Decode(enc);
      CheckRoundTrip(shape, raw, dec, p);
      if (fill == P::kFull) {
        EXPECT_EQ(dec, raw);
      }
    }
  }
}

TEST(BlockCodecV2Test, EntryPrecisionAndTokenKeptReadTheMap) {
  const BlockShape shape{2, 2, 4, 5, kFp16};
  std::vector<P> p(shape.entries(), P::kPruned);
  p[Entry(shape, 1, 0, 2)] = P::kInt4;
  p[Entry(shape, 0, 1, 4)] = P::kInt8;
  const std::vector<std::byte> enc = Encode(shape, MakeRaw(shape, 3), p);
  const absl::StatusOr<CompressedBlockView> view = ParseCompressedBlock(enc);
  ASSERT_TRUE(view.ok());
  for (uint32_t l = 0; l < 2; ++l) {
    for (uint32_t h = 0; h < 2; ++h) {
      for (uint32_t t = 0; t < 5; ++t)
        EXPECT_EQ(view->EntryPrecision(l, h, t), p[Entry(shape, l, h, t)]);
    }
  }
  EXPECT_FALSE(view->TokenKept(0));
  EXPECT_TRUE(view->TokenKept(2));
  EXPECT_TRUE(view->TokenKept(4));
}

TEST(BlockCodecV2Test, EncodingIsDeterministicWithZeroPadding) {
  const BlockShape shape{2, 1, 3, 5, kFp16};  // odd sizes: every section pads
  const std::vector<std::byte> raw = MakeRaw(shape, 9);
  const std::vector<P> p = {P::kFull, P::kInt8, P::kInt4, P::kPruned, P::kInt4,
                            P::kInt4, P::kInt4, P::kInt8, P::kFull,   P::kPruned};
  std::vector<std::byte> a(*CompressedSizeV2(shape, p), std::byte{0x00});
  std::vector<std::byte> b(a.size(), std::byte{0xFF});
  ASSERT_TRUE(EncodeBlockV2(shape, raw, p, a).ok());
  ASSERT_TRUE(EncodeBlockV2(shape, raw, p, b).ok());
  EXPECT_EQ(a, b);
  EXPECT_EQ(a.size(), 180u);  // kv_quant.py v2_block_bytes
}

TEST(BlockCodecV2Test, HugeAndTinyRangesKeepTheirBounds) {
  // fp32 ranges whose float arithmetic overflows (hi - lo, 127 / A) take the
  // double path; the bounds still hold.
  const BlockShape shape{1, 1, 4, 4, kFp32};
  const float big = 3.0e38f, tiny = 1.0e-39f;
  std::vector<float> values = {
      big,    -big,  big / 3,  0,  // K token 0..3 rows
      -big,   big,   0,        big / 7, big / 2, -big / 5, 1,     -1,       big, big, -big, -big,
      tiny,   -tiny, tiny / 2, 0,  // V rows
      1e-40f, 0,     -1e-40f,  3e-40f,  tiny,    tiny,     -tiny, tiny / 8, 1,   2,   3,    4};
  const std::vector<std::byte> raw = FromFloats(shape, values);
  for (P fill : {P::kInt8, P::kInt4}) {
    const std::vector<P> p(4, fill);
    const std::vector<std::byte> dec = Decode(Encode(shape, raw, p));
    for (float v : ToFloats(shape, dec)) EXPECT_TRUE(std::isfinite(v));
    CheckRoundTrip(shape, raw, dec, p);
  }
}

TEST(BlockCodecV2Test, NonFiniteEntriesStayFull) {
  const BlockShape shape{2, 2, 4, 3, kFp16};
  std::vector<float> values(shape.raw_bytes() / 2, 0.5f);
  values[RawIndex(shape, 1, 1, 0, 2, 3)] = INFINITY;  // V of (layer 1, head 0, token 2)
  values[RawIndex(shape, 0, 0, 1, 0, 1)] = NAN;       // K of (layer 0, head 1, token 0)
  const std::vector<std::byte> raw = FromFloats(shape, values);
  std::vector<P> p(shape.entries(), P::kInt4);
  p[Entry(shape, 0, 1, 0)] = P::kFull;  // already full: not counted
  EXPECT_EQ(KeepNonFiniteEntriesFull(shape, raw, p), 1u);
  EXPECT_EQ(p[Entry(shape, 1, 0, 2)], P::kFull);
  EXPECT_EQ(p[Entry(shape, 0, 1, 0)], P::kFull);
  EXPECT_EQ(std::count(p.begin(), p.end(), P::kFull), 2);
  const std::vector<std::byte> dec = Decode(Encode(shape, raw, p));
  CheckRoundTrip(shape, raw, dec, p);
  // Mismatched sizes change nothing.
  std::vector<P> short_map(3, P::kInt8);
  EXPECT_EQ(KeepNonFiniteEntriesFull(shape, raw, short_map), 0u);
}

TEST(BlockCodecV2Test, NonFiniteValuesInQuantizedEntriesDoNotCrash) {
  const BlockShape shape{1, 1, 4, 3, kFp32};
  std::vector<float> values(shape.raw_bytes() / 4, 1.0f);
  values[1] = NAN;
  values[6] = INFINITY;
  values[13] = -INFINITY;
  const std::vector<std::byte> raw = FromFloats(shape, values);
  for (P fill : {P::kInt8, P::kInt4}) {
    const std::vector<P> p(3, fill);
    EXPECT_EQ(Decode(Encode(shape, raw, p)).size(), raw.size());
  }
}

TEST(BlockCodecV2Test, Version1StillDecodesAndRejectsInt4) {
  const BlockShape shape{2, 2, 8, 4, kFp16};
  const std::vector<std::byte> raw = MakeRaw(shape, 4);
  const std::vector<P> p1 = {P::kFull, P::kInt8, P::kPruned, P::kInt8};
  std::vector<std::byte> v1(*CompressedSize(shape, p1));
  ASSERT_TRUE(EncodeBlock(shape, raw, p1, v1).ok());
  const absl::StatusOr<CompressedBlockView> view = ParseCompressedBlock(v1);
  ASSERT_TRUE(view.ok());
  EXPECT_EQ(view->version, kCompressedVersion1);
  EXPECT_EQ(view->EntryPrecision(1, 1, 1), P::kInt8);
  EXPECT_FALSE(view->TokenKept(2));
  EXPECT_TRUE(view->TokenKept(0));
  // The same decision as a version-2 map decodes identically for full and pruned tokens.
  std::vector<P> p2(shape.entries());
  for (size_t i = 0; i < p2.size(); ++i) p2[i] = p1[i % 4];
  const std::vector<std::byte> d1 = Decode(v1);
  const std::vector<std::byte> d2 = Decode(Encode(shape, raw, p2));
  ASSERT_EQ(d1.size(), d2.size());
  for (uint32_t l = 0; l < 2; ++l) {
    for (uint32_t kv = 0; kv < 2; ++kv) {
      for (uint32_t h = 0; h < 2; ++h) {
        for (uint32_t t : {0u, 2u}) {
          const size_t i = RawIndex(shape, l, kv, h, t, 0) * 2;
          EXPECT_EQ(std::memcmp(&d1[i], &d2[i], 16), 0);
        }
      }
    }
  }
  const std::vector<P> with_int4 = {P::kFull, P::kInt4, P::kPruned, P::kInt8};
  EXPECT_EQ(CompressedSize(shape, with_int4).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(BlockCodecV2Test, SizeMismatchesAreInvalidArgument) {
  const BlockShape shape{2, 2, 4, 3, kFp16};
  const std::vector<std::byte> raw = MakeRaw(shape, 1);
  const std::vector<P> p(shape.entries(), P::kInt8);
  const uint64_t size = *CompressedSizeV2(shape, p);
  std::vector<std::byte> out(size);
  EXPECT_EQ(CompressedSizeV2(shape, std::vector<P>(3, P::kInt8)).status().code(),
            absl::StatusCode::kInvalidArgument);
  std::vector<P> bad = p;
  bad[5] = static_cast<P>(4);
  EXPECT_THAT(std::string(CompressedSizeV2(shape, bad).status().message()),
              HasSubstr("precision[5]"));
  EXPECT_EQ(CompressedSizeV2(BlockShape{2, 2, 4, 3, 9}, p).status().code(),
            absl::StatusCode::kInvalidArgument);
  std::vector<std::byte> small(size - 1);
  EXPECT_EQ(EncodeBlockV2(shape, raw, p, small).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(EncodeBlockV2(shape, std::span(raw).first(raw.size() - 2), p, out).code(),
            absl::StatusCode::kInvalidArgument);
  ASSERT_TRUE(EncodeBlockV2(shape, raw, p, out).ok());
  const absl::StatusOr<CompressedBlockView> view = ParseCompressedBlock(out);
  ASSERT_TRUE(view.ok());
  std::vector<std::byte> dst(raw.size() + 1);
  EXPECT_EQ(DecodeBlock(*view, dst).code(), absl::StatusCode::kInvalidArgument);
  CompressedBlockView forged = *view;
  forged.num_int8 -= 1;
  forged.num_full += 1;
  dst.resize(raw.size());
  EXPECT_EQ(DecodeBlock(forged, dst).code(), absl::StatusCode::kInvalidArgument);
  forged = *view;
  forged.entry_map = forged.entry_map.first(forged.entry_map.size() - 1);
  EXPECT_EQ(DecodeBlock(forged, dst).code(), absl::StatusCode::kInvalidArgument);
}

class ParseV2Test : public ::testing::Test {
 protected:
  // 2 x 1 x 5 tokens: 10 entries, so the map's last byte has unused bits.
  const BlockShape shape_{2, 1, 3, 5, kFp16};
  const std::vector<P> map_ = {P::kFull, P::kInt8, P::kInt4, P::kPruned, P::kInt4,
                               P::kInt4, P::kInt4, P::kInt8, P::kFull,   P::kPruned};
  std::vector<std::byte> enc_ = Encode(shape_, MakeRaw(shape_, 2), map_);

  static void PutU32(std::vector<std::byte>& b, size_t off, uint32_t v) {
    std::memcpy(&b[off], &v, 4);
  }
  absl::Status Parse(const std::vector<std::byte>& b) { return ParseCompressedBlock(b).status(); }
};

TEST_F(ParseV2Test, AcceptsTheEncoding) { EXPECT_TRUE(Parse(enc_).ok()); }

TEST_F(ParseV2Test, RejectsEveryTruncationAndTrailingBytes) {
  for (size_t n = 0; n < enc_.size(); ++n) {
    const std::vector<std::byte> cut(enc_.begin(), enc_.begin() + static_cast<ptrdiff_t>(n));
    EXPECT_EQ(Parse(cut).code(), absl::StatusCode::kDataLoss) << n;
  }
  std::vector<std::byte> longer = enc_;
  longer.push_back(std::byte{0});
  EXPECT_EQ(Parse(longer).code(), absl::StatusCode::kDataLoss);
}

TEST_F(ParseV2Test, RejectsCorruptHeaderFields) {
  struct Edit {
    size_t off;
    uint32_t value;
    const char* reason;
  };
  const std::vector<Edit> edits = {
      {8, 3, "entries"},           // num_layers: counts no longer sum
      {16, 0, "invalid shape"},    // head_dim 0
      {24, 7, "invalid shape"},    // dtype
      {28, 3, "num_full"},         // num_full + ... != entries
      {44, 3, "num_int4"},         // num_int4
      {40, 999, "payload_bytes"},  // payload
  };
  for (const Edit& e : edits) {
    std::vector<std::byte> b = enc_;
    PutU32(b, e.off, e.value);
    const absl::Status st = Parse(b);
    EXPECT_EQ(st.code(), absl::StatusCode::kDataLoss) << e.off;
    EXPECT_THAT(std::string(st.message()), HasSubstr(e.reason)) << e.off << ": " << st;
  }
  // Counts that still sum to the entries but disagree with the map.
  std::vector<std::byte> b = enc_;
  PutU32(b, 28, 3);  // num_full 2 -> 3
  PutU32(b, 32, 1);  // num_int8 2 -> 1
  EXPECT_THAT(std::string(Parse(b).message()), HasSubstr("precision map has"));
  // Version 3 is unknown.
  b = enc_;
  b[4] = std::byte{3};
  EXPECT_THAT(std::string(Parse(b).message()), HasSubstr("unsupported version"));
}

TEST_F(ParseV2Test, RejectsMapsThatDisagree) {
  // An entry changed from int8 to int4 changes the implied size and the counts.
  std::vector<std::byte> b = enc_;
  b[48] ^= std::byte{0x08};  // entry 1: 01 -> 11
  EXPECT_EQ(Parse(b).code(), absl::StatusCode::kDataLoss);
  // Bits past the last entry (10 entries: byte 2's high nibble is unused).
  b = enc_;
  b[50] |= std::byte{0x40};
  EXPECT_THAT(std::string(Parse(b).message()), HasSubstr("past its last entry"));
  // The map's padding byte.
  b = enc_;
  b[51] = std::byte{1};
  EXPECT_THAT(std::string(Parse(b).message()), HasSubstr("padding"));
}

TEST_F(ParseV2Test, SurvivesCorruptionAndGarbage) {
  std::mt19937 rng(99);
  std::vector<std::byte> out(shape_.raw_bytes());
  for (int i = 0; i < 3000; ++i) {
    std::vector<std::byte> b = enc_;
    const int flips = 1 + static_cast<int>(rng() % 4);
    for (int f = 0; f < flips; ++f) b[rng() % b.size()] ^= std::byte(1u << (rng() % 8));
    const absl::StatusOr<CompressedBlockView> view = ParseCompressedBlock(b);
    if (view.ok() && view->shape.raw_bytes() == out.size()) {
      EXPECT_TRUE(DecodeBlock(*view, out).ok());
    }
  }
  for (int i = 0; i < 2000; ++i) {
    std::vector<std::byte> b(48 + rng() % 200);
    for (auto& x : b) x = std::byte(rng());
    std::memcpy(b.data(), &kCompressedMagic, 4);
    b[4] = std::byte{2};
    b[5] = std::byte{0};
    b[6] = std::byte{48};
    b[7] = std::byte{0};
    const absl::StatusOr<CompressedBlockView> view = ParseCompressedBlock(b);
    if (view.ok()) {
      std::vector<std::byte> o(view->shape.raw_bytes());
      EXPECT_TRUE(DecodeBlock(*view, o).ok());
    }
  }
}

}  // namespace
}  // namespace kvcache::importance
