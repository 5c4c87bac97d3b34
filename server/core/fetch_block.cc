#include "server/core/fetch_block.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "server/common/status_macros.h"
#include "server/importance/block_codec.h"

namespace kvcache {
namespace {

std::vector<uint32_t> KeptTokens(const importance::CompressedBlockView& view) {
  std::vector<uint32_t> kept;
  if (view.num_pruned == 0) return kept;
  for (uint32_t t = 0; t < view.shape.block_tokens; ++t) {
    if (view.TokenKept(t)) kept.push_back(t);
  }
  return kept;
}

// The parsed block, once its stored bytes match their checksum. Decoding
// makes new bytes with a new checksum, so the stored ones are verified first:
// corruption in memory is DATA_LOSS, never a valid-looking block.
absl::StatusOr<importance::CompressedBlockView> VerifiedForDecoding(const BlockPayload& stored) {
  if (Checksum(stored.data()) != stored.checksum()) {
    return absl::DataLossError(
        "a compressed block does not match its checksum (memory corruption); it is not served");
  }
  return importance::ParseCompressedBlock(stored.data());
}

}  // namespace

absl::StatusOr<FetchBlock> MaterializeForFetch(const PinnedBlock& stored, bool as_stored) {
  FetchBlock out{.bytes = stored};
  if (!stored->compressed()) return out;  // the worker verifies raw bytes itself
  if (as_stored) {
    // Sent as stored, with the checksum of the stored bytes: the worker verifies.
    absl::StatusOr<importance::CompressedBlockView> view =
        importance::ParseCompressedBlock(stored->data());
    if (!view.ok()) return view.status();
    out.kept_tokens = KeptTokens(*view);
    out.encoding = FetchEncoding::kCompressed;
    return out;
  }
  absl::StatusOr<importance::CompressedBlockView> view = VerifiedForDecoding(*stored);
  if (!view.ok()) return view.status();
  out.kept_tokens = KeptTokens(*view);
  StagingBlock decoded = StagingBlock::OnHeap(view->shape.raw_bytes());
  KVCACHE_RETURN_IF_ERROR(importance::DecodeBlock(*view, decoded.data()));
  const uint64_t checksum = Checksum(decoded.data());
  if (checksum != stored->decoded_checksum()) {
    return absl::DataLossError(
        "a compressed block decodes to other bytes than when it was made; it is not served");
  }
  const uint64_t size = decoded.size();
  out.bytes = PinnedBlock(std::move(decoded).Seal(stored->key(), BlockSeal::Raw(size, checksum)),
                          PinReason::kFetch);
  out.encoding = FetchEncoding::kDequantized;
  return out;
}

absl::StatusOr<DecodedForFetch> DecodeForFetchInto(const BlockPayload& stored,
                                                   std::span<std::byte> out) {
  absl::StatusOr<importance::CompressedBlockView> view = VerifiedForDecoding(stored);
  if (!view.ok()) return view.status();
  if (out.size() != view->shape.raw_bytes()) {
    return absl::InvalidArgumentError(
        absl::StrCat("a block decodes to ", view->shape.raw_bytes(), " bytes, not ", out.size()));
  }
  KVCACHE_RETURN_IF_ERROR(importance::DecodeBlock(*view, out));
  return DecodedForFetch{.checksum = stored.decoded_checksum(), .kept_tokens = KeptTokens(*view)};
}

}  // namespace kvcache
