#include "fetch_assembler.h"

#include <xxhash.h>

#include <algorithm>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace kvcache::internal {

uint64_t MaxFetchedBlockBytes(const v1::ModelLayout& layout, uint64_t block_bytes,
                              v1::BlockEncoding encoding) {
  switch (encoding) {
    case v1::BLOCK_ENCODING_RAW:
    case v1::BLOCK_ENCODING_DEQUANTIZED:
      return block_bytes;
    case v1::BLOCK_ENCODING_COMPRESSED: {
      // Per layer, K and V: full rows and INT8 codes take at most the raw
      // bytes of their tokens, each padded to 4 bytes; K has one f32 scale
      // per (head, channel), V one per (head, token).
      const uint64_t layers = layout.num_layers(), heads = layout.num_kv_heads();
      const uint64_t dim = layout.head_dim(), tokens = layout.block_tokens();
      constexpr uint64_t kHeaderBytes = 48;
      const uint64_t per_layer = 2 * 2 * 3 + 4 * heads * dim + 4 * heads * tokens;
      const uint64_t v1 = block_bytes + kHeaderBytes + (tokens + 3) / 4 * 4 + layers * per_layer;
      // Version 2, per (layer, head): rows take at most their raw bytes; K has
      // up to 3 ranges per channel (INT8 A, INT4 min and max), V up to 2 per
      // token; 5 padded sections for each of K and V. The map: 2 bits per entry.
      const uint64_t element = layout.dtype() == v1::DTYPE_FP32 ? 4 : 2;
      const uint64_t entries = layers * heads * tokens;
      const uint64_t per_group = 2 * 5 * 3 + 3 * dim * element + 2 * tokens * element;
      const uint64_t v2 =
          block_bytes + kHeaderBytes + ((entries + 3) / 4 + 3) / 4 * 4 + layers * heads * per_group;
      return std::max(v1, v2);
    }
    default:
      return 0;
  }
}

FetchAssembler::FetchAssembler(std::span<std::byte> out, uint64_t expected_block_bytes,
                               uint32_t block_tokens)
    : out_(out),
      expected_block_bytes_(expected_block_bytes),
      block_tokens_(block_tokens),
      state_(XXH3_createState()) {}

FetchAssembler::~FetchAssembler() { XXH3_freeState(state_); }

absl::Status FetchAssembler::Fail(absl::Status status) {
  failed_ = status;
  return status;
}

absl::Status FetchAssembler::StartStream(const FetchChunk& msg) {
  started_ = true;
  matched_tokens_ = msg.matched_tokens;
  if (matched_tokens_ % block_tokens_ != 0) {
    return Fail(absl::DataLossError(
        absl::StrCat("Fetch: server reported matched_tokens=", matched_tokens_,
                     ", not a multiple of the model's block_tokens=", block_tokens_)));
  }
  expected_blocks_ = matched_tokens_ / block_tokens_;
  if (expected_blocks_ == 0) return absl::OkStatus();
  if (msg.block_bytes != expected_block_bytes_) {
    layout_mismatch_ = true;
    return Fail(absl::FailedPreconditionError(
        absl::StrCat("Fetch: server sends blocks of ", msg.block_bytes,
                     " bytes but the model's layout has ", expected_block_bytes_)));
  }
  // Check the whole prefix fits before writing a byte of it.
  const uint64_t needed = expected_blocks_ * expected_block_bytes_;
  if (needed / expected_block_bytes_ != expected_blocks_ || needed > out_.size()) {
    return Fail(absl::InvalidArgumentError(
        absl::StrCat("Fetch: out holds ", out_.size(), " bytes but the cached prefix (",
                     matched_tokens_, " tokens, ", expected_blocks_, " blocks of ",
                     expected_block_bytes_, " bytes) needs ", needed)));
  }
  return absl::OkStatus();
}

absl::Status FetchAssembler::StartBlock(const FetchChunk& msg) {
  if (blocks_done_ >= expected_blocks_) {
    return Fail(
        absl::DataLossError(absl::StrCat("Fetch: block ", msg.block_index, " arrived after all ",
                                         expected_blocks_, " blocks of the prefix")));
  }
  if (msg.block_index != blocks_done_) {
    return Fail(absl::DataLossError(
        absl::StrCat("Fetch: expected block ", blocks_done_, ", got block ", msg.block_index)));
  }
  if (msg.offset != 0) {
    return Fail(absl::DataLossError(absl::StrCat(
        "Fetch: block ", msg.block_index, " starts at offset ", msg.offset, " instead of 0")));
  }
  if (msg.encoding != v1::BLOCK_ENCODING_RAW && msg.encoding != v1::BLOCK_ENCODING_DEQUANTIZED) {
    return Fail(
        absl::DataLossError(absl::StrCat("Fetch: block ", msg.block_index, " arrived in encoding ",
                                         msg.encoding, ", which this fetch did not ask for")));
  }
  XXH3_64bits_reset(state_);
  in_block_ = true;
  block_offset_ = 0;
  block_checksum_ = msg.block_checksum;
  block_encoding_ = msg.encoding;
  if (msg.encoding == v1::BLOCK_ENCODING_DEQUANTIZED) ++dequantized_blocks_;
  kept_tokens_.emplace_back(msg.kept_tokens.begin(), msg.kept_tokens.end());
  for (size_t i = 0; i < kept_tokens_.back().size(); ++i) {
    if (kept_tokens_.back()[i] >= block_tokens_ ||
        (i > 0 && kept_tokens_.back()[i] <= kept_tokens_.back()[i - 1])) {
      return Fail(absl::DataLossError(absl::StrCat("Fetch: block ", msg.block_index,
                                                   " lists kept tokens out of order or range")));
    }
  }
  return absl::OkStatus();
}

absl::Status FetchAssembler::Add(const FetchChunk& msg) {
  if (!failed_.ok()) return failed_;
  if (!started_) {
    if (absl::Status s = StartStream(msg); !s.ok()) return s;
  } else if (msg.matched_tokens != matched_tokens_) {
    return Fail(absl::DataLossError(absl::StrCat("Fetch: matched_tokens changed mid-stream from ",
                                                 matched_tokens_, " to ", msg.matched_tokens)));
  }
  if (expected_blocks_ == 0) {
    if (msg.data_size != 0) {
      return Fail(absl::DataLossError(
          absl::StrCat("Fetch: server sent ", msg.data_size, " bytes for an empty prefix")));
    }
    return absl::OkStatus();
  }
  if (msg.block_bytes != expected_block_bytes_) {
    return Fail(absl::DataLossError(absl::StrCat("Fetch: block_bytes changed mid-stream from ",
                                                 expected_block_bytes_, " to ", msg.block_bytes)));
  }
  if (!in_block_) {
    if (absl::Status s = StartBlock(msg); !s.ok()) return s;
  } else if (msg.block_index != blocks_done_ || msg.offset != block_offset_ ||
             msg.block_checksum != block_checksum_ || msg.encoding != block_encoding_ ||
             !msg.kept_tokens.empty()) {
    return Fail(absl::DataLossError(absl::StrFormat(
        "Fetch: expected block %u at offset %u with checksum %016x, got block %u at offset %u "
        "with checksum %016x",
        blocks_done_, block_offset_, block_checksum_, msg.block_index, msg.offset,
        msg.block_checksum)));
  }
  const uint64_t size = msg.data_size;
  if (size > expected_block_bytes_ - block_offset_) {
    return Fail(absl::DataLossError(absl::StrCat("Fetch: chunk of ", size, " bytes at offset ",
                                                 block_offset_, " overruns block ", blocks_done_,
                                                 " of ", expected_block_bytes_, " bytes")));
  }
  const uint64_t at = uint64_t{blocks_done_} * expected_block_bytes_ + block_offset_;
  // StartStream checked the whole prefix fits; this guards the arithmetic anyway.
  if (at > out_.size() || size > out_.size() - at) {
    return Fail(absl::InvalidArgumentError(absl::StrCat(
        "Fetch: out holds ", out_.size(), " bytes, too small for block ", blocks_done_)));
  }
  std::byte* dst = out_.data() + at;
  for (std::span<const std::byte> piece : msg.data) {
    std::memcpy(dst, piece.data(), piece.size());
    // Hash the copy while it is in cache.
    XXH3_64bits_update(state_, dst, piece.size());
    dst += piece.size();
  }
  block_offset_ += size;
  if (block_offset_ == expected_block_bytes_) {
    const uint64_t got = XXH3_64bits_digest(state_);
    if (got != block_checksum_) {
      return Fail(absl::DataLossError(
          absl::StrFormat("Fetch: block %u checksum mismatch: bytes hash to %016x, server "
                          "recorded %016x",
                          blocks_done_, got, block_checksum_)));
    }
    ++blocks_done_;
    in_block_ = false;
    block_offset_ = 0;
  }
  return absl::OkStatus();
}

absl::Status FetchAssembler::Finish() {
  if (!failed_.ok()) return failed_;
  if (in_block_) {
    return Fail(absl::DataLossError(absl::StrCat("Fetch: stream ended inside block ", blocks_done_,
                                                 " after ", block_offset_, " of ",
                                                 expected_block_bytes_, " bytes")));
  }
  if (blocks_done_ != expected_blocks_) {
    return Fail(absl::DataLossError(absl::StrCat("Fetch: stream ended after ", blocks_done_, " of ",
                                                 expected_blocks_, " blocks (", matched_tokens_,
                                                 " tokens)")));
  }
  return absl::OkStatus();
}

FetchResult FetchAssembler::result() const {
  FetchResult r;
  r.matched_tokens = matched_tokens_;
  r.blocks = blocks_done_;
  r.bytes = uint64_t{blocks_done_} * expected_block_bytes_;
  r.dequantized_blocks = dequantized_blocks_;
  r.kept_tokens = kept_tokens_;
  bool any_pruned = false;
  for (const auto& k : kept_tokens_) any_pruned |= !k.empty();
  if (!any_pruned) r.kept_tokens.clear();
  return r;
}

}  // namespace kvcache::internal
