// Compactor: the passes that rewrite cached blocks where they are, run by
// the daemon's maintenance loop (server/daemon/maintenance.cc):
//
//   Compact      importance-aware compression: cold (or, under pool
//                pressure, any) host blocks of models in quantize, prune or
//                budget mode re-encoded smaller (importance_compaction.cc,
//                docs/importance.md)
//   CompactPool  host pool compaction: blocks in sparse slab spans copied
//                into fuller ones so the pool can release the spans
//                (pool_compaction.cc)
//   Calibrate    each model's importance weights refitted on its sampled
//                attention reports (compactor.cc)
//
// It reaches the cache through CacheAccess. A rewrite follows the move
// protocol (block_move.h): claimed under the cache's lock (ClaimRewrite),
// written and verified outside it, committed under it only if the block did
// not change meanwhile (EndRewrite, ReplaceHostCopy); a block whose stored
// bytes fail their checksum is dropped (DropCorrupt), never rewritten.
//
// Thread-safety: thread-safe; a pass holds the cache's lock to plan and to
// commit, never while it encodes, copies or hashes.
#ifndef KVCACHE_SERVER_CORE_COMPACTOR_H_
#define KVCACHE_SERVER_CORE_COMPACTOR_H_

#include <vector>

#include "server/core/cache_access.h"
#include "server/core/cache_types.h"

namespace kvcache {

class Compactor {
 public:
  // REQUIRES: `cache` outlives the compactor.
  explicit Compactor(Cache* cache) : access_(cache) {}

  // One compression pass. Verifies each candidate's checksum (a corrupt
  // block is dropped, never re-encoded), encodes outside the lock, and swaps
  // a block only if it is unchanged and its model's policy has not changed
  // meanwhile. A block whose compressed copy would free no pool memory stays
  // raw. Compressed copies are made in the pool memory append staging keeps
  // free, so a full tier still compacts. Also enforces the budgets
  // (attention reports grow metadata).
  CompactionResult Compact() const;

  // One pass of host pool compaction: the pool names the live chunks of its
  // sparsest spans (SlabPool::PlanCompaction); each block held there is
  // copied, outside the lock, into a chunk of a fuller span of its class,
  // the copy verified against the block's checksum, and swapped in under the
  // lock only if the block still holds the payload copied. Readers never
  // wait: a fetch holding the old payload keeps reading it, and its chunk
  // returns to the pool when the last reference drops (then the drained
  // span is released).
  PoolCompactionResult CompactPool(const PoolCompactionOptions& options = {}) const;

  // Refits every model's weights that has enough samples (calibration.h),
  // moving them at most calibration_max_step, and starts a new sample.
  std::vector<CalibrationOutcome> Calibrate() const;

 private:
  CacheAccess access_;
};

}  // namespace kvcache

#endif  // KVCACHE_SERVER_CORE_COMPACTOR_H_
