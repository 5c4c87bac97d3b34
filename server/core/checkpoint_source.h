// CheckpointSource: what a checkpoint captures of a Cache (block_image.h,
// server/checkpoint). A checkpoint takes CaptureModels() once, then
// CaptureBlocks() batch by batch, while the cache serves: both reach the
// cache through CacheAccess and hold its lock for bounded steps only.
// (Putting a checkpoint back is the cache's own: Cache::RestoreModel and
// Cache::RestoreBlock, since a restore adds blocks as an append does.)
//
// Thread-safety: thread-safe; the cache's lock orders it with requests.
#ifndef KVCACHE_SERVER_CORE_CHECKPOINT_SOURCE_H_
#define KVCACHE_SERVER_CORE_CHECKPOINT_SOURCE_H_

#include <cstdint>
#include <span>
#include <vector>

#include "server/core/block_image.h"
#include "server/core/cache_access.h"

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

 private:
  CacheAccess access_;
};

}  // namespace kvcache

#endif  // KVCACHE_SERVER_CORE_CHECKPOINT_SOURCE_H_
