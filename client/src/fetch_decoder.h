// FetchChunk and DecodeFetchResponse: one FetchResponse read from gRPC slices
// without copying its data bytes.
//
// The client reads the Fetch stream raw (grpc::ByteBuffer), so the payload
// goes from gRPC's receive slices straight into the caller's buffer: no
// protobuf string in between. DecodeFetchResponse walks the protobuf wire
// format across the slices (kvcache.proto, FetchResponse): the scalar fields
// are decoded, `data` (field 15) becomes a list of spans pointing into the
// slices. Proto3 rules: absent fields are 0, the last occurrence of a scalar
// or of `data` wins, kept_tokens may be packed or not and accumulates, unknown
// fields are skipped. Malformed input (truncated tags, varints or fields, a
// known field with another wire type, an unknown wire type) is DATA_LOSS with
// a message naming what was wrong: the bytes came from the server, and the
// fetch they belong to cannot be trusted.
//
// The spans in a FetchChunk are valid while the slices (or the message) they
// were decoded from live. Stateless; thread-compatible.
#ifndef KVCACHE_CLIENT_SRC_FETCH_DECODER_H_
#define KVCACHE_CLIENT_SRC_FETCH_DECODER_H_

#include <grpcpp/support/slice.h>

#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "absl/container/inlined_vector.h"
#include "absl/status/status.h"
#include "kvcache/v1/kvcache.pb.h"

namespace kvcache::internal {

// The fields of one FetchResponse; `data` points into the decoded bytes.
struct FetchChunk {
  uint64_t matched_tokens = 0;
  uint32_t block_index = 0;
  uint64_t block_bytes = 0;
  uint64_t block_checksum = 0;
  uint64_t offset = 0;
  int32_t encoding = 0;  // a v1::BlockEncoding value
  std::vector<uint32_t> kept_tokens;
  uint64_t withheld_tokens = 0;
  absl::InlinedVector<std::span<const std::byte>, 4> data;  // in order
  uint64_t data_size = 0;                                   // sum of data's sizes
};

// Decodes `slices` (one whole FetchResponse) into `out`, which it resets first.
absl::Status DecodeFetchResponse(std::span<const grpc::Slice> slices, FetchChunk* out);

// `msg` as a FetchChunk whose data points into msg.data(); for callers that
// hold a parsed message.
FetchChunk ChunkOf(const v1::FetchResponse& msg);

}  // namespace kvcache::internal

#endif  // KVCACHE_CLIENT_SRC_FETCH_DECODER_H_
