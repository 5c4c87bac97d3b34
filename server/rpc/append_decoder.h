// AppendDecoder: reads one AppendRequest from gRPC slices without copying
// its kv_chunk bytes.
//
// The Append RPC is registered raw, so each request arrives as a
// grpc::ByteBuffer. Decode() walks the protobuf wire format across the
// buffer's slices: the header (field 1) is parsed with protobuf, the
// kv_chunk bytes (field 2) are handed to `on_kv` as spans pointing into the
// slices, which the caller copies straight into pool memory. Unknown fields
// are skipped (proto3 rules); malformed input is INVALID_ARGUMENT.
//
// Stateless; thread-compatible.
#ifndef KVCACHE_SERVER_RPC_APPEND_DECODER_H_
#define KVCACHE_SERVER_RPC_APPEND_DECODER_H_

#include <grpcpp/support/byte_buffer.h>

#include <cstddef>
#include <span>

#include "absl/functional/function_ref.h"
#include "absl/status/status.h"
#include "kvcache/v1/kvcache.pb.h"

namespace kvcache {

struct DecodedAppend {
  bool has_header = false;
  v1::AppendHeader header;  // valid when has_header
  uint64_t kv_bytes = 0;    // bytes passed to on_kv
};

// Decodes `slices` (one message). `on_kv` receives the kv_chunk bytes in
// order; an error it returns stops decoding and is returned.
absl::Status DecodeAppendRequest(std::span<const grpc::Slice> slices,
                                 absl::FunctionRef<absl::Status(std::span<const std::byte>)> on_kv,
                                 DecodedAppend* out);

}  // namespace kvcache

#endif  // KVCACHE_SERVER_RPC_APPEND_DECODER_H_
