// CheckpointSource: what a restart puts back of a checkpoint (block_image.h,
// server/checkpoint). The restore replays RestoreModel() and, parents first,
// RestoreBlock(), while the cache serves; a block's insertion is the cache's
// (CacheAccess::Held::AddRestored), as an append's is.
#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "server/common/status_macros.h"
#include "server/core/cache.h"
#include "server/core/checkpoint_source.h"

namespace kvcache {

absl::Status CheckpointSource::RestoreModel(const ModelImage& image) {
  absl::StatusOr<RegisterResult> registered =
      access_.cache().RegisterModel(image.key, image.layout);
  if (!registered.ok()) return registered.status();
  if (!registered->created) {
    return absl::OkStatus();  // a worker registered it first: its policy stands
  }
  KVCACHE_RETURN_IF_ERROR(image.policy.Validate());
  CacheAccess::Locked locked(access_);
  ModelState* m = locked.FindMutableModel(image.key);
  if (m == nullptr) return locked.FindModel(image.key).status();  // unregistered meanwhile
  m->policy = image.policy;
  ++m->policy_generation;
  return absl::OkStatus();
}

absl::StatusOr<StagingBlock> CheckpointSource::AllocateRestoredPayload(uint64_t size) {
  // Room is made as an append makes it, by demotion, but only with a lower
  // level: without one, restoring never evicts what workers stored.
  constexpr int kMaxDemotions = 64;
  SlabPool& pool = access_.pool();
  const uint64_t capacity = pool.GetStats().capacity_bytes;
  const uint64_t limit = capacity - std::min(capacity, access_.options().append_staging_bytes);
  const uint64_t need = pool.RoundedSize(size);
  for (int demoted = 0;; ++demoted) {
    if (access_.CommittedHostBytes() + need <= limit) {
      absl::StatusOr<Allocation> a = pool.Allocate(size);
      if (a.ok()) return StagingBlock(&pool, *a, size);
      if (!absl::IsResourceExhausted(a.status())) return a.status();
    }
    uint64_t bytes = 0;
    bool refused = false;
    if (access_.lower_levels() == 0 || demoted == kMaxDemotions ||
        access_.cache().tiers().DemoteOne(&bytes, &refused, "restore") ==
            TierManager::DemoteOutcome::kNothing) {
      return absl::ResourceExhaustedError(
          absl::StrCat("the host tier has no room to restore a block of ", size, " bytes (", limit,
                       " of its ", capacity, " bytes may hold blocks)"));
    }
  }
}

void CheckpointSource::EndRestore() {
  CacheAccess::Locked locked(access_);
  locked.ForEachMutableModel(
      [](ModelState& m) { absl::flat_hash_map<uint64_t, uint64_t>().swap(m.restore_aliases); });
}

RestoreOutcome CheckpointSource::RestoreBlock(const ModelKey& model, BlockImage image) {
  if (image.host != nullptr && image.host->size() != image.seal.size) {
    return RestoreOutcome::kMismatch;
  }
  if (image.lower != nullptr && access_.lower_levels() == 0) image.lower.reset();
  std::vector<BlockRef> unused;  // released after the lock
  CacheAccess::Locked locked(access_);
  ModelState* found = locked.FindMutableModel(model);
  if (found == nullptr) return RestoreOutcome::kUnknownModel;
  ModelState& m = *found;
  if (image.tokens.size() != m.layout.block_tokens) return RestoreOutcome::kMismatch;
  // The block's name in the image, or the name it was restored under.
  auto find = [&m](uint64_t image_hash) -> IndexNode* {
    if (IndexNode* n = m.index.FindByLookupHash(image_hash); n != nullptr) return n;
    auto alias = m.restore_aliases.find(image_hash);
    return alias == m.restore_aliases.end() ? nullptr : m.index.FindByLookupHash(alias->second);
  };
  IndexNode* parent = nullptr;
  if (image.parent_lookup_hash != 0) {
    parent = find(image.parent_lookup_hash);
    if (parent == nullptr) return RestoreOutcome::kOrphan;
  }
  // Hashed again under this cache's keys: the image's may be another's.
  const uint64_t lookup_hash =
      m.index.LookupHash(parent == nullptr ? 0 : parent->lookup_hash, image.tokens);
  if (lookup_hash != image.lookup_hash) m.restore_aliases[image.lookup_hash] = lookup_hash;
  if (m.index.FindByLookupHash(lookup_hash) != nullptr) return RestoreOutcome::kPresent;
  if (image.host == nullptr && image.lower == nullptr) return RestoreOutcome::kLost;
  if (locked.AddRestored(m, parent, std::move(image)) == nullptr) {
    return RestoreOutcome::kPresent;  // a lookup-hash collision
  }
  locked.EnforceBudgets(&unused);
  return RestoreOutcome::kRestored;
}

}  // namespace kvcache
