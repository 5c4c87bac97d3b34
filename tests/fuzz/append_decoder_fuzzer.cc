// Fuzz target: the Append stream's wire decoder (server/rpc/append_decoder.h),
// which reads every AppendRequest a worker sends straight from gRPC's slices.
//
// Input: byte 0 picks how many slices (1..8) the message is cut into, the
// next bytes where; the rest is the message. Properties: never reads outside
// the slices (ASan), the kv_chunk pieces add up to kv_bytes, and the outcome
// (status, header, kv bytes) does not depend on how the message was sliced.
#include <grpcpp/support/slice.h>

#include <algorithm>
#include <string>
#include <vector>

#include "server/rpc/append_decoder.h"
#include "tests/fuzz/fuzz_check.h"

namespace {

struct Outcome {
  absl::Status status;
  bool has_header = false;
  std::string header;
  std::string kv;
  uint64_t kv_bytes = 0;
};

Outcome Decode(const std::vector<grpc::Slice>& slices, size_t fail_after) {
  Outcome o;
  kvcache::DecodedAppend out;
  o.status = kvcache::DecodeAppendRequest(
      slices,
      [&](std::span<const std::byte> piece) {
        o.kv.append(reinterpret_cast<const char*>(piece.data()), piece.size());
        if (o.kv.size() > fail_after) return absl::ResourceExhaustedError("staging full");
        return absl::OkStatus();
      },
      &out);
  o.has_header = out.has_header;
  if (out.has_header) o.header = out.header.SerializeAsString();
  o.kv_bytes = out.kv_bytes;
  return o;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  kvcache::fuzz::InputReader in(data, size);
  const size_t num_slices = 1 + in.Byte() % 8;
  std::vector<size_t> cuts;
  for (size_t i = 1; i < num_slices; ++i) cuts.push_back(in.Byte());
  // The consumer refuses bytes past a limit on some inputs, as a full staging area does.
  const uint8_t limit = in.Byte();
  const size_t fail_after = limit < 32 ? limit * 16 : SIZE_MAX;
  const uint8_t* msg = in.rest();
  const size_t msg_size = in.rest_size();
  for (size_t& c : cuts) c = c * msg_size / 255;
  std::sort(cuts.begin(), cuts.end());
  cuts.push_back(msg_size);

  // Each slice is its own allocation (empty slices included), so ASan sees
  // any read past a slice's end.
  std::vector<grpc::Slice> sliced;
  size_t begin = 0;
  for (size_t end : cuts) {
    sliced.emplace_back(msg + begin, end - begin);
    begin = end;
  }
  const std::vector<grpc::Slice> whole{grpc::Slice(msg, msg_size)};

  const Outcome a = Decode(sliced, fail_after);
  const Outcome b = Decode(whole, fail_after);
  FUZZ_CHECK(a.kv_bytes == a.kv.size());
  FUZZ_CHECK(b.kv_bytes == b.kv.size());
  FUZZ_CHECK(a.status.code() == b.status.code());
  FUZZ_CHECK(a.has_header == b.has_header);
  FUZZ_CHECK(a.header == b.header);
  if (a.status.ok()) FUZZ_CHECK(a.kv == b.kv);
  return 0;
}
