#include "fetch_decoder.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <random>
#include <string>
#include <vector>

#include "kvcache/slice_cursor_test_util.h"

namespace kvcache::internal {
namespace {

using ::testing::ElementsAreArray;
using ::testing::HasSubstr;

using wire::RandomSlices;

std::vector<grpc::Slice> OneSlice(const std::string& wire) {
  std::vector<grpc::Slice> slices;
  slices.emplace_back(wire.data(), wire.size());
  return slices;
}

std::string DataOf(const FetchChunk& c) {
  std::string s;
  for (std::span<const std::byte> piece : c.data) {
    s.append(reinterpret_cast<const char*>(piece.data()), piece.size());
  }
  return s;
}

void ExpectSame(const FetchChunk& c, const v1::FetchResponse& m) {
  EXPECT_EQ(c.matched_tokens, m.matched_tokens());
  EXPECT_EQ(c.block_index, m.block_index());
  EXPECT_EQ(c.block_bytes, m.block_bytes());
  EXPECT_EQ(c.block_checksum, m.block_checksum());
  EXPECT_EQ(c.offset, m.offset());
  EXPECT_EQ(c.encoding, m.encoding());
  EXPECT_THAT(c.kept_tokens, ElementsAreArray(m.kept_tokens()));
  EXPECT_EQ(c.withheld_tokens, m.withheld_tokens());
  EXPECT_EQ(c.data_size, m.data().size());
  EXPECT_EQ(DataOf(c), m.data());
}

v1::FetchResponse RandomResponse(std::mt19937_64& rng, int i) {
  v1::FetchResponse m;
  // Values of every varint length, zeros (absent fields) included.
  auto value = [&] { return rng() % 4 == 0 ? 0 : rng() >> (rng() % 64); };
  m.set_matched_tokens(value());
  m.set_block_index(static_cast<uint32_t>(value()));
  m.set_block_bytes(value());
  m.set_block_checksum(value());
  m.set_offset(value());
  m.set_encoding(static_cast<v1::BlockEncoding>(i % 4));
  if (i % 3 == 0) {
    for (int t = 0; t < i % 50; ++t) m.add_kept_tokens(static_cast<uint32_t>(value()));
  }
  m.set_withheld_tokens(value());
  std::string data(rng() % 5000, '\0');
  for (char& c : data) c = static_cast<char>(rng());
  m.set_data(std::move(data));
  return m;
}

TEST(FetchDecoderTest, DecodesWhatProtobufWritesSplitAnywhere) {
  std::mt19937 split(1);
  std::mt19937_64 rng(2);
  for (int i = 0; i < 500; ++i) {
    const v1::FetchResponse m = RandomResponse(rng, i);
    const std::string wire = m.SerializeAsString();
    // The chunk points into the slices: keep them.
    const std::vector<grpc::Slice> slices = RandomSlices(wire, split);
    FetchChunk c;
    ASSERT_TRUE(DecodeFetchResponse(slices, &c).ok()) << i;
    ExpectSame(c, m);
  }
}

TEST(FetchDecoderTest, DataPointsIntoTheSlices) {
  v1::FetchResponse m;
  m.set_matched_tokens(16);
  m.set_data(std::string(1000, 'x'));
  const std::string wire = m.SerializeAsString();
  const std::vector<grpc::Slice> slices = OneSlice(wire);
  FetchChunk c;
  ASSERT_TRUE(DecodeFetchResponse(slices, &c).ok());
  ASSERT_EQ(c.data.size(), 1u);
  const auto* begin = reinterpret_cast<const std::byte*>(slices[0].begin());
  EXPECT_GE(c.data[0].data(), begin);
  EXPECT_EQ(c.data[0].data() + c.data[0].size(), begin + slices[0].size());
}

TEST(FetchDecoderTest, EmptyMessageIsAllZero) {
  FetchChunk c;
  c.matched_tokens = 7;  // reset by the decoder
  ASSERT_TRUE(DecodeFetchResponse({}, &c).ok());
  ExpectSame(c, v1::FetchResponse());
  EXPECT_TRUE(c.data.empty());
}

TEST(FetchDecoderTest, UnpackedKeptTokensAndUnknownFields) {
  std::string wire;
  wire += "\x38\x03";                    // kept_tokens = 3 (unpacked)
  wire += "\x48\x96\x01";                // field 9, varint: unknown
  wire += "\x51" + std::string(8, 'a');  // field 10, fixed64: unknown
  wire += "\x5d" + std::string(4, 'b');  // field 11, fixed32: unknown
  wire += "\x62\x02zz";                  // field 12, length-delimited: unknown
  wire += "\x3a\x02\x05\x07";            // kept_tokens = [5, 7] (packed)
  wire += "\x80\x01\x01";                // field 16, varint: unknown
  wire += "\x38\x09";                    // kept_tokens = 9
  v1::FetchResponse m;
  ASSERT_TRUE(m.ParseFromString(wire));
  FetchChunk c;
  ASSERT_TRUE(DecodeFetchResponse(OneSlice(wire), &c).ok());
  EXPECT_THAT(c.kept_tokens, ElementsAreArray({3u, 5u, 7u, 9u}));
  ExpectSame(c, m);
}

TEST(FetchDecoderTest, LastOccurrenceWins) {
  std::string wire;
  wire += "\x08\x05";  // matched_tokens = 5
  wire +=
      "\x7a\x03"
      "abc";             // data = "abc"
  wire += "\x08\x06";    // matched_tokens = 6
  wire += "\x7a\x02xy";  // data = "xy"
  v1::FetchResponse m;
  ASSERT_TRUE(m.ParseFromString(wire));
  const std::vector<grpc::Slice> slices = OneSlice(wire);
  FetchChunk c;
  ASSERT_TRUE(DecodeFetchResponse(slices, &c).ok());
  EXPECT_EQ(c.matched_tokens, 6u);
  EXPECT_EQ(DataOf(c), "xy");
  ExpectSame(c, m);
}

TEST(FetchDecoderTest, MalformedInputIsDataLoss) {
  const struct {
    std::string wire;
    std::string error;
  } cases[] = {
      {"\x08", "truncated varint in field 1"},
      {"\x80", "truncated tag"},
      {std::string("\x08\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\x01", 12),
       "truncated varint in field 1"},
      {"\x7a\x05"
       "abc",
       "field 15 declares 5 bytes and runs past the message"},
      {"\x7a", "truncated length of field 15"},
      {"\x7d"
       "abcd",
       "field 15 has wire type 5, expected 2"},
      {"\x09"
       "abcdefgh",
       "field 1 has wire type 1, expected 0"},
      {"\x3d"
       "abcd",
       "field 7 has wire type 5, expected 0"},
      {"\x4b", "wire type 3 of field 9"},
      {"\x4e", "wire type 6 of field 9"},
      {"\x51"
       "abc",
       "truncated fixed-size field 10"},
      {std::string("\x00\x01", 2), "field number 0"},
      {"\x3a\x01\x80", "truncated varint in packed kept_tokens"},
      {"\x62\x09"
       "abc",
       "field 12 declares 9 bytes"},
  };
  std::mt19937 split(3);
  for (const auto& tc : cases) {
    for (int i = 0; i < 5; ++i) {
      FetchChunk c;
      absl::Status s = DecodeFetchResponse(RandomSlices(tc.wire, split), &c);
      EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss) << tc.error;
      EXPECT_THAT(std::string(s.message()), HasSubstr(tc.error));
      EXPECT_THAT(std::string(s.message()), HasSubstr("malformed FetchResponse"));
    }
  }
}

TEST(FetchDecoderTest, ChunkOfAgreesWithTheDecoder) {
  std::mt19937_64 rng(4);
  for (int i = 0; i < 50; ++i) {
    const v1::FetchResponse m = RandomResponse(rng, i);
    ExpectSame(ChunkOf(m), m);
  }
}

}  // namespace
}  // namespace kvcache::internal
