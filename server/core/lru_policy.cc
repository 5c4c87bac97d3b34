// LRU over all tracked blocks: a list in recency order (front: coldest) and a
// map from node to its list position.
#include <list>

#include "absl/container/flat_hash_map.h"
#include "server/core/eviction_policy.h"

namespace kvcache {
namespace {

class LruPolicy final : public EvictionPolicy {
 public:
  void Insert(IndexNode* node) override {
    order_.push_back(node);
    position_.emplace(node, std::prev(order_.end()));
  }

  void Touch(IndexNode* node) override {
    auto it = position_.find(node);
    order_.splice(order_.end(), order_, it->second);
  }

  void Erase(IndexNode* node) override {
    auto it = position_.find(node);
    order_.erase(it->second);
    position_.erase(it);
  }

  IndexNode* PickVictim(absl::FunctionRef<bool(const IndexNode&)> evictable) override {
    for (IndexNode* node : order_) {
      if (evictable(*node)) return node;
    }
    return nullptr;
  }

  size_t size() const override { return order_.size(); }
  std::string_view name() const override { return "lru"; }

 private:
  std::list<IndexNode*> order_;
  absl::flat_hash_map<IndexNode*, std::list<IndexNode*>::iterator> position_;
};

}  // namespace

std::unique_ptr<EvictionPolicy> NewLruPolicy() { return std::make_unique<LruPolicy>(); }

}  // namespace kvcache
