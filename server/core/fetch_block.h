// MaterializeForFetch: what a fetch sends for one stored block.
//
// A raw block goes out as stored. A block the importance policy compressed
// goes out either as stored (the compressed block format, when the worker
// accepts it) or decoded to the model's dtype and layout: INT8 tokens
// dequantized, pruned tokens zero, with the block-local positions of the
// tokens it still holds. Before decoding, the stored bytes are checked
// against their checksum, and the decoding against the checksum recorded when
// the block was compressed, so corruption in memory is DATA_LOSS rather than a
// block that looks valid. A decoded block lives on the heap only as long as
// the fetch sending it, and carries the checksum of the decoded bytes, so a
// worker verifies exactly what it received. Which blocks a fetch may send
// lossy at all is the cache's decision (Cache::PrepareFetch), not this one's.
//
// A fetch into the worker's own memory (the shared-memory data plane) decodes
// straight into it instead (DecodeForFetchInto): one pass that writes the
// worker's bytes, no heap copy, and no hash of the decoding; the checksum it
// answers is the one recorded when the block was compressed, which the
// worker verifies against what landed, so a decoding that differs is still
// caught end to end (by the worker, as a checksum mismatch).
//
// Thread-safety: pure functions of an immutable payload; call without locks.
#ifndef KVCACHE_SERVER_CORE_FETCH_BLOCK_H_
#define KVCACHE_SERVER_CORE_FETCH_BLOCK_H_

#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"
#include "server/core/block.h"

namespace kvcache {

// Values match kvcache.v1.BlockEncoding.
enum class FetchEncoding : uint8_t { kRaw = 0, kDequantized = 1, kCompressed = 2 };

struct FetchBlock {
  PinnedBlock bytes;  // what to send; sealed with its checksum
  FetchEncoding encoding = FetchEncoding::kRaw;
  // Block-local positions of the tokens the block holds; empty when it holds
  // all of them.
  std::vector<uint32_t> kept_tokens;
};

// DATA_LOSS when a compressed payload does not parse, does not match its
// checksum, or decodes to other bytes than when it was made (memory corruption).
absl::StatusOr<FetchBlock> MaterializeForFetch(const PinnedBlock& stored, bool as_stored);

// What a block decoded into the worker's memory is sent with.
struct DecodedForFetch {
  uint64_t checksum = 0;              // of the decoding, as recorded when the block was compressed
  std::vector<uint32_t> kept_tokens;  // as FetchBlock's
};

// Decodes compressed `stored` into `out`, which must hold exactly its raw
// size. DATA_LOSS when the payload does not parse or does not match its
// checksum; INVALID_ARGUMENT when `out` is another size. `out` may be
// written by others meanwhile (a worker's region): only the worker's check
// of what landed says the bytes are right.
absl::StatusOr<DecodedForFetch> DecodeForFetchInto(const BlockPayload& stored,
                                                   std::span<std::byte> out);

}  // namespace kvcache

#endif  // KVCACHE_SERVER_CORE_FETCH_BLOCK_H_
