// Cache: what a restart restores from a checkpoint (block_image.h); what a
// checkpoint captures is CheckpointSource's (checkpoint_source.cc).
#include <algorithm>
#include <chrono>
#include <utility>

#include "absl/strings/str_cat.h"
#include "server/common/status_macros.h"
#include "server/core/block_move.h"
#include "server/core/cache.h"

namespace kvcache {

absl::Status Cache::RestoreModel(const ModelImage& image) {
  absl::StatusOr<RegisterResult> registered = RegisterModel(image.key, image.layout);
  if (!registered.ok()) return registered.status();
  if (!registered->created)
    return absl::OkStatus();  // a worker registered it first: its policy stands
  KVCACHE_RETURN_IF_ERROR(image.policy.Validate());
  WriteLock lock(this);
  absl::StatusOr<ModelState*> m = FindModelLocked(image.key);
  if (!m.ok()) return m.status();
  (*m)->policy = image.policy;
  ++(*m)->policy_generation;
  return absl::OkStatus();
}

absl::StatusOr<StagingBlock> Cache::AllocateRestoredPayload(uint64_t size) {
  // Room is made as an append makes it, by demotion, but only with a lower
  // tier: without one, restoring never evicts what workers stored.
  constexpr int kMaxDemotions = 64;
  const uint64_t capacity = pool_->GetStats().capacity_bytes;
  const uint64_t limit = capacity - std::min(capacity, options_.append_staging_bytes);
  const uint64_t need = pool_->RoundedSize(size);
  for (int demoted = 0;; ++demoted) {
    const bool room = CommittedHostBytes() + need <= limit;
    if (room) {
      absl::StatusOr<Allocation> a = pool_->Allocate(size);
      if (a.ok()) return StagingBlock(pool_.get(), *a, size);
      if (!absl::IsResourceExhausted(a.status())) return a.status();
    }
    if (lower_.empty() || demoted == kMaxDemotions || !MakeRoomForSpace()) {
      return absl::ResourceExhaustedError(
          absl::StrCat("the host tier has no room to restore a block of ", size, " bytes (", limit,
                       " of its ", capacity, " bytes may hold blocks)"));
    }
  }
}

void Cache::EndRestore() {
  WriteLock lock(this);
  for (const auto& [key, m] : models_) {
    absl::flat_hash_map<uint64_t, uint64_t>().swap(m->restore_aliases);
  }
}

RestoreOutcome Cache::RestoreBlock(const ModelKey& model, BlockImage image) {
  if (image.host != nullptr && image.host->size() != image.seal.size) {
    return RestoreOutcome::kMismatch;
  }
  if (image.lower != nullptr && lower_.empty()) image.lower.reset();
  std::vector<BlockRef> unused;  // released after the lock
  WriteLock lock(this);
  ModelState* found = models_.Find(model);
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
  const bool in_host = image.host != nullptr;
  IndexNode* node = m.index.AddChild(parent, image.tokens, image.host.Unpin());
  if (node == nullptr) return RestoreOutcome::kPresent;  // a lookup-hash collision
  node->lower.at(0) = image.lower.Unpin();
  node->expires = image.expires;
  node->last_access = image.last_access;
  node->priority = image.priority;
  node->workload = image.workload;
  node->references = image.references;
  node->set_importance(image.importance);
  const BlockTokenState& ts = image.token_state;
  if (!ts.novelty.empty() || !ts.activity.empty() || !ts.pinned.empty() || ts.compressed) {
    node->mutable_tokens_state() = ts;
  }
  if (ts.compressed) m.CountCompressed(ts);
  RecountMetadataLocked(node);
  m.bytes += image.seal.size;
  if (in_host) payload_bytes_ += image.seal.size;
  if (node->lower.at(0) != nullptr) {
    ++tier_.lower[0].blocks;
    tier_.lower[0].payload_bytes += image.seal.size;
    if (!in_host) ++tier_.lower[0].only_blocks;
  }
  // A new block to its tier's policy, then its reference history back (the
  // policy re-ranks it on Adopt); its last use counts from now.
  EvictionPolicy* policy = PolicyFor(*node);
  policy->Insert(node);
  node->in_policy = true;
  std::copy(image.history_age_ms.begin(), image.history_age_ms.end(),
            node->policy_hook.history_age_ms);
  policy->Release(node);
  policy->Adopt(node);
  EnforceBudgetsLocked(&unused);
  return RestoreOutcome::kRestored;
}

}  // namespace kvcache
