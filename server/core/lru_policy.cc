// LRU over all tracked blocks: an intrusive list in recency order (head:
// coldest), threaded through the nodes' policy hooks, so a touch is a few
// pointer writes to nodes the caller has just read, with no allocation and
// no look-up.
#include "server/core/eviction_policy.h"

namespace kvcache {
namespace {

class LruPolicy final : public EvictionPolicy {
 public:
  void Insert(IndexNode* node) override {
    PushBack(node);
    ++size_;
  }

  void Touch(IndexNode* node) override {
    if (node == tail_) return;
    Unlink(node);
    PushBack(node);
  }

  void Erase(IndexNode* node) override {
    Unlink(node);
    --size_;
  }

  IndexNode* PickVictim(absl::FunctionRef<bool(const IndexNode&)> evictable) override {
    for (IndexNode* node = head_; node != nullptr; node = node->policy_hook.list.next) {
      if (evictable(*node)) return node;
    }
    return nullptr;
  }

  size_t size() const override { return size_; }
  std::string_view name() const override { return "lru"; }

 private:
  void PushBack(IndexNode* node) {
    node->policy_hook.list = {.prev = tail_, .next = nullptr};
    if (tail_ != nullptr) {
      tail_->policy_hook.list.next = node;
    } else {
      head_ = node;
    }
    tail_ = node;
  }

  void Unlink(IndexNode* node) {
    IndexNode::PolicyHook::List& h = node->policy_hook.list;
    (h.prev != nullptr ? h.prev->policy_hook.list.next : head_) = h.next;
    (h.next != nullptr ? h.next->policy_hook.list.prev : tail_) = h.prev;
    h.prev = h.next = nullptr;
  }

  IndexNode* head_ = nullptr;  // coldest
  IndexNode* tail_ = nullptr;  // most recent
  size_t size_ = 0;
};

}  // namespace

std::unique_ptr<EvictionPolicy> NewLruPolicy() { return std::make_unique<LruPolicy>(); }

}  // namespace kvcache
