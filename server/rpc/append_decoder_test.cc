#include "server/rpc/append_decoder.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <random>
#include <string>
#include <vector>

#include "kvcache/slice_cursor_test_util.h"

namespace kvcache {
namespace {

using ::testing::HasSubstr;

using wire::RandomSlices;

absl::Status Decode(const std::vector<grpc::Slice>& slices, std::string* kv, DecodedAppend* out) {
  return DecodeAppendRequest(
      slices,
      [kv](std::span<const std::byte> piece) {
        kv->append(reinterpret_cast<const char*>(piece.data()), piece.size());
        return absl::OkStatus();
      },
      out);
}

TEST(AppendDecoderTest, DecodesHeadersAndChunksSplitAnywhere) {
  std::mt19937 rng(1);
  for (int i = 0; i < 500; ++i) {
    v1::AppendRequest request;
    std::string kv;
    if (i % 2 == 0) {
      v1::AppendHeader* h = request.mutable_header();
      h->set_model_id("model-" + std::to_string(i));
      for (int t = 0; t < i; ++t) h->add_tokens(rng());
      h->set_start_token(16 * (i % 5));
      h->add_block_checksums(rng());
      h->mutable_hints()->set_priority(i);
    } else {
      kv.resize(rng() % 3000);
      for (char& c : kv) c = static_cast<char>(rng());
      request.set_kv_chunk(kv);
    }
    const std::string wire = request.SerializeAsString();
    std::string got_kv;
    DecodedAppend out;
    ASSERT_TRUE(Decode(RandomSlices(wire, rng), &got_kv, &out).ok()) << i;
    EXPECT_EQ(out.has_header, request.has_header());
    if (request.has_header()) {
      EXPECT_EQ(out.header.SerializeAsString(), request.header().SerializeAsString());
    }
    EXPECT_EQ(got_kv, kv);
    EXPECT_EQ(out.kv_bytes, kv.size());
  }
}

TEST(AppendDecoderTest, SkipsUnknownFields) {
  v1::AppendRequest request;
  request.set_kv_chunk("abc");
  std::string wire = request.SerializeAsString();
  // field 9 varint 300, field 10 fixed64, field 11 bytes "zz", field 12 fixed32
  const std::string unknown = std::string("\x48\xac\x02", 3) + "\x51" + std::string(8, '\1') +
                              "\x5a\x02zz" + "\x65" + std::string(4, '\2');
  wire = unknown + wire;
  std::string kv;
  DecodedAppend out;
  std::mt19937 rng(2);
  ASSERT_TRUE(Decode(RandomSlices(wire, rng), &kv, &out).ok());
  EXPECT_EQ(kv, "abc");
}

TEST(AppendDecoderTest, TruncatedMessagesAreErrorsNotCrashes) {
  v1::AppendRequest request;
  request.set_kv_chunk(std::string(100, 'x'));
  const std::string wire = request.SerializeAsString();
  for (size_t cut = 1; cut < wire.size(); ++cut) {
    std::string kv;
    DecodedAppend out;
    std::vector<grpc::Slice> slices = {grpc::Slice(wire.data(), cut)};
    absl::Status s = Decode(slices, &kv, &out);
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << "cut at " << cut;
    EXPECT_THAT(std::string(s.message()), HasSubstr("malformed AppendRequest"));
  }
}

TEST(AppendDecoderTest, GarbageNeverCrashes) {
  std::mt19937 rng(3);
  int errors = 0;
  for (int i = 0; i < 2000; ++i) {
    std::string wire(rng() % 64, '\0');
    for (char& c : wire) c = static_cast<char>(rng());
    std::string kv;
    DecodedAppend out;
    if (!Decode(RandomSlices(wire, rng), &kv, &out).ok()) ++errors;
    EXPECT_LE(kv.size(), wire.size());
  }
  EXPECT_GT(errors, 1000);  // almost all random bytes are malformed
}

TEST(AppendDecoderTest, CallbackErrorsStopDecoding) {
  v1::AppendRequest request;
  request.set_kv_chunk(std::string(1000, 'k'));
  const std::string wire = request.SerializeAsString();
  std::mt19937 rng(4);
  int calls = 0;
  DecodedAppend out;
  absl::Status s = DecodeAppendRequest(
      RandomSlices(wire, rng),
      [&](std::span<const std::byte>) {
        ++calls;
        return absl::ResourceExhaustedError("full");
      },
      &out);
  EXPECT_EQ(s.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(calls, 1);
}

}  // namespace
}  // namespace kvcache
