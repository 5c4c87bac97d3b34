#include "append_encoder.h"

#include <gtest/gtest.h>

#include <memory>
#include <string>
#include <vector>

#include "kvcache/v1/kvcache.pb.h"

namespace kvcache::internal {
namespace {

std::string Flatten(const grpc::ByteBuffer& buffer) {
  std::vector<grpc::Slice> slices;
  EXPECT_TRUE(buffer.Dump(&slices).ok());
  std::string s;
  for (const grpc::Slice& slice : slices) {
    s.append(reinterpret_cast<const char*>(slice.begin()), slice.size());
  }
  return s;
}

TEST(AppendEncoderTest, KvChunkIsWhatProtobufWrites) {
  AppendEncoder encoder;
  for (size_t size : {size_t{0}, size_t{1}, size_t{127}, size_t{128}, size_t{300}, size_t{16383},
                      size_t{16384}, size_t{1} << 20, (size_t{2} << 20) + 7}) {
    std::vector<std::byte> kv(size);
    for (size_t i = 0; i < size; ++i) kv[i] = std::byte(static_cast<uint8_t>(i * 13 + 1));
    v1::AppendRequest request;
    request.set_kv_chunk(reinterpret_cast<const char*>(kv.data()), kv.size());
    EXPECT_EQ(Flatten(encoder.KvChunk(kv)), request.SerializeAsString()) << size;
  }
  EXPECT_TRUE(encoder.WaitUntilReleased(absl::ZeroDuration()));
}

TEST(AppendEncoderTest, BorrowsTheCallersBytes) {
  std::vector<std::byte> kv(4096, std::byte{7});
  AppendEncoder encoder;
  grpc::ByteBuffer buffer = encoder.KvChunk(kv);
  std::vector<grpc::Slice> slices;
  ASSERT_TRUE(buffer.Dump(&slices).ok());
  ASSERT_EQ(slices.size(), 2u);
  EXPECT_EQ(slices[0].size(), 3u);  // tag + two-byte varint
  EXPECT_EQ(reinterpret_cast<const std::byte*>(slices[1].begin()), kv.data());
  EXPECT_EQ(slices[1].size(), kv.size());
}

TEST(AppendEncoderTest, PrefixOfTheLargestSize) {
  uint8_t prefix[kMaxKvChunkPrefixBytes];
  ASSERT_EQ(KvChunkPrefix(~uint64_t{0}, prefix), kMaxKvChunkPrefixBytes);
  EXPECT_EQ(prefix[0], 0x12);
  for (size_t i = 1; i + 1 < kMaxKvChunkPrefixBytes; ++i) EXPECT_EQ(prefix[i], 0xff) << i;
  EXPECT_EQ(prefix[kMaxKvChunkPrefixBytes - 1], 0x01);
  EXPECT_EQ(KvChunkPrefix(0, prefix), 2u);
  EXPECT_EQ(prefix[1], 0x00);
}

TEST(AppendEncoderTest, CountsTheSlicesGrpcStillHolds) {
  std::vector<std::byte> kv(100);
  AppendEncoder encoder;
  auto held = std::make_unique<grpc::ByteBuffer>(encoder.KvChunk(kv));
  encoder.KvChunk(kv);  // released at once
  EXPECT_EQ(encoder.borrowed(), 1);
  std::vector<grpc::Slice> slices;
  ASSERT_TRUE(held->Dump(&slices).ok());  // more references to the same slice
  held.reset();
  EXPECT_EQ(encoder.borrowed(), 1);
  slices.clear();
  EXPECT_EQ(encoder.borrowed(), 0);
  EXPECT_TRUE(encoder.WaitUntilReleased(absl::ZeroDuration()));
}

}  // namespace
}  // namespace kvcache::internal
