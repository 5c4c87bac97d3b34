// LruKPolicy: LRU-K eviction (O'Neil, O'Neil and Weikum, SIGMOD 1993) for the
// cache's blocks, with K chosen per block by its workload and the append's
// priority and the cache's importance folded into the same rank.
//
// History. A block's history is the times of its K most recent uncorrelated
// references: Insert and Touch are references; one that comes within
// `correlated_period` of the block's previous use (any Insert or Touch) is
// correlated with it and only refreshes the last use. K comes from the
// block's workload hint (LruKOptions: chat 2, code 3, document 4, otherwise
// default_k); at most LruKOptions::kMaxK references are remembered.
//
// Rank. The block evicted first is the one with the smallest rank, ties
// going to the least recently used (smallest last-use sequence):
//
//   rank = base + priority * priority_step + importance * importance_step
//   base = HIST(K)                        if the block has K references
//        = last_use - fewer_than_k_penalty otherwise
//
// HIST(K) is the time of the K-th most recent reference, so the smallest
// base is the largest backward K-distance. With an infinite penalty every
// block with fewer than K references goes before every block with K, least
// recently used first among them, as in classic LRU-K; a finite one (the
// default: 10 minutes) lets a recently used newcomer outrank a block whose
// K-th reference is older than last_use - penalty. `priority` is the append's
// hint (IndexNode::priority; higher is kept longer) and `importance` the
// cache's value in [0, 1] (IndexNode::importance, set through
// SetImportance); each shifts the block's rank as if it had been used that
// much later. Times are milliseconds of the injected Clock.
//
// Retained history. When a block is erased (evicted, or removed for any
// reason) its history is kept under (its IndexNode::index, its key), up to
// `retained_history` blocks (the least recently erased is forgotten first);
// a block inserted again with that key resumes it, so a block that keeps
// coming back earns its K references across evictions. The entry belongs to
// the block's own index (one (namespace, model)): another tenant's or
// model's history never ranks it, even were their chain keys to coincide.
//
// Probation (off by default: LruKOptions::probation_share = 0). With a
// share s > 0 the blocks are split in two segments, in the manner of 2Q and
// S3-FIFO: a block is on probation from its Insert while it has a single
// uncorrelated reference, until its next uncorrelated reference (a use by
// another request, outside the correlated period) moves it to the main
// segment for as long as it stays tracked. A block inserted with a retained
// history (it was evicted and came back) has at least two references and
// starts in the main segment, as does a block whose priority is above 0 or
// whose importance is at least LruKOptions::kProtectImportance (0.5), at
// Insert or when SetImportance raises it; Adopt (a block moving in from
// another tier's policy) places a block by its references the same way.
// Each segment is ordered by the rank above. PickVictim looks first in
// probation while probation holds more than s of the tracked blocks, else
// first in the main segment, and in the other segment when the first has no
// evictable block. The daemon does not use probation: on the Mooncake
// traces no share tried was at or above LRU-K alone in every cell
// (tests/bench/README.md, "Eviction policies offline").
//
// Blocks with children. Only leaves are evictable in the Cache, but a parent
// can rank before its children (its K-th reference is older than theirs,
// or they have fewer than K with a finite penalty). PickVictim sets aside
// each block with children that `evictable` rejects: it moves behind every
// other block until its next use (Insert, Touch, SetImportance) or until
// one of its children is erased, when it takes its own rank again. So for a
// predicate that rejects every block with children (the Cache's) the victim
// is exactly the lowest-ranked evictable block (of the segment PickVictim
// takes it from, with probation), and a parent is walked over once per use
// instead of once per eviction. Another predicate may see a
// set-aside block later than its rank says.
//
// Cost. The policy keeps its state in the node's policy_hook (40 bytes,
// counted with the node by Cache::NodeMetadataBytes; the segment is the top
// bit of the order's sequence number) and its order in a B-tree of node
// pointers per segment (about 12 bytes per block); Insert, Touch, Erase
// and SetImportance are O(log n); PickVictim is O(log n) amortised when the
// blocks it rejects are blocks with children (and O(n) when nothing is
// evictable, like LRU). Retained entries take about 96 bytes each (the key
// names the index too).
//
// Siblings (NewSibling: the cache's policy per model) share the retained
// histories (under a lock of their own, taken by Insert and Erase) and the
// last-use sequence, so OrderOf, (rank, seq), compares blocks of different
// siblings. Each sibling keeps its own segments.
//
// Not thread-safe, like every EvictionPolicy: the Cache serialises calls
// to each; siblings may be used at once.
#ifndef KVCACHE_SERVER_CORE_LRU_K_POLICY_H_
#define KVCACHE_SERVER_CORE_LRU_K_POLICY_H_

#include <cstdint>
#include <list>
#include <memory>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/container/btree_set.h"
#include "absl/container/flat_hash_map.h"
#include "server/common/clock.h"
#include "server/common/mutex.h"
#include "server/core/eviction_policy.h"
#include "server/core/prefix_index.h"

namespace kvcache {

class LruKPolicy final : public EvictionPolicy {
 public:
  // `clock` is not owned and must outlive the policy.
  // REQUIRES: options.Validate().ok().
  LruKPolicy(const LruKOptions& options, Clock* clock);
  LruKPolicy(const LruKPolicy&) = delete;
  LruKPolicy& operator=(const LruKPolicy&) = delete;

  void Insert(IndexNode* node) override;
  void Touch(IndexNode* node) override;
  // REQUIRES (besides the interface's): the node's parent, if any, is alive
  // (in a PrefixIndex it always is: children are removed first).
  void Erase(IndexNode* node) override;
  void Release(IndexNode* node) override;
  void Adopt(IndexNode* node) override;
  IndexNode* PickVictim(absl::FunctionRef<bool(const IndexNode&)> evictable) override;
  void SetImportance(IndexNode* node, float importance) override;
  std::unique_ptr<EvictionPolicy> NewSibling() const override;
  EvictionOrder OrderOf(const IndexNode& node) const override;
  size_t size() const override { return order_.size() + probation_.size(); }
  std::string_view name() const override { return "lru_k"; }

  // Uncorrelated references of a tracked block (its retained history
  // included), at most LruKOptions::kMaxK. REQUIRES: `node` is tracked.
  int References(const IndexNode& node) const;
  // For admission to a slower tier: whether a tracked block has been
  // referenced at least `n` times (References(node) >= n), or whether the
  // retained history of an untracked block of `index` with key `key` (one
  // erased before) holds at least `n` references. The key form knows nothing of
  // tracked blocks or of blocks whose history was dropped (false). n <= 0
  // is always true; n > kMaxK always false (no more is remembered).
  bool SeenAtLeast(const IndexNode& node, int n) const;
  bool SeenAtLeast(const PrefixIndex* index, uint64_t key, int n) const;
  // Histories of erased blocks held now by this policy and its siblings
  // (<= options.retained_history).
  size_t retained_size() const;
  // Tracked blocks on probation now (0 when options.probation_share is 0).
  size_t probation_size() const { return probation_.size(); }

 private:
  // A retained history's owner: the block's index and chain key.
  using RetainedKey = std::pair<const PrefixIndex*, uint64_t>;
  struct Retained {
    RetainedKey key;
    int64_t last_ms;
    uint32_t history_age_ms[LruKOptions::kMaxK];
  };
  // B-tree order: (rank, seq) read from the nodes' hooks.
  struct ByRank {
    bool operator()(const IndexNode* a, const IndexNode* b) const {
      const IndexNode::PolicyHook::Order& x = a->policy_hook.order;
      const IndexNode::PolicyHook::Order& y = b->policy_hook.order;
      return x.rank != y.rank ? x.rank < y.rank : x.seq < y.seq;
    }
  };

  using Order = absl::btree_set<IndexNode*, ByRank>;

  // What siblings share: the last-use sequence and the retained histories,
  // most recently erased first, and by (index, key).
  struct Shared {
    OrderSequence seq;
    Mutex mu;
    std::list<Retained> retained ABSL_GUARDED_BY(mu);
    absl::flat_hash_map<RetainedKey, std::list<Retained>::iterator> by_key ABSL_GUARDED_BY(mu);
  };
  LruKPolicy(const LruKOptions& options, Clock* clock, std::shared_ptr<Shared> shared);

  int64_t NowMs() const;
  // The main segment's mark in PolicyHook::Order::seq (constant within a
  // segment, so it does not change the order).
  static constexpr uint64_t kMainBit = uint64_t{1} << 63;
  static bool InMain(const IndexNode& node) { return node.policy_hook.order.seq & kMainBit; }
  // Whether priority or importance keep the node off probation.
  bool Hinted(const IndexNode& node) const;
  // Adds a use at `now_ms` to the node's history (correlated or not).
  // Returns whether it was an uncorrelated reference.
  bool Reference(IndexNode::PolicyHook& hook, int64_t now_ms) const;
  int64_t Rank(const IndexNode& node) const;
  // Sets the node's order key (a new last-use sequence when `used`) and
  // puts it in its segment. REQUIRES: the node is in neither segment.
  // In the main segment when `main`, probation is off, or Hinted(node).
  void Place(IndexNode* node, bool used, bool main);
  // Takes the node out of whichever segment holds it; false if none does.
  bool Unplace(IndexNode* node);
  // PickVictim's two passes over one segment: the lowest-ranked evictable
  // block, setting aside the blocks with children it walks over; then the
  // set-aside blocks.
  IndexNode* PickRanked(Order& segment, absl::FunctionRef<bool(const IndexNode&)> evictable);
  IndexNode* PickSetAside(Order& segment, absl::FunctionRef<bool(const IndexNode&)> evictable);
  void Retain(const IndexNode& node);

  const LruKOptions options_;
  Clock* const clock_;
  const int64_t correlated_ms_;
  const int64_t priority_step_ms_;
  const int64_t importance_step_ms_;
  const int64_t penalty_ms_;  // what a block with fewer than K references loses
  const std::shared_ptr<Shared> shared_;
  uint64_t last_seq_ = 0;            // this policy's last number from shared_->seq
  Order order_;                      // the main segment (everything when probation is off)
  Order probation_;                  // blocks on probation
  std::vector<IndexNode*> blocked_;  // PickVictim's scratch
};

}  // namespace kvcache

#endif  // KVCACHE_SERVER_CORE_LRU_K_POLICY_H_
