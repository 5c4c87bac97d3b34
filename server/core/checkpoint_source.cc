// CheckpointSource: what a checkpoint captures (checkpoint_source.h).
#include "server/core/checkpoint_source.h"

#include <algorithm>
#include <chrono>
#include <utility>

#include "server/core/block_move.h"

namespace kvcache {

std::vector<ModelImage> CheckpointSource::CaptureModels() const {
  std::vector<ModelImage> images;
  std::vector<uint64_t> incarnations;  // of each image's model, as captured
  {
    CacheAccess::Locked locked(access_);
    locked.ForEachModel([&](const ModelState& m) {
      incarnations.push_back(m.incarnation);
      ModelImage& image = images.emplace_back();
      image.key = m.key;
      image.layout = m.layout;
      image.policy = m.policy;
    });
  }
  // Each model's blocks in steps (CacheAccess::Walk): serving goes on between them.
  // Parents come first. A model removed or registered anew meanwhile is left
  // out; a block added meanwhile may wait for the next checkpoint.
  std::vector<ModelImage> kept;
  kept.reserve(images.size());
  for (size_t i = 0; i < images.size(); ++i) {
    ModelImage& image = images[i];
    bool same_model = true;
    const bool whole = access_.Walk(
        image.key, {}, [&](const CacheAccess::Held&, const ModelState& m, const IndexNode& n) {
          same_model = same_model && m.incarnation == incarnations[i];
          image.blocks.push_back(n.lookup_hash);
        });
    if (whole && same_model) kept.push_back(std::move(image));
  }
  return kept;
}

size_t CheckpointSource::CaptureBlocks(const ModelKey& model,
                                       std::span<const uint64_t> lookup_hashes,
                                       std::vector<BlockImage>* out) const {
  const auto start = std::chrono::steady_clock::now();
  size_t gone = 0;
  {
    CacheAccess::Locked locked(access_);
    absl::StatusOr<const ModelState*> found = locked.FindModel(model);
    if (!found.ok()) return lookup_hashes.size();
    const PrefixIndex& index = (*found)->index;
    for (uint64_t hash : lookup_hashes) {
      const IndexNode* n = index.FindByLookupHash(hash);
      if (n == nullptr) {
        ++gone;
        continue;
      }
      BlockImage& b = out->emplace_back();
      b.lookup_hash = n->lookup_hash;
      b.parent_lookup_hash = n->parent == nullptr ? 0 : n->parent->lookup_hash;
      b.key = n->key;
      b.depth = n->depth;
      const std::span<const Token> tokens = n->tokens();
      b.tokens.assign(tokens.begin(), tokens.end());
      // A claim with no commit (block_move.h): the copy goes to the
      // checkpoint file, and the claim's references keep the copies readable
      // (and the block out of the movers' hands) until the batch is written.
      // Level 0's copy is the one a restart re-attaches (a deeper level's is
      // not in the checkpoint).
      BlockMove claim = BlockMove::Claim(*n, /*level=*/0, PinReason::kCheckpoint);
      b.seal = claim.seal();
      b.host = claim.host();
      b.lower = claim.lower();
      b.expires = n->expires;
      b.last_access = n->last_access;
      b.priority = n->priority;
      b.workload = n->workload;
      b.references = n->references;
      b.importance = n->importance();
      std::copy(std::begin(n->policy_hook.history_age_ms), std::end(n->policy_hook.history_age_ms),
                b.history_age_ms.begin());
      if (n->has_tokens_state()) b.token_state = n->tokens_state();
    }
  }
  CacheAccess::GiveWayAfterStep(start);
  return gone;
}

}  // namespace kvcache
