// ModelRegistry: the models a Cache knows, each with its index and its
// per-model state (layout, importance policy, calibration sample, counters).
//
// It finds a model by key and by its index (a node's `index` leads back to
// its model), keeps the two lookups in step, and enforces max_models, both
// daemon-wide and as each namespace's share of it (namespace_share.h). A
// model's state lives until it is removed; the index pointer of a removed
// model is never found again, so a reader that remembered it (an append in
// flight, a lease, a tier move outside the lock) can tell it is gone.
//
// Not thread-safe: the owning Cache serialises changes under its lock
// (held exclusively) and reads under it held at least shared. A model's
// own state has a second lock, ModelState::index_lock, for the sections
// that hold the cache's lock shared (see there).
#ifndef KVCACHE_SERVER_CORE_MODEL_REGISTRY_H_
#define KVCACHE_SERVER_CORE_MODEL_REGISTRY_H_

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>

#include "absl/container/btree_map.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "server/common/mutex.h"
#include "server/common/shared_mutex.h"
#include "server/core/eviction_policy.h"
#include "server/core/importance_policy.h"
#include "server/core/layout.h"
#include "server/core/prefix_index.h"
#include "server/core/token_state.h"
#include "server/importance/calibration.h"

namespace kvcache {

struct ModelState {
  ModelState(const ModelKey& k, const ModelLayout& l, const ImportancePolicy& p,
             size_t calibration_samples,
             std::shared_ptr<const BlockHasher> hasher = BlockHasher::Unkeyed())
      : key(k),
        layout(l),
        index(l.block_tokens, std::move(hasher)),
        policy(p),
        calibrator(calibration_samples) {}
  ModelKey key;
  ModelLayout layout;
  // Set by ModelRegistry::Add, unique over the daemon's life: tells a model
  // registered anew from the one it replaced (addresses can repeat).
  uint64_t incarnation = 0;
  // The model's shard of the cache's lock. A section holding the cache's
  // lock exclusively needs nothing more: no one else holds this one then.
  // A section holding the cache's lock shared takes this one too, shared
  // to read `index` (a hit, the start of an append, a commit that stores
  // nothing) or exclusively to add blocks to it (a commit that stores new
  // blocks; it also writes `bytes`, `metadata_bytes` and
  // `appended_blocks`). So appends of different models store side by side,
  // and a reader of a model never sees its index change under it. Order:
  // the cache's lock, then this one, then `touch_turn`.
  mutable SharedMutex index_lock;
  // The policy that ranks the model's blocks in host memory (a sibling of
  // the cache's configured one; `index` points to it), and the turn a
  // section holding the cache's lock shared takes to change it (the
  // touches of its hits and the insertions of its commits: TouchBuffer).
  // A section holding the cache's lock exclusively needs no turn. Declared
  // before `index`, so the index's nodes go first.
  std::unique_ptr<EvictionPolicy> host_policy;
  mutable Mutex touch_turn;
  PrefixIndex index;
  uint64_t bytes = 0;
  uint64_t metadata_bytes = 0;  // its index nodes' metadata (Cache::NodeMetadataBytes)
  // Counted by lookups, which may share the cache's lock: atomic.
  std::atomic<uint64_t> hit_tokens{0};
  std::atomic<uint64_t> miss_tokens{0};
  uint64_t appended_blocks = 0;
  // Counted also by commits that store nothing, which share the lock: atomic.
  std::atomic<uint64_t> deduplicated_blocks{0};
  uint64_t evicted_blocks = 0;
  ImportancePolicy policy;
  importance::Calibrator calibrator;
  uint64_t compressed_blocks = 0;  // blocks now in the compressed format
  uint64_t int8_tokens = 0;        // tokens now stored as INT8
  uint64_t pruned_tokens = 0;      // tokens now dropped
  uint64_t int8_entries = 0;       // budget mode: (layer, head, token) entries now INT8
  uint64_t int4_entries = 0;       // ... INT4
  uint64_t pruned_entries = 0;     // ... dropped
  uint64_t budget_overruns = 0;    // blocks that did not fit target_bytes even pruned
  uint64_t bytes_saved = 0;        // raw bytes minus compressed bytes, now
  // A compressed block (`ts.compressed`) joins or leaves the counts above
  // (all but budget_overruns, which counts compaction outcomes).
  void CountCompressed(const BlockTokenState& ts);
  void UncountCompressed(const BlockTokenState& ts);
  uint64_t attention_reports = 0;
  uint64_t calibrations = 0;
  std::atomic<uint64_t> conflicting_blocks{
      0};                        // appends whose bytes differed from the cached block
  uint64_t restored_blocks = 0;  // lossy blocks made exact again by an append
  uint64_t corrupt_blocks = 0;   // dropped by compaction: checksum mismatch
  // While a restore runs: a restored block's lookup hash in its image, when
  // that differs from its lookup hash here (the image was written under
  // other keys), to this one (Cache::RestoreBlock).
  absl::flat_hash_map<uint64_t, uint64_t> restore_aliases;
  // Bumped by every policy change: a compaction job planned under another
  // generation is void.
  uint64_t policy_generation = 0;
  // Bumped when compression is switched off: plans made before it may no
  // longer send lossy blocks.
  std::shared_ptr<std::atomic<uint64_t>> lossless_epoch =
      std::make_shared<std::atomic<uint64_t>>(0);
};

class ModelRegistry {
 public:
  using Map = absl::btree_map<ModelKey, std::unique_ptr<ModelState>>;

  // REQUIRES: 0 < namespace_share <= 1.
  explicit ModelRegistry(uint32_t max_models, double namespace_share = 1.0)
      : max_models_(max_models), namespace_share_(namespace_share) {}

  // The model, or null when it is not registered.
  ModelState* Find(const ModelKey& model) const {
    auto it = models_.find(model);
    return it == models_.end() ? nullptr : it->second.get();
  }
  // The model `index` belongs to, or null when that model was removed.
  ModelState* OfIndex(const PrefixIndex* index) const {
    auto it = by_index_.find(index);
    return it == by_index_.end() ? nullptr : it->second;
  }
  // Adds a model not registered yet. RESOURCE_EXHAUSTED, and nothing added,
  // past max_models or past its namespace's share of it.
  absl::StatusOr<ModelState*> Add(std::unique_ptr<ModelState> state);
  // Removes a registered model and hands its state back (null when unknown).
  std::unique_ptr<ModelState> Remove(const ModelKey& model);

  // Every model, by key.
  Map::const_iterator begin() const { return models_.begin(); }
  Map::const_iterator end() const { return models_.end(); }
  size_t size() const { return models_.size(); }
  // Models registered in namespace `ns`.
  size_t size_of(const std::string& ns) const {
    auto it = per_namespace_.find(ns);
    return it == per_namespace_.end() ? 0 : it->second;
  }

 private:
  const uint32_t max_models_;
  const double namespace_share_;
  uint64_t next_incarnation_ = 1;
  absl::flat_hash_map<std::string, size_t> per_namespace_;
  Map models_;
  absl::flat_hash_map<const PrefixIndex*, ModelState*> by_index_;
};

}  // namespace kvcache

#endif  // KVCACHE_SERVER_CORE_MODEL_REGISTRY_H_
