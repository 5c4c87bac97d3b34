// Cache: a restored block's insertion into its index (what a restart puts
// back; the restore itself is CheckpointSource's, checkpoint_restore.cc).
#include <algorithm>
#include <utility>

#include "server/core/cache.h"

namespace kvcache {

IndexNode* Cache::AddRestoredLocked(ModelState& m, IndexNode* parent, BlockImage image) {
  const bool in_host = image.host != nullptr;
  IndexNode* node = m.index.AddChild(parent, image.tokens, image.host.Unpin());
  if (node == nullptr) return nullptr;  // a lookup-hash collision
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
  return node;
}

}  // namespace kvcache
