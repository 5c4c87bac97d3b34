#include "server/core/model_registry.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "server/core/namespace_share.h"

namespace kvcache {

void ModelState::CountCompressed(const BlockTokenState& ts) {
  ++compressed_blocks;
  int8_tokens += ts.num_int8;
  pruned_tokens += ts.num_pruned;
  int8_entries += ts.int8_entries;
  int4_entries += ts.int4_entries;
  pruned_entries += ts.pruned_entries;
  bytes_saved += ts.bytes_saved;
}

void ModelState::UncountCompressed(const BlockTokenState& ts) {
  --compressed_blocks;
  int8_tokens -= ts.num_int8;
  pruned_tokens -= ts.num_pruned;
  int8_entries -= ts.int8_entries;
  int4_entries -= ts.int4_entries;
  pruned_entries -= ts.pruned_entries;
  bytes_saved -= ts.bytes_saved;
}

absl::StatusOr<ModelState*> ModelRegistry::Add(std::unique_ptr<ModelState> state) {
  if (models_.size() >= max_models_) {
    return absl::ResourceExhaustedError(
        absl::StrCat("max_models (", max_models_, ") models are registered already"));
  }
  if (const size_t held = size_of(state->key.ns);
      held >= NamespaceShareOf(max_models_, namespace_share_)) {
    return absl::ResourceExhaustedError(NamespaceShareMessage(
        state->key.ns, "models", held, 1, "limits.max_models", max_models_, namespace_share_));
  }
  ModelState* added = state.get();
  ++per_namespace_[added->key.ns];
  added->incarnation = next_incarnation_++;
  by_index_.emplace(&added->index, added);
  models_.emplace(added->key, std::move(state));
  return added;
}

std::unique_ptr<ModelState> ModelRegistry::Remove(const ModelKey& model) {
  auto it = models_.find(model);
  if (it == models_.end()) return nullptr;
  std::unique_ptr<ModelState> removed = std::move(it->second);
  models_.erase(it);
  by_index_.erase(&removed->index);
  if (auto n = per_namespace_.find(model.ns); n != per_namespace_.end() && --n->second == 0) {
    per_namespace_.erase(n);
  }
  return removed;
}

}  // namespace kvcache
