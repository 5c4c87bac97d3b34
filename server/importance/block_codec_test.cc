#include "server/importance/block_codec.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "kvcache/kernels/convert.h"
#include "kvcache/kernels/types.h"

namespace kvcache::importance {
namespace {

using ::testing::HasSubstr;

constexpr uint32_t kProtoFp16 = 1;
constexpr uint32_t kProtoBf16 = 2;
constexpr uint32_t kProtoFp32 = 3;

kernels::DType KernelDType(uint32_t proto) {
  return proto == kProtoFp16   ? kernels::DType::kFloat16
         : proto == kProtoBf16 ? kernels::DType::kBFloat16
                               : kernels::DType::kFloat32;
}

size_t ElementBytes(uint32_t proto) { return proto == kProtoFp32 ? 4 : 2; }

std::string DTypeLabel(uint32_t proto) {
  return proto == kProtoFp16 ? "fp16" : proto == kProtoBf16 ? "bf16" : "fp32";
}

// Index of element (layer, kv, head, token, dim) in the raw layout.
size_t RawIndex(const BlockShape& s, uint32_t layer, uint32_t kv, uint32_t h, uint32_t t,
                uint32_t d) {
  return (((static_cast<size_t>(layer) * 2 + kv) * s.num_kv_heads + h) * s.block_tokens + t) *
             s.head_dim +
         d;
}

// A raw block of Gaussian values (sigma `sigma`) in the shape's dtype.
std::vector<std::byte> MakeRaw(const BlockShape& shape, uint32_t seed, float sigma = 1.0f) {
  const size_t n = shape.raw_bytes() / ElementBytes(shape.dtype);
  std::mt19937 rng(seed);
  std::normal_distribution<float> g(0.0f, sigma);
  std::vector<float> values(n);
  for (float& v : values) v = g(rng);
  std::vector<std::byte> raw(shape.raw_bytes());
  EXPECT_EQ(kernels::ConvertCpu(values.data(), kernels::DType::kFloat32, static_cast<int64_t>(n),
                                KernelDType(shape.dtype), raw.data()),
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

std::vector<TokenPrecision> RandomPrecision(uint32_t tokens, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<TokenPrecision> p(tokens);
  for (auto& v : p) v = static_cast<TokenPrecision>(rng() % 3);
  return p;
}

std::vector<std::byte> Encode(const BlockShape& shape, std::span<const std::byte> raw,
                              std::span<const TokenPrecision> precision) {
  const absl::StatusOr<uint64_t> size = CompressedSize(shape, precision);
  EXPECT_TRUE(size.ok()) << size.status();
  if (!size.ok()) return {};
  std::vector<std::byte> out(*size, std::byte{0xAB});
  const absl::Status st = EncodeBlock(shape, raw, precision, out);
  EXPECT_TRUE(st.ok()) << st;
  return out;
}

std::vector<std::byte> Decode(const BlockShape& shape, std::span<const std::byte> encoded) {
  const absl::StatusOr<CompressedBlockView> view = ParseCompressedBlock(encoded);
  EXPECT_TRUE(view.ok()) << view.status();
  if (!view.ok()) return {};
  std::vector<std::byte> out(shape.raw_bytes(), std::byte{0xCD});
  const absl::Status st = DecodeBlock(*view, out);
  EXPECT_TRUE(st.ok()) << st;
  return out;
}

uint32_t ReadU32(std::span<const std::byte> b, size_t off) {
  uint32_t v;
  std::memcpy(&v, b.data() + off, 4);
  return v;
}
void WriteU32(std::span<std::byte> b, size_t off, uint32_t v) {
  std::memcpy(b.data() + off, &v, 4);
}

// The kernels' INT8 error bound (quantize.h) for an original x, its decoded x' and the group's
// scale, in the dtype's unit roundoff.
double ErrorBound(uint32_t proto, float scale, float decoded) {
  const double u = proto == kProtoFp32   ? 0.0
                   : proto == kProtoFp16 ? std::ldexp(1.0, -11)
                                         : std::ldexp(1.0, -8);
  const double eta = proto == kProtoFp16 ? std::ldexp(1.0, -25) : 0.0;
  return scale * (0.5 + std::ldexp(1.0, -15)) + std::abs(decoded) * u + eta;
}

// The scale the kernels use for a group with maximum magnitude `amax`.
float ScaleOf(float amax) { return amax / 127.0f; }

// Checks a decoded block against the original token by token: full tokens bit for bit, INT8
// tokens within the kernels' bound for the scales recomputed from the original, pruned tokens
// zero bytes.
void CheckDecoded(const BlockShape& s, std::span<const TokenPrecision> precision,
                  std::span<const std::byte> raw, std::span<const std::byte> decoded) {
  ASSERT_EQ(raw.size(), decoded.size());
  const size_t eb = ElementBytes(s.dtype);
  const std::vector<float> x = ToFloats(s, raw);
  const std::vector<float> y = ToFloats(s, decoded);
  int failures = 0;
  for (uint32_t l = 0; l < s.num_layers; ++l) {
    for (uint32_t kv = 0; kv < 2; ++kv) {
      for (uint32_t h = 0; h < s.num_kv_heads; ++h) {
        // Per-channel maxima over the INT8 tokens (keys).
        std::vector<float> channel_max(s.head_dim, 0.0f);
        for (uint32_t t = 0; t < s.block_tokens; ++t) {
          if (precision[t] != TokenPrecision::kInt8) continue;
          for (uint32_t d = 0; d < s.head_dim; ++d) {
            channel_max[d] = std::max(channel_max[d], std::abs(x[RawIndex(s, l, kv, h, t, d)]));
          }
        }
        for (uint32_t t = 0; t < s.block_tokens; ++t) {
          const size_t row = RawIndex(s, l, kv, h, t, 0);
          if (precision[t] == TokenPrecision::kFull) {
            EXPECT_EQ(
                std::memcmp(raw.data() + row * eb, decoded.data() + row * eb, s.head_dim * eb), 0)
                << "full token " << t << " layer " << l << " kv " << kv << " head " << h;
          } else if (precision[t] == TokenPrecision::kPruned) {
            for (size_t i = 0; i < s.head_dim * eb; ++i) {
              if (decoded[row * eb + i] != std::byte{0}) {
                ADD_FAILURE() << "pruned token " << t << " byte " << i << " not zero";
                break;
              }
            }
          } else {
            float token_max = 0.0f;
            for (uint32_t d = 0; d < s.head_dim; ++d) {
              token_max = std::max(token_max, std::abs(x[row + d]));
            }
            for (uint32_t d = 0; d < s.head_dim; ++d) {
              const float scale = ScaleOf(kv == 0 ? channel_max[d] : token_max);
              const double err = std::abs(static_cast<double>(y[row + d]) - x[row + d]);
              if (err > ErrorBound(s.dtype, scale, y[row + d]) && ++failures <= 5) {
                ADD_FAILURE() << "int8 token " << t << " dim " << d << " layer " << l << " kv "
                              << kv << ": " << x[row + d] << " -> " << y[row + d] << " (scale "
                              << scale << ")";
              }
            }
          }
        }
      }
    }
  }
  EXPECT_EQ(failures, 0);
}

struct Case {
  BlockShape shape;
  std::string name;
};

std::vector<Case> Shapes() {
  std::vector<Case> cases;
  const BlockShape dims[] = {
      {2, 2, 64, 16, 0},  // typical, small
      {1, 1, 3, 5, 0},    // odd sizes: 16-bit full sections need padding
      {3, 4, 128, 32, 0}, {1, 3, 7, 9, 0}, {2, 1, 1, 1, 0},  // one token, one channel
  };
  for (const uint32_t dtype : {kProtoFp16, kProtoBf16, kProtoFp32}) {
    for (BlockShape s : dims) {
      s.dtype = dtype;
      cases.push_back(
          Case{s, absl::StrCat(DTypeLabel(dtype), " L", s.num_layers, " H", s.num_kv_heads, " D",
                               s.head_dim, " T", s.block_tokens)});
    }
  }
  return cases;
}

TEST(BlockShapeTest, RawBytes) {
  EXPECT_EQ((BlockShape{2, 4, 128, 16, kProtoFp16}.raw_bytes()), 2u * 2 * 4 * 128 * 16 * 2);
  EXPECT_EQ((BlockShape{1, 1, 1, 1, kProtoFp32}.raw_bytes()), 8u);
  EXPECT_EQ((BlockShape{0, 4, 128, 16, kProtoFp16}.raw_bytes()), 0u);
  EXPECT_EQ((BlockShape{2, 4, 128, 0, kProtoFp16}.raw_bytes()), 0u);
  EXPECT_EQ((BlockShape{2, 4, 128, 16, 0}.raw_bytes()), 0u);
  EXPECT_EQ((BlockShape{2, 4, 128, 16, 4}.raw_bytes()), 0u);
  // Would overflow 64 bits; must be rejected, not wrapped.
  EXPECT_EQ((BlockShape{0xFFFFFFFFu, 0xFFFFFFFFu, 0xFFFFFFFFu, 0xFFFFFFFFu, 3}.raw_bytes()), 0u);
  EXPECT_EQ((BlockShape{1u << 20, 1u << 20, 1u << 20, 1, 3}.raw_bytes()), 0u);
  // Each dimension must fit the kernels' int32 token indices.
  EXPECT_EQ((BlockShape{1, 1, 1, 0x7FFFFFFFu, kProtoFp16}.raw_bytes()), uint64_t{4} * 0x7FFFFFFFu);
  EXPECT_EQ((BlockShape{1, 1, 1, 0x80000000u, kProtoFp16}.raw_bytes()), 0u);
  EXPECT_EQ((BlockShape{1, 0x80000000u, 1, 1, kProtoFp16}.raw_bytes()), 0u);
}

TEST(BlockCodecTest, AllFullIsBitExact) {
  for (const Case& c : Shapes()) {
    SCOPED_TRACE(c.name);
    const std::vector<std::byte> raw = MakeRaw(c.shape, 1);
    const std::vector<TokenPrecision> p(c.shape.block_tokens, TokenPrecision::kFull);
    const std::vector<std::byte> enc = Encode(c.shape, raw, p);
    EXPECT_EQ(Decode(c.shape, enc), raw);
  }
}

TEST(BlockCodecTest, AllInt8WithinKernelBound) {
  for (const Case& c : Shapes()) {
    SCOPED_TRACE(c.name);
    const std::vector<std::byte> raw = MakeRaw(c.shape, 2);
    const std::vector<TokenPrecision> p(c.shape.block_tokens, TokenPrecision::kInt8);
    const std::vector<std::byte> enc = Encode(c.shape, raw, p);
    CheckDecoded(c.shape, p, raw, Decode(c.shape, enc));
  }
}

TEST(BlockCodecTest, AllPrunedDecodesToZero) {
  for (const Case& c : Shapes()) {
    SCOPED_TRACE(c.name);
    const std::vector<std::byte> raw = MakeRaw(c.shape, 3);
    const std::vector<TokenPrecision> p(c.shape.block_tokens, TokenPrecision::kPruned);
    const std::vector<std::byte> enc = Encode(c.shape, raw, p);
    EXPECT_EQ(enc.size(), kCompressedHeaderBytes + ((c.shape.block_tokens + 3) / 4) * 4);
    EXPECT_EQ(Decode(c.shape, enc), std::vector<std::byte>(raw.size(), std::byte{0}));
  }
}

TEST(BlockCodecTest, MixedPrecisionRoundTrip) {
  uint32_t seed = 100;
  for (const Case& c : Shapes()) {
    for (int trial = 0; trial < 4; ++trial) {
      SCOPED_TRACE(absl::StrCat(c.name, " trial ", trial));
      const std::vector<std::byte> raw = MakeRaw(c.shape, ++seed, 0.5f + trial);
      const std::vector<TokenPrecision> p = RandomPrecision(c.shape.block_tokens, ++seed);
      const std::vector<std::byte> enc = Encode(c.shape, raw, p);
      CheckDecoded(c.shape, p, raw, Decode(c.shape, enc));
    }
  }
}

TEST(BlockCodecTest, EncodingIsDeterministicAndPaddingZero) {
  const BlockShape shape{2, 1, 3, 5, kProtoFp16};  // odd sections: every padding is used
  const std::vector<std::byte> raw = MakeRaw(shape, 9);
  const std::vector<TokenPrecision> p = {TokenPrecision::kFull, TokenPrecision::kInt8,
                                         TokenPrecision::kPruned, TokenPrecision::kFull,
                                         TokenPrecision::kFull};
  const uint64_t size = CompressedSize(shape, p).value();
  std::vector<std::byte> a(size, std::byte{0x00});
  std::vector<std::byte> b(size, std::byte{0xFF});
  ASSERT_TRUE(EncodeBlock(shape, raw, p, a).ok());
  ASSERT_TRUE(EncodeBlock(shape, raw, p, b).ok());
  EXPECT_EQ(a, b);
}

// Hand-computed layout: L=2, H=3, D=5, T=7, fp16, precision F I P F I I F
// (3 full, 3 int8, 1 pruned).
//   header 48, map 7 -> 8
//   per layer and K/V: full 3*3*5*2 = 90 -> 92, codes 3*3*5 = 45 -> 48
//   per layer scales: K 3*5*4 = 60, V 3*3*4 = 36
//   per layer 2*92 + 2*48 + 60 + 36 = 376; total 48 + 8 + 2*376 = 808.
TEST(BlockCodecTest, SizeAndLayoutMatchTheDocumentedFormat) {
  const BlockShape shape{2, 3, 5, 7, kProtoFp16};
  using P = TokenPrecision;
  const std::vector<P> p = {P::kFull, P::kInt8, P::kPruned, P::kFull, P::kInt8, P::kInt8, P::kFull};
  ASSERT_EQ(CompressedSize(shape, p).value(), 808u);
  const std::vector<std::byte> raw = MakeRaw(shape, 21);
  const std::vector<std::byte> enc = Encode(shape, raw, p);
  ASSERT_EQ(enc.size(), 808u);

  // Header.
  EXPECT_EQ(ReadU32(enc, 0), kCompressedMagic);
  EXPECT_EQ(ReadU32(enc, 4), 1u | (48u << 16));  // version 1, header_bytes 48
  EXPECT_EQ(ReadU32(enc, 8), 2u);
  EXPECT_EQ(ReadU32(enc, 12), 3u);
  EXPECT_EQ(ReadU32(enc, 16), 5u);
  EXPECT_EQ(ReadU32(enc, 20), 7u);
  EXPECT_EQ(ReadU32(enc, 24), kProtoFp16);
  EXPECT_EQ(ReadU32(enc, 28), 3u);
  EXPECT_EQ(ReadU32(enc, 32), 3u);
  EXPECT_EQ(ReadU32(enc, 36), 1u);
  EXPECT_EQ(ReadU32(enc, 40), 808u);
  EXPECT_EQ(ReadU32(enc, 44), 0u);
  // Precision map and its padding.
  for (size_t t = 0; t < 7; ++t) EXPECT_EQ(static_cast<uint8_t>(enc[48 + t]), uint8_t(p[t]));
  EXPECT_EQ(enc[55], std::byte{0});

  const std::vector<float> x = ToFloats(shape, raw);
  const uint32_t full_tokens[] = {0, 3, 6};
  const uint32_t int8_tokens[] = {1, 4, 5};
  for (uint32_t l = 0; l < 2; ++l) {
    const size_t layer_off = 56 + l * 376;
    for (uint32_t kv = 0; kv < 2; ++kv) {
      const size_t full_off = layer_off + (kv == 0 ? 0 : 92 + 48 + 60);
      const size_t scale_off = full_off + 92 + 48;
      // Full rows: [head][full token][dim], the raw bytes.
      for (uint32_t h = 0; h < 3; ++h) {
        for (uint32_t i = 0; i < 3; ++i) {
          const size_t src = RawIndex(shape, l, kv, h, full_tokens[i], 0) * 2;
          EXPECT_EQ(std::memcmp(enc.data() + full_off + (h * 3 + i) * 10, raw.data() + src, 10), 0)
              << "layer " << l << " kv " << kv << " head " << h << " full row " << i;
        }
      }
      EXPECT_EQ(enc[full_off + 90], std::byte{0});
      EXPECT_EQ(enc[full_off + 91], std::byte{0});
      EXPECT_EQ(enc[full_off + 92 + 45], std::byte{0});  // codes padding
      // Scales: keys per (head, channel), values per (head, int8 token).
      for (uint32_t h = 0; h < 3; ++h) {
        if (kv == 0) {
          for (uint32_t d = 0; d < 5; ++d) {
            float amax = 0;
            for (uint32_t t : int8_tokens)
              amax = std::max(amax, std::abs(x[RawIndex(shape, l, 0, h, t, d)]));
            float stored;
            std::memcpy(&stored, enc.data() + scale_off + (h * 5 + d) * 4, 4);
            EXPECT_FLOAT_EQ(stored, ScaleOf(amax)) << "K scale layer " << l << " h " << h;
          }
        } else {
          for (uint32_t i = 0; i < 3; ++i) {
            float amax = 0;
            for (uint32_t d = 0; d < 5; ++d) {
              amax = std::max(amax, std::abs(x[RawIndex(shape, l, 1, h, int8_tokens[i], d)]));
            }
            float stored;
            std::memcpy(&stored, enc.data() + scale_off + (h * 3 + i) * 4, 4);
            EXPECT_FLOAT_EQ(stored, ScaleOf(amax)) << "V scale layer " << l << " h " << h;
          }
        }
      }
    }
  }
}

TEST(BlockCodecTest, OtherHandComputedSizes) {
  // fp32, all full, L1 H1 D4 T4: 48 + 4 + 2 * 64.
  EXPECT_EQ(CompressedSize({1, 1, 4, 4, kProtoFp32},
                           std::vector<TokenPrecision>(4, TokenPrecision::kFull))
                .value(),
            180u);
  // bf16, all int8, L1 H2 D8 T3: 48 + 4 + (2 * 48 codes + 2*8*4 K scales + 2*3*4 V scales).
  EXPECT_EQ(CompressedSize({1, 2, 8, 3, kProtoBf16},
                           std::vector<TokenPrecision>(3, TokenPrecision::kInt8))
                .value(),
            48u + 4 + 96 + 64 + 24);
}

TEST(BlockCodecTest, UnalignedBuffersGiveTheSameResult) {
  for (const uint32_t dtype : {kProtoFp16, kProtoBf16, kProtoFp32}) {
    for (const bool all_int8 : {false, true}) {
      SCOPED_TRACE(absl::StrCat(DTypeLabel(dtype), all_int8 ? " all int8" : " mixed"));
      const BlockShape shape{2, 3, 16, 9, dtype};
      const std::vector<std::byte> raw = MakeRaw(shape, 31);
      const std::vector<TokenPrecision> p =
          all_int8 ? std::vector<TokenPrecision>(9, TokenPrecision::kInt8) : RandomPrecision(9, 32);
      const std::vector<std::byte> enc = Encode(shape, raw, p);
      const std::vector<std::byte> dec = Decode(shape, enc);

      // Shift every buffer by one byte.
      std::vector<std::byte> raw_buf(raw.size() + 1);
      std::memcpy(raw_buf.data() + 1, raw.data(), raw.size());
      std::vector<std::byte> enc_buf(enc.size() + 1);
      const std::span<std::byte> enc_u(enc_buf.data() + 1, enc.size());
      ASSERT_TRUE(EncodeBlock(shape, std::span(raw_buf).subspan(1), p, enc_u).ok());
      EXPECT_TRUE(std::equal(enc_u.begin(), enc_u.end(), enc.begin()));

      const absl::StatusOr<CompressedBlockView> view = ParseCompressedBlock(enc_u);
      ASSERT_TRUE(view.ok()) << view.status();
      std::vector<std::byte> dec_buf(dec.size() + 1);
      const std::span<std::byte> dec_u(dec_buf.data() + 1, dec.size());
      ASSERT_TRUE(DecodeBlock(*view, dec_u).ok());
      EXPECT_TRUE(std::equal(dec_u.begin(), dec_u.end(), dec.begin()));
    }
  }
}

TEST(BlockCodecTest, Int8RelativeRmseOnGaussianData) {
  for (const uint32_t dtype : {kProtoFp16, kProtoBf16, kProtoFp32}) {
    SCOPED_TRACE(DTypeLabel(dtype));
    const BlockShape shape{2, 4, 128, 32, dtype};
    const std::vector<std::byte> raw = MakeRaw(shape, 41, 2.0f);
    const std::vector<TokenPrecision> p(shape.block_tokens, TokenPrecision::kInt8);
    const std::vector<std::byte> dec = Decode(shape, Encode(shape, raw, p));
    const std::vector<float> x = ToFloats(shape, raw);
    const std::vector<float> y = ToFloats(shape, dec);
    ASSERT_EQ(x.size(), y.size());
    for (uint32_t kv = 0; kv < 2; ++kv) {
      double err = 0, norm = 0;
      for (uint32_t l = 0; l < shape.num_layers; ++l) {
        const size_t begin = RawIndex(shape, l, kv, 0, 0, 0);
        const size_t end = begin + size_t{shape.num_kv_heads} * shape.block_tokens * shape.head_dim;
        for (size_t i = begin; i < end; ++i) {
          err += (double(y[i]) - x[i]) * (double(y[i]) - x[i]);
          norm += double(x[i]) * x[i];
        }
      }
      const double rel = std::sqrt(err / norm);
      EXPECT_LE(rel, 0.01) << (kv == 0 ? "keys" : "values");
      EXPECT_GT(rel, 0.0) << "INT8 cannot be lossless on Gaussian data";
    }
  }
}

// A valid mixed encoding to corrupt.
struct Sample {
  BlockShape shape{2, 2, 8, 6, kProtoBf16};
  std::vector<TokenPrecision> precision = {TokenPrecision::kFull,   TokenPrecision::kInt8,
                                           TokenPrecision::kPruned, TokenPrecision::kInt8,
                                           TokenPrecision::kFull,   TokenPrecision::kFull};
  std::vector<std::byte> raw;
  std::vector<std::byte> enc;
  Sample() {
    raw = MakeRaw(shape, 51);
    enc = Encode(shape, raw, precision);
  }
};

void ExpectDataLoss(std::span<const std::byte> bytes, const std::string& reason) {
  const absl::StatusOr<CompressedBlockView> view = ParseCompressedBlock(bytes);
  ASSERT_FALSE(view.ok());
  EXPECT_EQ(view.status().code(), absl::StatusCode::kDataLoss) << view.status();
  EXPECT_THAT(std::string(view.status().message()), HasSubstr(reason));
}

TEST(ParseCompressedBlockTest, AcceptsValidEncoding) {
  Sample s;
  const absl::StatusOr<CompressedBlockView> view = ParseCompressedBlock(s.enc);
  ASSERT_TRUE(view.ok()) << view.status();
  EXPECT_EQ(view->shape.num_layers, 2u);
  EXPECT_EQ(view->shape.num_kv_heads, 2u);
  EXPECT_EQ(view->shape.head_dim, 8u);
  EXPECT_EQ(view->shape.block_tokens, 6u);
  EXPECT_EQ(view->shape.dtype, kProtoBf16);
  EXPECT_EQ(view->num_full, 3u);
  EXPECT_EQ(view->num_int8, 2u);
  EXPECT_EQ(view->num_pruned, 1u);
  EXPECT_TRUE(std::equal(view->precision.begin(), view->precision.end(), s.precision.begin(),
                         s.precision.end()));
  EXPECT_EQ(view->bytes.data(), s.enc.data());
  EXPECT_EQ(view->bytes.size(), s.enc.size());
  EXPECT_TRUE(LooksCompressed(s.enc));
}

TEST(ParseCompressedBlockTest, RejectsEveryTruncation) {
  Sample s;
  for (size_t n = 0; n < s.enc.size(); ++n) {
    SCOPED_TRACE(n);
    // A fresh allocation of exactly n bytes so ASan catches any read past the end.
    std::vector<std::byte> cut(s.enc.begin(), s.enc.begin() + n);
    ExpectDataLoss(cut, n < kCompressedHeaderBytes ? "truncated header" : "payload_bytes");
  }
}

TEST(ParseCompressedBlockTest, RejectsTrailingBytes) {
  Sample s;
  s.enc.push_back(std::byte{0});
  ExpectDataLoss(s.enc, "payload_bytes");
}

TEST(ParseCompressedBlockTest, RejectsCorruptHeaderFields) {
  const Sample s;
  struct Mutation {
    std::string name;
    size_t offset;
    uint32_t value;
    std::string reason;
  };
  const uint32_t version_word = ReadU32(s.enc, 4);
  const std::vector<Mutation> mutations = {
      {"magic", 0, 0x3251564B, "bad magic"},
      {"version", 4, (version_word & 0xFFFF0000u) | 3u, "unsupported version"},
      // A version-1 block relabelled as version 2: its counts are not entries.
      {"version 2", 4, (version_word & 0xFFFF0000u) | 2u, "entries"},
      {"header_bytes", 4, (version_word & 0xFFFFu) | (40u << 16), "header_bytes"},
      {"zero layers", 8, 0, "invalid shape"},
      {"zero heads", 12, 0, "invalid shape"},
      {"zero head_dim", 16, 0, "invalid shape"},
      {"zero tokens", 20, 0, "invalid shape"},
      {"dtype 0", 24, 0, "invalid shape"},
      {"dtype 4", 24, 4, "invalid shape"},
      {"more layers", 8, 3, "payload_bytes"},
      {"more heads", 12, 3, "payload_bytes"},
      {"huge head_dim", 16, 0x7FFFFFFF, "payload_bytes"},
      {"dtype fp32", 24, kProtoFp32, "payload_bytes"},
      {"num_full", 28, 4, "block_tokens"},
      {"num_pruned", 36, 0, "block_tokens"},
      {"payload_bytes + 4", 40, static_cast<uint32_t>(s.enc.size() + 4), "payload_bytes"},
      {"payload_bytes - 4", 40, static_cast<uint32_t>(s.enc.size() - 4), "payload_bytes"},
      {"reserved", 44, 1, "reserved"},
  };
  for (const Mutation& m : mutations) {
    SCOPED_TRACE(m.name);
    std::vector<std::byte> bad = s.enc;
    WriteU32(bad, m.offset, m.value);
    ExpectDataLoss(bad, m.reason);
    EXPECT_EQ(LooksCompressed(bad), m.offset != 0);
  }
}

TEST(ParseCompressedBlockTest, RejectsCountsThatDisagreeWithTheMap) {
  const Sample s;
  // Token 0 full -> pruned and token 2 pruned -> full in the map only: the counts still agree,
  // so this is a different but consistent block.
  std::vector<std::byte> bad = s.enc;
  bad[48 + 0] = std::byte{2};
  bad[48 + 2] = std::byte{0};
  EXPECT_TRUE(ParseCompressedBlock(bad).ok());
  // Token 0 full -> int8 in the map only: 2 full / 3 int8 vs header 3 / 2.
  bad = s.enc;
  bad[48 + 0] = std::byte{1};
  ExpectDataLoss(bad, "precision map has");
  // An unknown precision value.
  bad = s.enc;
  bad[48 + 4] = std::byte{3};
  ExpectDataLoss(bad, "unknown value 3");
}

TEST(ParseCompressedBlockTest, SurvivesRandomGarbage) {
  std::mt19937 rng(61);
  for (int trial = 0; trial < 20000; ++trial) {
    const size_t n = rng() % 600;
    std::vector<std::byte> bytes(n);
    for (auto& b : bytes) b = std::byte(rng() & 0xFF);
    if (trial % 2 == 0 && n >= 4) WriteU32(bytes, 0, kCompressedMagic);
    if (trial % 4 == 0 && n >= 8) WriteU32(bytes, 4, 1u | (48u << 16));
    const absl::StatusOr<CompressedBlockView> view = ParseCompressedBlock(bytes);
    ASSERT_FALSE(view.ok()) << "trial " << trial;
    ASSERT_EQ(view.status().code(), absl::StatusCode::kDataLoss);
  }
}

TEST(ParseCompressedBlockTest, SurvivesCorruptedValidEncodings) {
  const Sample s;
  std::mt19937 rng(71);
  int accepted = 0;
  for (int trial = 0; trial < 5000; ++trial) {
    std::vector<std::byte> bytes = s.enc;
    const int flips = 1 + static_cast<int>(rng() % 4);
    for (int f = 0; f < flips; ++f) {
      // Bias toward the header and map, where validation lives.
      const size_t at = trial % 2 == 0 ? rng() % 56 : rng() % bytes.size();
      bytes[at] ^= std::byte(1u << (rng() % 8));
    }
    const absl::StatusOr<CompressedBlockView> view = ParseCompressedBlock(bytes);
    if (!view.ok()) {
      ASSERT_EQ(view.status().code(), absl::StatusCode::kDataLoss) << view.status();
      continue;
    }
    ++accepted;
    // An accepted view must decode without touching memory it does not own.
    std::vector<std::byte> out(view->shape.raw_bytes());
    ASSERT_TRUE(DecodeBlock(*view, out).ok());
  }
  EXPECT_GT(accepted, 0);  // payload flips are undetectable by design
}

TEST(BlockCodecTest, SizeMismatchesAreInvalidArgument) {
  Sample s;
  const uint64_t size = s.enc.size();
  std::vector<std::byte> out(size);
  auto code = [](const absl::Status& st) { return st.code(); };
  const auto kInvalid = absl::StatusCode::kInvalidArgument;

  // Raw block one byte short and one long.
  EXPECT_EQ(code(EncodeBlock(s.shape, std::span(s.raw).first(s.raw.size() - 1), s.precision, out)),
            kInvalid);
  std::vector<std::byte> longer = s.raw;
  longer.push_back(std::byte{0});
  EXPECT_EQ(code(EncodeBlock(s.shape, longer, s.precision, out)), kInvalid);
  // Output one byte short and one long.
  std::vector<std::byte> small(size - 1), big(size + 1);
  EXPECT_EQ(code(EncodeBlock(s.shape, s.raw, s.precision, small)), kInvalid);
  EXPECT_EQ(code(EncodeBlock(s.shape, s.raw, s.precision, big)), kInvalid);
  // Precision of the wrong length or with an unknown value.
  std::vector<TokenPrecision> p = s.precision;
  p.pop_back();
  EXPECT_EQ(CompressedSize(s.shape, p).status().code(), kInvalid);
  EXPECT_EQ(code(EncodeBlock(s.shape, s.raw, p, out)), kInvalid);
  p = s.precision;
  p[1] = static_cast<TokenPrecision>(7);
  EXPECT_EQ(CompressedSize(s.shape, p).status().code(), kInvalid);
  EXPECT_EQ(code(EncodeBlock(s.shape, s.raw, p, out)), kInvalid);
  // Invalid shapes.
  BlockShape bad = s.shape;
  bad.dtype = 9;
  EXPECT_EQ(CompressedSize(bad, s.precision).status().code(), kInvalid);
  bad = s.shape;
  bad.num_layers = 0;
  EXPECT_EQ(code(EncodeBlock(bad, s.raw, s.precision, out)), kInvalid);
  // An encoding too large for the u32 payload_bytes field.
  const BlockShape huge{1u << 16, 64, 128, 1, kProtoFp32};  // 4 GiB of full rows
  EXPECT_EQ(
      CompressedSize(huge, std::vector<TokenPrecision>(1, TokenPrecision::kFull)).status().code(),
      kInvalid);

  // Decode: output of the wrong size, and views that disagree with their bytes.
  const absl::StatusOr<CompressedBlockView> view = ParseCompressedBlock(s.enc);
  ASSERT_TRUE(view.ok());
  std::vector<std::byte> raw_small(s.raw.size() - 1), raw_big(s.raw.size() + 1);
  EXPECT_EQ(code(DecodeBlock(*view, raw_small)), kInvalid);
  EXPECT_EQ(code(DecodeBlock(*view, raw_big)), kInvalid);
  std::vector<std::byte> raw_out(s.raw.size());
  CompressedBlockView tampered = *view;
  tampered.bytes = tampered.bytes.first(tampered.bytes.size() - 4);
  EXPECT_EQ(code(DecodeBlock(tampered, raw_out)), kInvalid);
  tampered = *view;
  tampered.num_full += 1;
  EXPECT_EQ(code(DecodeBlock(tampered, raw_out)), kInvalid);
  tampered = *view;
  tampered.shape.num_layers = 3;
  std::vector<std::byte> three_layers(tampered.shape.raw_bytes());
  EXPECT_EQ(code(DecodeBlock(tampered, three_layers)), kInvalid);
  EXPECT_TRUE(DecodeBlock(*view, raw_out).ok());
}

TEST(BlockCodecTest, LooksCompressed) {
  EXPECT_FALSE(LooksCompressed({}));
  const std::byte magic[4] = {std::byte{0x4B}, std::byte{0x56}, std::byte{0x51}, std::byte{0x31}};
  EXPECT_TRUE(LooksCompressed(magic));  // "KVQ1"
  EXPECT_FALSE(LooksCompressed(std::span(magic).first(3)));
  const std::byte other[4] = {std::byte{0x4B}, std::byte{0x56}, std::byte{0x51}, std::byte{0x32}};
  EXPECT_FALSE(LooksCompressed(other));
}

}  // namespace
}  // namespace kvcache::importance
