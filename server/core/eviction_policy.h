// EvictionPolicy: decides which cached block leaves first when the host tier
// is full.
//
// The Cache tells the policy about every block in every index: Insert() when
// it is added, Touch() when a lookup, fetch or append uses it, Erase() when it
// leaves for any reason. When memory is needed the Cache asks PickVictim()
// for the best block to drop among those `evictable` accepts (the Cache's rule:
// a leaf, referenced by nothing but the index, so neither leased nor being
// fetched), then erases it itself. The Cache touches a path leaf-first, so a
// parent is always at least as recent as its children.
//
// The Cache keeps one host policy per model, each made from the configured
// one by NewSibling, and evicts the coldest of their victims (OrderOf
// compares blocks of siblings). A policy is not thread-safe: the Cache
// serialises the calls to each (a model's touches take that model's turn).
// Siblings may be used by different threads at once: what they share (the
// order's sequence numbers, LRU-K's retained histories) is thread-safe.
// Every policy passes eviction_policy_test.cc's behaviour suite. Two exist:
//   lru    least recently used first (lru_policy.cc);
//   lru_k  LRU-K with K by workload, a correlated-reference period, history
//          kept for evicted blocks, and the append's priority and the
//          cache's importance folded into one rank, optionally with a
//          probation segment for blocks used once (lru_k_policy.h).
#ifndef KVCACHE_SERVER_CORE_EVICTION_POLICY_H_
#define KVCACHE_SERVER_CORE_EVICTION_POLICY_H_

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string_view>

#include "absl/functional/function_ref.h"
#include "absl/status/status.h"
#include "absl/time/time.h"
#include "server/common/clock.h"
#include "server/core/prefix_index.h"

namespace kvcache {

// Where a tracked block stands in its policy's eviction order, comparable
// across siblings (EvictionPolicy::NewSibling): the smaller goes first.
struct EvictionOrder {
  int64_t rank = 0;
  uint64_t seq = 0;
  friend bool operator<(const EvictionOrder& a, const EvictionOrder& b) {
    return a.rank != b.rank ? a.rank < b.rank : a.seq < b.seq;
  }
};

// The numbers that order sibling policies' blocks (EvictionOrder::seq):
// each policy's are increasing (its calls are serialised), and across
// siblings they follow the order the calls interleave in, without a locked
// read-modify-write on every touch (a lock-prefixed add per touch cost hits
// 5-10% on one thread): two siblings numbering at the same moment may take
// the same number, a tie the arbiter breaks either way.
class OrderSequence {
 public:
  // The next number for the policy whose last number is `*last`.
  uint64_t Next(uint64_t* last) {
    const uint64_t seen = counter_.load(std::memory_order_relaxed);
    const uint64_t n = (seen > *last ? seen : *last) + 1;
    counter_.store(n, std::memory_order_relaxed);
    *last = n;
    return n;
  }

 private:
  std::atomic<uint64_t> counter_{0};
};

class EvictionPolicy {
 public:
  virtual ~EvictionPolicy() = default;

  // REQUIRES: `node` is not tracked yet.
  virtual void Insert(IndexNode* node) = 0;
  // REQUIRES: `node` is tracked.
  virtual void Touch(IndexNode* node) = 0;
  // REQUIRES: `node` is tracked; it is not tracked afterwards.
  virtual void Erase(IndexNode* node) = 0;
  // A block moving between two tiers' policies (of the same kind): Release
  // stops tracking it without treating it as gone (no history is retained
  // for it), Adopt tracks it keeping the history its hook carries, without
  // counting a use. REQUIRES as Erase and Insert.
  virtual void Release(IndexNode* node) { Erase(node); }
  virtual void Adopt(IndexNode* node) { Insert(node); }
  // The block to evict first among those for which `evictable` is true, or
  // nullptr when there is none. Does not erase it.
  virtual IndexNode* PickVictim(absl::FunctionRef<bool(const IndexNode&)> evictable) = 0;
  // Sets the block's importance (IndexNode::set_importance: clamped to
  // [0, 1]) and re-ranks it if the policy ranks by importance. The default
  // only stores it. REQUIRES: `node` is tracked.
  virtual void SetImportance(IndexNode* node, float importance) {
    node->set_importance(importance);
  }

  // A new, empty policy with this one's settings, sharing its order: the
  // OrderOf of a block it tracks compares with this one's blocks (and with
  // every other sibling's). How the cache keeps a policy per model.
  virtual std::unique_ptr<EvictionPolicy> NewSibling() const = 0;
  // Where a tracked block stands: among siblings, the block with the
  // smallest order is the one to evict first, as PickVictim would pick it
  // had one policy tracked them all (exactly for LRU; for LRU-K up to the
  // probation segments, which each sibling keeps for its own blocks).
  // REQUIRES: `node` is tracked.
  virtual EvictionOrder OrderOf(const IndexNode& node) const = 0;

  virtual size_t size() const = 0;
  virtual std::string_view name() const = 0;
};

// Least recently used first.
std::unique_ptr<EvictionPolicy> NewLruPolicy();

// LRU-K's settings (lru_k_policy.h explains the rank they feed).
struct LruKOptions {
  // Largest K: the history a node holds.
  static constexpr int kMaxK = 4;
  // K by the append's workload hint (WorkloadKind): unspecified, chat, code,
  // document. Each in 1..kMaxK.
  int default_k = 2;
  int chat_k = 2;
  int code_k = 3;
  int document_k = 4;
  // A use within this long of the block's previous use is correlated with
  // it (one request's lookup, fetch and append; a burst of retries): it
  // refreshes the last use but adds no reference to the history.
  absl::Duration correlated_period = absl::Seconds(1);
  // How many evicted blocks' histories are kept (by IndexNode::key, least
  // recently evicted dropped first), so a block that comes back resumes its
  // history. 0 keeps none. About 80 bytes each.
  size_t retained_history = 65536;
  // Rank credit per unit of the append's priority hint and for importance
  // 1.0 (linear in importance): a block ranks as if its K-th reference were
  // this much more recent. Each in [0, 1 day].
  absl::Duration priority_step = absl::Minutes(1);
  absl::Duration importance_step = absl::Minutes(5);
  // How much older than its last use a block with fewer than K references
  // ranks, in [0, 10 years] or InfiniteDuration (such blocks always go
  // first, as in classic LRU-K). The default, 10 minutes, did better than
  // infinite on both Mooncake traces (tests/bench/README.md, "Eviction
  // policies offline"): a new block of a conversation is often reused by
  // its next turn, before it could earn a second reference.
  absl::Duration fewer_than_k_penalty = absl::Minutes(10);
  // Share of the tracked blocks kept for probation, in [0, 0.9]; 0 (the
  // default) turns it off: one segment, the rank alone decides. A block
  // stays on probation from its Insert until a second uncorrelated
  // reference (another request's use, or a retained history when it comes
  // back), unless its priority is above 0 or its importance reaches
  // kProtectImportance; PickVictim takes its victim from probation while
  // probation holds more than this share (lru_k_policy.h). No share did as
  // well as 0 in every cell on the Mooncake traces (tests/bench/README.md).
  double probation_share = 0.0;
  static constexpr float kProtectImportance = 0.5f;

  // The K of a node whose workload hint is `workload`.
  int KFor(uint8_t workload) const;
  // INVALID_ARGUMENT naming the field when one is out of range.
  absl::Status Validate() const;
};

// LRU-K (lru_k_policy.h), reading time from `clock` (not owned; it must
// outlive the policy). REQUIRES: options.Validate().ok().
std::unique_ptr<EvictionPolicy> NewLruKPolicy(const LruKOptions& options, Clock* clock);

}  // namespace kvcache

#endif  // KVCACHE_SERVER_CORE_EVICTION_POLICY_H_
