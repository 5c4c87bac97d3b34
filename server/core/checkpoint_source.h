// CheckpointSource: what a checkpoint captures of a Cache, and what a
// restart puts back (block_image.h, server/checkpoint). A checkpoint takes
// CaptureModels() once, then CaptureBlocks() batch by batch, while the cache
// serves: both hold its lock for bounded steps only. A restore replays
// RestoreModel() and, parents first, RestoreBlock(), also while the cache
// serves, then EndRestore(). Everything reaches the cache through
// CacheAccess; a restored block's insertion is the cache's own
// (CacheAccess::Held::AddRestored), as an append's is.
//
// Thread-safety: thread-safe; the cache's lock orders it with requests.
#ifndef KVCACHE_SERVER_CORE_CHECKPOINT_SOURCE_H_
#define KVCACHE_SERVER_CORE_CHECKPOINT_SOURCE_H_

#include <cstdint>
#include <span>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "server/core/block.h"
#include "server/core/block_image.h"
#include "server/core/cache_access.h"
#include "server/core/cache_types.h"

namespace kvcache {

class CheckpointSource {
 public:
  // REQUIRES: `cache` outlives the source and the images it hands out.
  explicit CheckpointSource(Cache* cache) : access_(cache) {}

  // Every model's registration and block hashes (parents first), each
  // model's walked in steps (CacheAccess::Walk). A model removed or
  // registered anew during its walk is left out.
  std::vector<ModelImage> CaptureModels() const;
  // Appends to `out` the images of the blocks of `model` among
  // `lookup_hashes` that are still cached, in that order; returns how many
  // were gone (evicted since CaptureModels, or the model was). Holds the
  // lock once for the whole batch, then gives way before it returns, so
  // batches taken back to back do not starve requests. Each image pins its
  // copies (PinReason::kCheckpoint) until it is dropped.
  size_t CaptureBlocks(const ModelKey& model, std::span<const uint64_t> lookup_hashes,
                       std::vector<BlockImage>* out) const;

  // --- Restore (checkpoint_restore.cc) ----------------------------------------
  // Registers the model of `image` (as RegisterModel) and, when it was not
  // registered yet, gives it the image's policy. ALREADY_EXISTS when it is
  // registered with another layout: its blocks are then not restored.
  absl::Status RestoreModel(const ModelImage& image);
  // Pool memory for a block being restored, within the host tier's capacity
  // minus the append staging. With a lower level it demotes to make room, as
  // an append does; without one it never evicts (RESOURCE_EXHAUSTED).
  absl::StatusOr<StagingBlock> AllocateRestoredPayload(uint64_t size);
  // Inserts one block from its image, under the block of
  // image.parent_lookup_hash (an image with neither copy only reports
  // whether the block is cached). REQUIRES: image.host, when set, holds
  // image.seal.size bytes whose checksum the caller verified; image.lower,
  // when set, came from the cache's level 0 (TierManager::lower_tier()). Nothing
  // changes unless the outcome is kRestored (or kPresent, see below).
  //
  // The block's lookup hash and chain key are computed again from its tokens
  // and its parent, not taken from the image: an image written under other
  // keys (a checkpoint from before hashes were keyed, block_hasher.h) is
  // restored under this cache's keys, and its image.lookup_hash is remembered
  // as another name of the block so that its children still find their
  // parent, until EndRestore().
  RestoreOutcome RestoreBlock(const ModelKey& model, BlockImage image);
  // Forgets the other names RestoreBlock remembered (a restore is over).
  void EndRestore();

 private:
  CacheAccess access_;
};

}  // namespace kvcache

#endif  // KVCACHE_SERVER_CORE_CHECKPOINT_SOURCE_H_
