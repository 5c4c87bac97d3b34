#include "fetch_assembler.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstring>
#include <vector>

#include "server/importance/block_codec.h"

namespace kvcache::internal {
namespace {

using ::testing::HasSubstr;

constexpr uint64_t kBlockBytes = 64;
constexpr uint32_t kBlockTokens = 16;

std::vector<std::byte> Pattern(size_t n, uint8_t seed) {
  std::vector<std::byte> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = std::byte(static_cast<uint8_t>(seed + i * 7));
  return v;
}

// The messages a correct server sends for `blocks`, `chunk` bytes at a time.
std::vector<v1::FetchResponse> Stream(const std::vector<std::vector<std::byte>>& blocks,
                                      uint64_t chunk) {
  std::vector<v1::FetchResponse> msgs;
  for (size_t b = 0; b < blocks.size(); ++b) {
    const uint64_t sum = BlockChecksum(blocks[b]);
    for (uint64_t off = 0; off < blocks[b].size(); off += chunk) {
      v1::FetchResponse m;
      m.set_matched_tokens(blocks.size() * kBlockTokens);
      m.set_block_index(static_cast<uint32_t>(b));
      m.set_block_bytes(blocks[b].size());
      m.set_block_checksum(sum);
      m.set_offset(off);
      const uint64_t n = std::min<uint64_t>(chunk, blocks[b].size() - off);
      m.set_data(reinterpret_cast<const char*>(blocks[b].data() + off), n);
      msgs.push_back(std::move(m));
    }
  }
  return msgs;
}

absl::Status Feed(FetchAssembler& a, const std::vector<v1::FetchResponse>& msgs) {
  for (const auto& m : msgs) {
    if (absl::Status s = a.Add(m); !s.ok()) return s;
  }
  return a.Finish();
}

class FetchAssemblerTest : public ::testing::Test {
 protected:
  std::vector<std::vector<std::byte>> blocks_ = {Pattern(kBlockBytes, 1), Pattern(kBlockBytes, 2),
                                                 Pattern(kBlockBytes, 3)};
  std::vector<std::byte> out_ = std::vector<std::byte>(3 * kBlockBytes);
};

TEST_F(FetchAssemblerTest, ReassemblesChunkedBlocks) {
  for (uint64_t chunk : {uint64_t{1}, uint64_t{10}, kBlockBytes}) {
    std::fill(out_.begin(), out_.end(), std::byte{0});
    FetchAssembler a(out_, kBlockBytes, kBlockTokens);
    ASSERT_TRUE(Feed(a, Stream(blocks_, chunk)).ok()) << chunk;
    EXPECT_EQ(a.result().matched_tokens, 3 * kBlockTokens);
    EXPECT_EQ(a.result().blocks, 3u);
    EXPECT_EQ(a.result().bytes, 3 * kBlockBytes);
    for (size_t b = 0; b < 3; ++b) {
      EXPECT_EQ(std::memcmp(out_.data() + b * kBlockBytes, blocks_[b].data(), kBlockBytes), 0);
    }
  }
}

TEST_F(FetchAssemblerTest, EmptyPrefix) {
  FetchAssembler a(std::span<std::byte>(), kBlockBytes, kBlockTokens);
  EXPECT_TRUE(a.Finish().ok());
  EXPECT_EQ(a.result().matched_tokens, 0u);
  EXPECT_EQ(a.result().blocks, 0u);
}

TEST_F(FetchAssemblerTest, CorruptByteIsDataLoss) {
  auto msgs = Stream(blocks_, 16);
  msgs[5].mutable_data()->at(3) ^= 1;
  FetchAssembler a(out_, kBlockBytes, kBlockTokens);
  absl::Status s = Feed(a, msgs);
  EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(s.message(), HasSubstr("block 1 checksum mismatch"));
}

TEST_F(FetchAssemblerTest, GapIsDataLoss) {
  auto msgs = Stream(blocks_, 16);
  msgs.erase(msgs.begin() + 1);
  FetchAssembler a(out_, kBlockBytes, kBlockTokens);
  EXPECT_EQ(Feed(a, msgs).code(), absl::StatusCode::kDataLoss);
}

TEST_F(FetchAssemblerTest, OutOfOrderBlocksAreDataLoss) {
  auto msgs = Stream(blocks_, kBlockBytes);
  std::swap(msgs[1], msgs[2]);
  FetchAssembler a(out_, kBlockBytes, kBlockTokens);
  absl::Status s = Feed(a, msgs);
  EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(s.message(), HasSubstr("expected block 1, got block 2"));
}

TEST_F(FetchAssemblerTest, TruncatedStreamIsDataLoss) {
  auto msgs = Stream(blocks_, 16);
  msgs.pop_back();
  FetchAssembler a(out_, kBlockBytes, kBlockTokens);
  EXPECT_THAT(Feed(a, msgs).message(), HasSubstr("ended inside block 2"));

  msgs = Stream(blocks_, kBlockBytes);
  msgs.pop_back();  // ends on a block boundary, one block short
  FetchAssembler b(out_, kBlockBytes, kBlockTokens);
  absl::Status s = Feed(b, msgs);
  EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(s.message(), HasSubstr("after 2 of 3 blocks"));
}

TEST_F(FetchAssemblerTest, ChecksumChangingWithinBlockIsDataLoss) {
  auto msgs = Stream(blocks_, 16);
  msgs[1].set_block_checksum(msgs[1].block_checksum() + 1);
  FetchAssembler a(out_, kBlockBytes, kBlockTokens);
  EXPECT_EQ(Feed(a, msgs).code(), absl::StatusCode::kDataLoss);
}

TEST_F(FetchAssemblerTest, ChunkOverrunningBlockIsDataLoss) {
  auto msgs = Stream(blocks_, 16);
  msgs[3].mutable_data()->append("x");
  FetchAssembler a(out_, kBlockBytes, kBlockTokens);
  EXPECT_THAT(Feed(a, msgs).message(), HasSubstr("overruns block 0"));
}

TEST_F(FetchAssemblerTest, ExtraBlockIsDataLoss) {
  auto msgs = Stream(blocks_, kBlockBytes);
  for (auto& m : msgs) m.set_matched_tokens(2 * kBlockTokens);
  std::vector<std::byte> out(2 * kBlockBytes);
  FetchAssembler a(out, kBlockBytes, kBlockTokens);
  EXPECT_EQ(Feed(a, msgs).code(), absl::StatusCode::kDataLoss);
}

TEST_F(FetchAssemblerTest, DequantizedBlocksAndKeptTokensAreReported) {
  std::vector<v1::FetchResponse> msgs = Stream(blocks_, 32);
  for (v1::FetchResponse& m : msgs) {
    if (m.block_index() == 1) m.set_encoding(v1::BLOCK_ENCODING_DEQUANTIZED);
  }
  for (uint32_t t : {0u, 3u, 15u}) msgs[2].add_kept_tokens(t);  // block 1's first chunk
  FetchAssembler a(out_, kBlockBytes, kBlockTokens);
  ASSERT_TRUE(Feed(a, msgs).ok());
  const FetchResult r = a.result();
  EXPECT_EQ(r.dequantized_blocks, 1u);
  ASSERT_EQ(r.kept_tokens.size(), 3u);
  EXPECT_TRUE(r.kept_tokens[0].empty());
  EXPECT_THAT(r.kept_tokens[1], ::testing::ElementsAre(0u, 3u, 15u));
  EXPECT_TRUE(r.kept_tokens[2].empty());
}

TEST_F(FetchAssemblerTest, UnaskedOrInconsistentEncodingsAreDataLoss) {
  auto fails = [&](std::vector<v1::FetchResponse> msgs, const char* why) {
    FetchAssembler a(out_, kBlockBytes, kBlockTokens);
    absl::Status s = Feed(a, msgs);
    EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss) << why << ": " << s;
  };
  std::vector<v1::FetchResponse> compressed = Stream(blocks_, 32);
  compressed[0].set_encoding(v1::BLOCK_ENCODING_COMPRESSED);
  compressed[1].set_encoding(v1::BLOCK_ENCODING_COMPRESSED);
  fails(compressed, "the compressed format was not asked for");
  std::vector<v1::FetchResponse> changing = Stream(blocks_, 32);
  changing[1].set_encoding(v1::BLOCK_ENCODING_DEQUANTIZED);  // second chunk of block 0
  fails(changing, "encoding changes within a block");
  std::vector<v1::FetchResponse> late_kept = Stream(blocks_, 32);
  late_kept[1].add_kept_tokens(2);
  fails(late_kept, "kept tokens on a later chunk");
  std::vector<v1::FetchResponse> unordered = Stream(blocks_, 32);
  unordered[0].add_kept_tokens(5);
  unordered[0].add_kept_tokens(5);
  fails(unordered, "kept tokens not increasing");
  std::vector<v1::FetchResponse> out_of_range = Stream(blocks_, 32);
  out_of_range[0].add_kept_tokens(kBlockTokens);
  fails(out_of_range, "kept token past the block");
}

TEST_F(FetchAssemblerTest, SmallOutIsInvalidArgumentBeforeAnyWrite) {
  std::vector<std::byte> out(2 * kBlockBytes, std::byte{0x55});
  FetchAssembler a(out, kBlockBytes, kBlockTokens);
  absl::Status s = a.Add(Stream(blocks_, 16)[0]);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("out holds 128 bytes"));
  EXPECT_EQ(out[0], std::byte{0x55});
  EXPECT_EQ(a.Finish().code(), absl::StatusCode::kInvalidArgument);  // stays failed
}

TEST_F(FetchAssemblerTest, OtherBlockBytesIsLayoutMismatch) {
  FetchAssembler a(out_, kBlockBytes / 2, kBlockTokens);
  EXPECT_EQ(a.Add(Stream(blocks_, 16)[0]).code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_TRUE(a.layout_mismatch());
}

TEST_F(FetchAssemblerTest, MatchedTokensNotWholeBlocksIsDataLoss) {
  auto msgs = Stream(blocks_, kBlockBytes);
  msgs[0].set_matched_tokens(kBlockTokens + 1);
  FetchAssembler a(out_, kBlockBytes, kBlockTokens);
  EXPECT_EQ(a.Add(msgs[0]).code(), absl::StatusCode::kDataLoss);
}

TEST(MaxFetchedBlockBytesTest, BoundsEveryCompressedBlockOfTheLayout) {
  struct Shape {
    uint32_t layers, heads, dim, tokens;
    v1::DType dtype;
  };
  for (const Shape& sh : {Shape{1, 1, 16, 16, v1::DTYPE_FP16}, Shape{2, 2, 1, 16, v1::DTYPE_FP16},
                          Shape{3, 1, 3, 16, v1::DTYPE_BF16}, Shape{1, 4, 64, 32, v1::DTYPE_FP32},
                          Shape{2, 1, 5, 64, v1::DTYPE_FP16}}) {
    v1::ModelLayout layout;
    layout.set_num_layers(sh.layers);
    layout.set_num_kv_heads(sh.heads);
    layout.set_head_dim(sh.dim);
    layout.set_block_tokens(sh.tokens);
    layout.set_dtype(sh.dtype);
    const importance::BlockShape shape{sh.layers, sh.heads, sh.dim, sh.tokens,
                                       static_cast<uint32_t>(sh.dtype)};
    const uint64_t raw = shape.raw_bytes();
    const uint64_t bound = MaxFetchedBlockBytes(layout, raw, v1::BLOCK_ENCODING_COMPRESSED);
    EXPECT_EQ(MaxFetchedBlockBytes(layout, raw, v1::BLOCK_ENCODING_RAW), raw);
    EXPECT_EQ(MaxFetchedBlockBytes(layout, raw, v1::BLOCK_ENCODING_DEQUANTIZED), raw);
    EXPECT_EQ(MaxFetchedBlockBytes(layout, raw, static_cast<v1::BlockEncoding>(9)), 0u);
    uint64_t largest = 0;
    // Every split of the tokens into full, INT8 and pruned ones.
    for (uint32_t full = 0; full <= sh.tokens; ++full) {
      for (uint32_t int8 = 0; full + int8 <= sh.tokens; ++int8) {
        std::vector<importance::TokenPrecision> precision(sh.tokens,
                                                          importance::TokenPrecision::kPruned);
        for (uint32_t t = 0; t < full + int8; ++t) {
          precision[t] =
              t < full ? importance::TokenPrecision::kFull : importance::TokenPrecision::kInt8;
        }
        auto size = importance::CompressedSize(shape, precision);
        ASSERT_TRUE(size.ok()) << size.status();
        largest = std::max(largest, *size);
      }
    }
    // Version 2: every split of each (layer, head)'s tokens into full, INT8,
    // INT4 and pruned entries (the same split for every (layer, head)).
    for (uint32_t full = 0; full <= sh.tokens; ++full) {
      for (uint32_t int8 = 0; full + int8 <= sh.tokens; ++int8) {
        for (uint32_t int4 = 0; full + int8 + int4 <= sh.tokens; int4 += 1 + int4 / 8) {
          std::vector<importance::TokenPrecision> precision(shape.entries(),
                                                            importance::TokenPrecision::kPruned);
          for (size_t i = 0; i < precision.size(); ++i) {
            const uint32_t t = static_cast<uint32_t>(i % sh.tokens);
            precision[i] = t < full                 ? importance::TokenPrecision::kFull
                           : t < full + int8        ? importance::TokenPrecision::kInt8
                           : t < full + int8 + int4 ? importance::TokenPrecision::kInt4
                                                    : importance::TokenPrecision::kPruned;
          }
          auto size = importance::CompressedSizeV2(shape, precision);
          ASSERT_TRUE(size.ok()) << size.status();
          largest = std::max(largest, *size);
        }
      }
    }
    EXPECT_LE(largest, bound) << sh.layers << "x" << sh.heads << "x" << sh.dim;
    // Tight enough to be a real bound: at most twice what the worst case takes.
    EXPECT_LE(bound, 2 * largest);
  }
}

TEST(BlockChecksumTest, IsXxh3) {
  // XXH3_64bits of the empty input, from the xxHash reference.
  EXPECT_EQ(BlockChecksum({}), 0x2D06800538D394C2ull);
}

}  // namespace
}  // namespace kvcache::internal
