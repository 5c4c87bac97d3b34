// Cache: each namespace's share of the metadata budget (CacheOptions::
// namespace_share of max_metadata_bytes). A namespace past its share loses its
// own coldest blocks, never another namespace's, as MakeRoomInNamespace does
// for max_namespace_bytes.
#include <string>

#include "absl/container/flat_hash_map.h"
#include "server/core/cache.h"
#include "server/core/namespace_share.h"

namespace kvcache {

uint64_t Cache::NamespaceMetadataBytesLocked(const std::string& ns) const {
  uint64_t bytes = leases_.metadata_bytes_of(ns);
  for (const auto& [key, m] : models_) {
    if (key.ns == ns) bytes += m->metadata_bytes;
  }
  return bytes;
}

bool Cache::EvictNamespaceBlockLocked(const std::string& ns, const char* reason,
                                      std::vector<BlockRef>* dropped) {
  auto owned = [&](const IndexNode& n) {
    mu_.AssertHeld();  // the policies call this under the lock
    const ModelState* owner = models_.OfIndex(n.index);
    return owner != nullptr && owner->key.ns == ns;
  };
  // The lower levels' blocks are colder than the host's: they go first.
  if (EvictLowerLeafLocked(owned, reason, dropped)) return true;
  IndexNode* victim = PickHostVictimLocked(
      [](const IndexNode& n) { return n.is_leaf() && !n.payload->pins().pinned(); }, &ns);
  if (victim == nullptr) return false;
  tiers_->LogMove(*victim, "host", "none", reason, victim->payload->size());
  RemoveSubtreeLocked(*models_.OfIndex(victim->index), victim, dropped);
  return true;
}

uint64_t Cache::EnforceNamespaceMetadataLocked(std::vector<BlockRef>* dropped) {
  const uint64_t share = NamespaceShareOf(options_.max_metadata_bytes, options_.namespace_share);
  absl::flat_hash_map<std::string, uint64_t> held;
  for (const auto& [key, m] : models_) held[key.ns] += m->metadata_bytes;
  uint64_t evicted = 0;
  for (const auto& [ns, index_bytes] : held) {
    uint64_t bytes = index_bytes + leases_.metadata_bytes_of(ns);
    while (bytes > share && EvictNamespaceBlockLocked(ns, "metadata share", dropped)) {
      ++evicted;
      ++metadata_evictions_;
      ++namespace_metadata_evictions_;
      bytes = NamespaceMetadataBytesLocked(ns);
    }
  }
  return evicted;
}

}  // namespace kvcache
