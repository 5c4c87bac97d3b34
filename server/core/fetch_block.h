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
// Thread-safety: pure function of an immutable payload; call without locks.
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

}  // namespace kvcache

#endif  // KVCACHE_SERVER_CORE_FETCH_BLOCK_H_
