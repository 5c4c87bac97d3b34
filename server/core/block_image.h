// BlockImage and ModelImage: the cache's state as a checkpoint records it
// and a restart puts it back (server/checkpoint, docs/checkpoint-format.md).
//
// A ModelImage is one model's registration (layout, compression policy) and
// the lookup hashes of its blocks, parents before children, taken in one
// short pass under the cache's lock. A BlockImage is one block: where it sits
// in its tree (its own and its parent's lookup hash, its tokens), its seal,
// references to its copies (host payload, lower-tier copy) and what the
// policies know of it. Capturing takes block images in small batches, so the
// lock is held briefly and a block evicted meanwhile is simply not recorded
// (restore then skips what hung below it).
//
// Holding a BlockImage keeps its copies alive (it holds references), as a
// lease does; the checkpoint writer drops each batch once written.
#ifndef KVCACHE_SERVER_CORE_BLOCK_IMAGE_H_
#define KVCACHE_SERVER_CORE_BLOCK_IMAGE_H_

#include <array>
#include <cstdint>
#include <vector>

#include "absl/time/time.h"
#include "server/core/block.h"
#include "server/core/importance_policy.h"
#include "server/core/layout.h"
#include "server/core/tier.h"
#include "server/core/token_state.h"

namespace kvcache {

struct ModelImage {
  ModelKey key;
  ModelLayout layout;
  ImportancePolicy policy;
  std::vector<uint64_t> blocks;  // lookup hashes, every parent before its children
};

struct BlockImage {
  uint64_t lookup_hash = 0;
  uint64_t parent_lookup_hash = 0;  // 0: a first block (no parent)
  uint64_t key = 0;                 // chain key as written (a restore computes it again)
  uint32_t depth = 0;
  std::vector<Token> tokens;  // block_tokens of them
  BlockSeal seal;
  // The host copy and the lower-tier copy, each possibly null (not both);
  // pinned while a checkpoint captures them.
  PinnedBlock host;
  PinnedCopy lower;
  absl::Time expires = absl::InfiniteFuture();
  absl::Time last_access = absl::InfinitePast();
  int32_t priority = 0;
  uint8_t workload = 0;
  uint16_t references = 0;
  float importance = 0;
  // LRU-K: how long before the last use each earlier reference was (ms;
  // IndexNode::PolicyHook::kNoReference when there were fewer).
  std::array<uint32_t, 4> history_age_ms{};
  BlockTokenState token_state;  // novelty, activity, pins, precision
};

// What Cache::RestoreBlock did with one image.
enum class RestoreOutcome : uint8_t {
  kRestored,      // inserted
  kPresent,       // the block is cached already (an append stored it first)
  kOrphan,        // its parent is not cached: skipped
  kUnknownModel,  // the model is not registered (or has another layout)
  kMismatch,      // the image is inconsistent (key, tokens, seal): skipped
  kLost,          // neither copy could be restored (no room, lost, corrupt): skipped
};

}  // namespace kvcache

#endif  // KVCACHE_SERVER_CORE_BLOCK_IMAGE_H_
