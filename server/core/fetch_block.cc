#include "server/core/fetch_block.h"

#include <utility>

#include "server/importance/block_codec.h"

namespace kvcache {

absl::StatusOr<FetchBlock> MaterializeForFetch(const BlockRef& stored, bool accept_compressed) {
  FetchBlock out{.bytes = stored};
  if (!stored->compressed()) return out;
  absl::StatusOr<importance::CompressedBlockView> view =
      importance::ParseCompressedBlock(stored->data());
  if (!view.ok()) return view.status();
  if (view->num_pruned > 0) {
    for (uint32_t t = 0; t < view->shape.block_tokens; ++t) {
      if (view->precision[t] != importance::TokenPrecision::kPruned) out.kept_tokens.push_back(t);
    }
  }
  if (accept_compressed) {
    out.encoding = FetchEncoding::kCompressed;
    return out;
  }
  BlockRef decoded = BlockPayload::FromHeap(view->shape.raw_bytes());
  if (absl::Status s = importance::DecodeBlock(*view, decoded->mutable_data()); !s.ok()) return s;
  decoded->Seal(Checksum(decoded->data()));
  out.bytes = std::move(decoded);
  out.encoding = FetchEncoding::kDequantized;
  return out;
}

}  // namespace kvcache
