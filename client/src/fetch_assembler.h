// FetchAssembler: reassembles and verifies the blocks of one Fetch stream.
//
// A Fetch stream carries the blocks of a prefix in order, each in one or more
// chunks (kvcache.proto, FetchResponse). The assembler copies every chunk to
// out[block_index * block_bytes + offset], and refuses anything that is not
// exactly the next expected byte of the stream: a gap, an overlap, a block out
// of order, a chunk past its block, a field that changes between the chunks of
// one block, or a block whose bytes do not hash (XXH3-64) to the checksum the
// server recorded. Those are DATA_LOSS. A chunk that would land past the end
// of `out` is INVALID_ARGUMENT (the caller's buffer is too small).
//
// Not thread-safe: one assembler serves one stream on one thread. `out` must
// outlive it. After Add() or Finish() fails the assembler stays failed.
#ifndef KVCACHE_CLIENT_SRC_FETCH_ASSEMBLER_H_
#define KVCACHE_CLIENT_SRC_FETCH_ASSEMBLER_H_

#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "absl/status/status.h"
#include "fetch_decoder.h"
#include "kvcache/client.h"
#include "kvcache/v1/kvcache.pb.h"

struct XXH3_state_s;

namespace kvcache::internal {

// The most bytes one fetched block of a model with this layout (whose raw
// blocks are `block_bytes`) may declare in `encoding`: block_bytes for RAW and
// DEQUANTIZED; for COMPRESSED an upper bound on the compressed block format
// (docs/api.md, versions 1 and 2): the raw bytes (no entry takes more room than at full
// precision), its 48-byte header and precision map, the INT8 scales and
// section padding. 0 for an encoding this client does not know. Callers
// refuse a larger declared size before reserving memory for it.
uint64_t MaxFetchedBlockBytes(const v1::ModelLayout& layout, uint64_t block_bytes,
                              v1::BlockEncoding encoding);

class FetchAssembler {
 public:
  // `expected_block_bytes` and `block_tokens` are the model's layout as the
  // client knows it; when the stream disagrees on block_bytes, Add() returns
  // FAILED_PRECONDITION and layout_mismatch() turns true, so the caller can
  // refresh its layout and retry.
  // REQUIRES: expected_block_bytes > 0, block_tokens > 0.
  FetchAssembler(std::span<std::byte> out, uint64_t expected_block_bytes, uint32_t block_tokens);
  ~FetchAssembler();
  FetchAssembler(const FetchAssembler&) = delete;
  FetchAssembler& operator=(const FetchAssembler&) = delete;

  // Takes the next message of the stream; its data is copied into `out`.
  absl::Status Add(const FetchChunk& chunk);
  absl::Status Add(const v1::FetchResponse& msg) { return Add(ChunkOf(msg)); }
  // The stream ended with OK: checks that it ended on a block boundary and
  // carried exactly matched_tokens / block_tokens blocks.
  absl::Status Finish();

  bool layout_mismatch() const { return layout_mismatch_; }
  // Valid after Finish() returned OK.
  FetchResult result() const;

 private:
  absl::Status Fail(absl::Status status);
  absl::Status StartStream(const FetchChunk& msg);
  absl::Status StartBlock(const FetchChunk& msg);

  std::span<std::byte> out_;
  const uint64_t expected_block_bytes_;
  const uint32_t block_tokens_;
  XXH3_state_s* state_;
  int block_encoding_ = 0;  // v1::BlockEncoding of the current block
  uint32_t dequantized_blocks_ = 0;
  std::vector<std::vector<uint32_t>> kept_tokens_;  // per block started

  absl::Status failed_;
  bool layout_mismatch_ = false;
  bool started_ = false;
  uint64_t matched_tokens_ = 0;
  uint64_t expected_blocks_ = 0;
  uint32_t blocks_done_ = 0;
  bool in_block_ = false;      // a block has been started and is not complete
  uint64_t block_offset_ = 0;  // bytes of the current block received so far
  uint64_t block_checksum_ = 0;
};

}  // namespace kvcache::internal

#endif  // KVCACHE_CLIENT_SRC_FETCH_ASSEMBLER_H_
