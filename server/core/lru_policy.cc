// LRU over all tracked blocks: an intrusive list in recency order (head:
// coldest), threaded through the nodes' policy hooks, so a touch is a few
// pointer writes to nodes the caller has just read, with no allocation and
// no look-up. Each use also takes a number from a counter the policy's
// siblings share (kept in the hook's last_ms, which LRU has no other use
// for): the order across siblings.
#include <memory>
#include <utility>

#include "server/core/eviction_policy.h"

namespace kvcache {
namespace {

class LruPolicy final : public EvictionPolicy {
 public:
  LruPolicy() : uses_(std::make_shared<OrderSequence>()) {}
  explicit LruPolicy(std::shared_ptr<OrderSequence> uses) : uses_(std::move(uses)) {}

  void Insert(IndexNode* node) override {
    PushBack(node);
    ++size_;
  }

  void Touch(IndexNode* node) override {
    if (node == tail_) {
      Number(node);
      return;
    }
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

  std::unique_ptr<EvictionPolicy> NewSibling() const override {
    return std::make_unique<LruPolicy>(uses_);
  }
  EvictionOrder OrderOf(const IndexNode& node) const override {
    return {.rank = 0, .seq = static_cast<uint64_t>(node.policy_hook.last_ms)};
  }

  size_t size() const override { return size_; }
  std::string_view name() const override { return "lru"; }

 private:
  void Number(IndexNode* node) {
    node->policy_hook.last_ms = static_cast<int64_t>(uses_->Next(&last_use_));
  }

  void PushBack(IndexNode* node) {
    Number(node);
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

  const std::shared_ptr<OrderSequence> uses_;  // shared with the siblings
  uint64_t last_use_ = 0;                      // this policy's last number
  IndexNode* head_ = nullptr;                  // coldest
  IndexNode* tail_ = nullptr;                  // most recent
  size_t size_ = 0;
};

}  // namespace

std::unique_ptr<EvictionPolicy> NewLruPolicy() { return std::make_unique<LruPolicy>(); }

}  // namespace kvcache
