// Fuzz target: the compressed block format (server/importance/block_codec.h),
// versions 1 and 2. ParseCompressedBlock is what a fetch, a verification and
// a restore run over stored bytes that may be damaged.
//
// Input: byte 0 holds flags, the rest is the encoding. With flag 1 the
// header's payload_bytes is set to the encoding's size first (otherwise
// almost every input stops at that check). Properties: never reads outside
// the bytes (ASan); a block that parses decodes (DecodeBlock must accept
// every view ParseCompressedBlock returns), its counts add up, and
// re-encoding the decoded block with the same precisions gives a block of the
// same size that parses and decodes again.
#include <cstring>
#include <vector>

#include "server/importance/block_codec.h"
#include "tests/fuzz/fuzz_check.h"

namespace {

using kvcache::importance::BlockShape;
using kvcache::importance::CompressedBlockView;
using kvcache::importance::TokenPrecision;

// Raw blocks above this are not decoded (a pruned block's encoding is small
// while its raw size may be large); the parse itself still runs.
constexpr uint64_t kMaxRawBytes = uint64_t{4} << 20;

std::span<const std::byte> AsBytes(const std::vector<uint8_t>& v) {
  return {reinterpret_cast<const std::byte*>(v.data()), v.size()};
}

void ReEncode(const CompressedBlockView& view, const std::vector<std::byte>& raw) {
  const BlockShape& shape = view.shape;
  std::vector<TokenPrecision> precision;
  if (view.version == kvcache::importance::kCompressedVersion1) {
    precision.assign(view.precision.begin(), view.precision.end());
  } else {
    for (uint32_t l = 0; l < shape.num_layers; ++l) {
      for (uint32_t h = 0; h < shape.num_kv_heads; ++h) {
        for (uint32_t t = 0; t < shape.block_tokens; ++t) {
          precision.push_back(view.EntryPrecision(l, h, t));
        }
      }
    }
  }
  const bool v1 = view.version == kvcache::importance::kCompressedVersion1;
  // Full entries may hold Inf or NaN, and a damaged block's scales may make
  // lossy ones non-finite; the encoder's contract is that such entries are
  // kept full, which changes the size.
  const uint32_t changed =
      v1 ? kvcache::importance::KeepNonFiniteTokensFull(shape, raw, precision)
         : kvcache::importance::KeepNonFiniteEntriesFull(shape, raw, precision);
  absl::StatusOr<uint64_t> size = v1 ? kvcache::importance::CompressedSize(shape, precision)
                                     : kvcache::importance::CompressedSizeV2(shape, precision);
  FUZZ_CHECK(size.ok());
  if (changed == 0) FUZZ_CHECK(*size == view.bytes.size());
  std::vector<std::byte> again(*size);
  const absl::Status encoded =
      v1 ? kvcache::importance::EncodeBlock(shape, raw, precision, again)
         : kvcache::importance::EncodeBlockV2(shape, raw, precision, again);
  FUZZ_CHECK(encoded.ok());
  absl::StatusOr<CompressedBlockView> reparsed = kvcache::importance::ParseCompressedBlock(again);
  FUZZ_CHECK(reparsed.ok());
  std::vector<std::byte> raw2(raw.size());
  FUZZ_CHECK(kvcache::importance::DecodeBlock(*reparsed, raw2).ok());
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  kvcache::fuzz::InputReader in(data, size);
  const uint8_t flags = in.Byte();
  std::vector<uint8_t> bytes(in.rest(), in.rest() + in.rest_size());
  if ((flags & 1) != 0 && bytes.size() >= kvcache::importance::kCompressedHeaderBytes) {
    const uint32_t n = static_cast<uint32_t>(bytes.size());
    std::memcpy(bytes.data() + 40, &n, 4);
  }
  absl::StatusOr<CompressedBlockView> view =
      kvcache::importance::ParseCompressedBlock(AsBytes(bytes));
  if (!view.ok()) {
    FUZZ_CHECK(view.status().code() == absl::StatusCode::kDataLoss);
    return 0;
  }
  FUZZ_CHECK(kvcache::importance::LooksCompressed(AsBytes(bytes)));
  FUZZ_CHECK(view->bytes.size() == bytes.size());
  const BlockShape& shape = view->shape;
  const uint64_t units = view->version == kvcache::importance::kCompressedVersion1
                             ? shape.block_tokens
                             : shape.entries();
  FUZZ_CHECK(uint64_t{view->num_full} + view->num_int8 + view->num_pruned + view->num_int4 ==
             units);
  const uint64_t raw_bytes = shape.raw_bytes();
  FUZZ_CHECK(raw_bytes > 0);
  if (raw_bytes > kMaxRawBytes) return 0;
  uint32_t kept = 0;
  for (uint32_t t = 0; t < shape.block_tokens; ++t) kept += view->TokenKept(t) ? 1 : 0;
  if (view->num_pruned == 0) FUZZ_CHECK(kept == shape.block_tokens);
  std::vector<std::byte> raw(raw_bytes);
  FUZZ_CHECK(kvcache::importance::DecodeBlock(*view, raw).ok());
  // A wrong-sized output is refused, never written.
  std::vector<std::byte> small(raw_bytes - 1);
  FUZZ_CHECK(!kvcache::importance::DecodeBlock(*view, small).ok());
  ReEncode(*view, raw);
  return 0;
}
