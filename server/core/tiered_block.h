// TieredBlock: one cached block as a reader took it, holding references to
// the copies it will read.
//
// Holding a TieredBlock pins what it references (pin.h), under the reason it
// was taken for: a host payload, a lower-tier copy and a GPU tier copy are
// freed only when their last reference drops, so a lease, a fetch, an
// append's prefix or a placement that holds the block reads it whole even if
// the block is evicted, demoted or recompressed meanwhile; and while it is
// held the cache does not pick it to evict, demote or re-encode.
#ifndef KVCACHE_SERVER_CORE_TIERED_BLOCK_H_
#define KVCACHE_SERVER_CORE_TIERED_BLOCK_H_

#include <cstdint>

#include "server/core/block.h"
#include "server/core/prefix_index.h"
#include "server/core/tier.h"

namespace kvcache {

struct TieredBlock {
  PinnedBlock host;          // the host copy, or null
  PinnedCopy lower;          // set only when there is no host copy: the top lower copy
  uint64_t lookup_hash = 0;  // finds the block's node again
  PinnedCopy device;         // the GPU tier copy a placement holds, or null
  uint64_t key = 0;          // the block's chain key
  uint32_t depth = 0;        // its index in the sequence
  uint8_t lower_level = 0;   // the level of `lower` (lower_copies.h)

  BlockSeal seal() const { return host != nullptr ? host->seal() : lower->seal(); }

  // The host copy of `n`, or its top lower copy when it has none (no device
  // copy), pinned for `why`.
  static TieredBlock Of(const IndexNode& n, PinReason why) {
    const int top = n.payload == nullptr ? n.lower.top() : LowerCopies::kNone;
    return {.host = PinnedBlock(n.payload, why),
            .lower = PinnedCopy(top == LowerCopies::kNone ? nullptr : n.lower.at(top), why),
            .lookup_hash = n.lookup_hash,
            .key = n.key,
            .depth = n.depth,
            .lower_level = static_cast<uint8_t>(top == LowerCopies::kNone ? 0 : top)};
  }
};

}  // namespace kvcache

#endif  // KVCACHE_SERVER_CORE_TIERED_BLOCK_H_
