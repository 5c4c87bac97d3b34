#include "server/core/model_registry.h"

#include <utility>

#include "absl/strings/str_cat.h"

namespace kvcache {

absl::StatusOr<ModelState*> ModelRegistry::Add(std::unique_ptr<ModelState> state) {
  if (models_.size() >= max_models_) {
    return absl::ResourceExhaustedError(
        absl::StrCat("max_models (", max_models_, ") models are registered already"));
  }
  ModelState* added = state.get();
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
  return removed;
}

}  // namespace kvcache
