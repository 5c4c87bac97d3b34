// PrefixIndex: a radix tree over the token blocks of one (namespace, model).
//
// Every node is one block of `block_tokens` tokens; the path from the root to
// a node spells the token prefix whose KV the node's payload holds. A node
// per block is the path compression this index needs: an edge already spans
// a whole block (16..1024 tokens), and per-block nodes let eviction trim a
// branch one block at a time.
//
// Finding a node does not walk the tree. Each node has a lookup hash chained
// over its whole prefix (BlockHashes), and the index keeps one hash map from
// lookup hash to node. A match looks every block of a prompt up in that map
// at once (the look-ups do not depend on each other, so their cache misses
// overlap instead of chasing 512 pointers one after the other), then checks
// each candidate: its parent must be the block matched before it and its
// tokens must equal the prompt's. So a hash collision can only cost a cache
// miss (or leave a block uncached), never return another prefix's KV. The
// hashes need no index: callers compute them before taking a lock.
//
// A node's tokens sit in the same allocation, right after it. Children are
// a list threaded through their nodes (for removal and traversal only).
// Besides its lookup hash each node carries `key`, the block's identity in
// the API, chained over its prefix the same way. Both are keyed hashes of the
// index's (namespace, model) (block_hasher.h): without the daemon's secret
// nobody can compute them, and the same tokens hash differently in every
// (namespace, model).
//
// Not thread-safe: the owning Cache serialises access. Node pointers stay valid
// until the node is removed.
#ifndef KVCACHE_SERVER_CORE_PREFIX_INDEX_H_
#define KVCACHE_SERVER_CORE_PREFIX_INDEX_H_

#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/functional/function_ref.h"
#include "absl/time/time.h"
#include "server/core/block.h"
#include "server/core/block_hasher.h"
#include "server/core/layout.h"
#include "server/core/lower_copies.h"
#include "server/core/tier.h"
#include "server/core/token_state.h"

namespace kvcache {

class PrefixIndex;
class EvictionPolicy;

// The lookup hashes of the whole blocks of a token sequence, for an index of
// `block_tokens`-token blocks hashing with `hasher`: hashes[i] covers
// tokens[0 .. (i+1)*block_tokens).
struct BlockHashes {
  uint32_t block_tokens = 0;
  std::shared_ptr<const BlockHasher> hasher;
  std::vector<uint64_t> hashes;

  // REQUIRES: block_tokens > 0, hasher != nullptr.
  static BlockHashes Of(std::shared_ptr<const BlockHasher> hasher, uint32_t block_tokens,
                        std::span<const Token> tokens);
};

// A cached block. The fields a lookup reads or writes come first, in the
// node's first two cache lines (a node is 64-byte aligned); its tokens follow
// the node in the same allocation.
//
// A block lives in host memory (`payload`), in the levels below it (`lower`,
// one slot per level: lower_copies.h), or in several (a host copy of a block
// also on SSD is clean: dropping it needs no write). At least one copy is
// set. (A copy in the GPU tier, when a block has one, is kept by the cache
// apart from the node: device_copies.h.)
struct IndexNode {
  IndexNode* parent = nullptr;  // nullptr for a first block
  BlockRef payload;             // the host copy, or null
  uint64_t key = 0;             // chained over tokens[0 .. (depth+1)*block_tokens)
  uint32_t depth = 0;           // block index in the sequence
  uint32_t num_children = 0;
  // Owned by the cache's EvictionPolicy; each policy uses its own members
  // and only while it tracks the node. 40 bytes.
  struct PolicyHook {
    // LRU: the recency list's links (null while untracked).
    struct List {
      IndexNode* prev;
      IndexNode* next;
    };
    // LRU-K: the node's eviction order key (rank, then last-use sequence).
    struct Order {
      int64_t rank;
      uint64_t seq;
    };
    union {
      List list{nullptr, nullptr};
      Order order;
    };
    // LRU-K reference history, in milliseconds: the last use, and how long
    // before it the 1st..4th most recent uncorrelated references were
    // (kNoReference: fewer references). LRU keeps the number of the
    // block's last use in last_ms (its order across sibling policies).
    int64_t last_ms = 0;
    uint32_t history_age_ms[4] = {};
    static constexpr uint32_t kNoReference = ~uint32_t{0};
  } policy_hook;
  PrefixIndex* index = nullptr;  // the tree this node belongs to
  // Hints from the append that stored the block (read by policies).
  absl::Time expires = absl::InfiniteFuture();
  // When a lookup, fetch, append or attention report last used the block.
  absl::Time last_access = absl::InfinitePast();
  uint64_t lookup_hash = 0;  // BlockHashes entry of this block: its key in the index's map
  // Metadata bytes the owning cache counted for this node (its budget).
  uint64_t metadata_bytes = 0;
  int32_t priority = 0;
  uint8_t workload = 0;
  // Whether the cache's eviction policy tracks the block yet (in the padding
  // after workload). A commit that shares the cache's lock does not insert
  // its new blocks itself: the first touch of each does (Cache::TouchLocked).
  bool in_policy = false;
  // Lookups, fetches and appends that used the block (saturating); the lower
  // tier's admission gate reads it.
  uint16_t references = 0;
  LowerCopies lower;  // the copies below host memory, one slot per level

  bool is_leaf() const { return num_children == 0; }
  bool in_host() const { return payload != nullptr; }
  // The seal of the block, from whichever copy it has.
  // Valid while that copy is the node's.
  const BlockSeal& seal() const {
    return payload != nullptr ? payload->seal() : lower.top_copy()->seal();
  }
  // How much the cache values the block, in [0, 1] (0 until set); stored in
  // 16 bits. Policies that rank by it must be told when it changes
  // (EvictionPolicy::SetImportance), so set it through the policy while the
  // node is tracked.
  float importance() const { return static_cast<float>(importance_) / kImportanceScale; }
  void set_importance(float importance) {
    const float clamped = importance > 0 ? (importance < 1 ? importance : 1) : 0;
    importance_ = static_cast<uint16_t>(clamped * kImportanceScale + 0.5f);
  }
  // Per-token importance inputs and the block's precision (token_state.h);
  // an empty state until something is set (most blocks of a model that does
  // not compress never have any, and pay 8 bytes for it).
  const BlockTokenState& tokens_state() const {
    return token_state_ != nullptr ? *token_state_ : kNoTokenState;
  }
  BlockTokenState& mutable_tokens_state() {
    if (token_state_ == nullptr) token_state_ = std::make_unique<BlockTokenState>();
    return *token_state_;
  }
  bool has_tokens_state() const { return token_state_ != nullptr; }
  // This block's tokens (stored right after the node). Not for the index's root.
  std::span<const Token> tokens() const;

  // The first bytes of a node that a lookup touches.
  static constexpr size_t kHotBytes = 128;

 private:
  friend class PrefixIndex;
  static constexpr float kImportanceScale = 65535.0f;
  uint16_t importance_ = 0;  // importance() * kImportanceScale, in the padding after workload
  static const BlockTokenState kNoTokenState;
  std::unique_ptr<BlockTokenState> token_state_;
  // Children: a doubly linked list of siblings.
  IndexNode* first_child_ = nullptr;
  IndexNode* prev_sibling_ = nullptr;
  IndexNode* next_sibling_ = nullptr;
};

class PrefixIndex {
 public:
  // An index whose hashes are `hasher`'s (the unkeyed one by default: tests).
  explicit PrefixIndex(uint32_t block_tokens,
                       std::shared_ptr<const BlockHasher> hasher = BlockHasher::Unkeyed());
  ~PrefixIndex();
  PrefixIndex(const PrefixIndex&) = delete;
  PrefixIndex& operator=(const PrefixIndex&) = delete;

  uint32_t block_tokens() const { return block_tokens_; }
  uint64_t num_blocks() const { return nodes_.size(); }
  // The hasher of this index's lookup hashes and chain keys (immutable:
  // callers may keep it and hash without the owner's lock).
  const std::shared_ptr<const BlockHasher>& hasher() const { return hasher_; }
  // The policy that ranks this index's blocks while they are in host memory
  // (its model's: Cache::PolicyFor), set by the owner; not owned.
  EvictionPolicy* host_policy() const { return host_policy_; }
  void set_host_policy(EvictionPolicy* policy) { host_policy_ = policy; }

  // Appends to `path` the nodes of the longest cached prefix of `tokens`
  // (whole blocks only), from the first block on. `hashes` are
  // BlockHashes::Of(hasher(), block_tokens(), tokens); if they are for
  // another block size or hasher, Match hashes again itself.
  void Match(std::span<const Token> tokens, const BlockHashes& hashes,
             std::vector<IndexNode*>* path) const;
  // The same, hashing `tokens` itself.
  void Match(std::span<const Token> tokens, std::vector<IndexNode*>* path) const;

  // The child of `parent` (nullptr: the root) whose tokens are `block`, or
  // nullptr. REQUIRES: block.size() == block_tokens().
  IndexNode* FindChild(const IndexNode* parent, std::span<const Token> block) const;

  // The node whose lookup hash is `lookup_hash`, or nullptr: how a caller
  // that let go of the lock finds a node again without keeping a pointer
  // that may dangle.
  IndexNode* FindByLookupHash(uint64_t lookup_hash) const {
    auto it = nodes_.find(lookup_hash);
    return it == nodes_.end() ? nullptr : it->second;
  }

  // Adds a child of `parent` (nullptr: the root) for `block` holding `payload`.
  // Returns nullptr without inserting when a child with the same tokens
  // exists, or when another node has the same lookup hash (a collision; the
  // block is then simply not cached).
  // REQUIRES: block.size() == block_tokens(), payload != nullptr.
  IndexNode* AddChild(IndexNode* parent, std::span<const Token> block, BlockRef payload);

  // Removes `node` and every node below it, calling `on_remove` for each
  // (children before parents) before it is destroyed.
  void RemoveSubtree(IndexNode* node, absl::FunctionRef<void(IndexNode*)> on_remove);

  // Removes every node, calling `on_remove` for each.
  void Clear(absl::FunctionRef<void(IndexNode*)> on_remove);

  // Calls `visit` for every node, children before their parent. `visit` must
  // not add or remove nodes.
  void VisitPostOrder(absl::FunctionRef<void(IndexNode*)> visit) const;
  // The same for `node` and the nodes below it only.
  void VisitSubtree(const IndexNode* node, absl::FunctionRef<void(IndexNode*)> visit) const;
  // Calls `visit` for each child of `parent` (nullptr: each first block).
  // `visit` must not add or remove nodes.
  void VisitChildren(const IndexNode* parent, absl::FunctionRef<void(IndexNode*)> visit) const;

  // A walk that its owner takes in steps, letting go of the lock between
  // them, while others add and remove nodes: how the cache inspects, counts
  // and checkpoints a million blocks without holding its lock for the whole
  // tree. Parents come before their children (pre-order). A node present
  // for the whole walk is visited exactly once; one added or removed during
  // it may or may not be. Removing the node the walk would visit next moves
  // the walk on to the node after it (the index tells its open cursors).
  //
  // Like the index, not thread-safe: create, Step and destroy a cursor under
  // the lock that guards its index. A cursor may outlive its index (it is
  // then done).
  class Cursor {
   public:
    // Walks `top` and the nodes below it (top == nullptr: every node), down
    // to `max_depth` levels below `top` (0: `top` alone; with top == nullptr,
    // 0 is the first blocks alone).
    static constexpr uint32_t kAllDepths = ~uint32_t{0};
    explicit Cursor(const PrefixIndex* index, const IndexNode* top = nullptr,
                    uint32_t max_depth = kAllDepths);
    ~Cursor();
    Cursor(const Cursor&) = delete;
    Cursor& operator=(const Cursor&) = delete;

    // Calls `visit` for up to `max_nodes` further nodes; returns how many.
    // `visit` must not add or remove nodes.
    size_t Step(size_t max_nodes, absl::FunctionRef<void(IndexNode*)> visit);
    bool done() const { return next_ == nullptr; }
    // The index walked, or nullptr once it is gone.
    const PrefixIndex* index() const { return index_; }

   private:
    friend class PrefixIndex;
    // The node after `n` in this walk; below `n` only when `descend`.
    IndexNode* After(const IndexNode* n, bool descend) const;

    const PrefixIndex* index_;
    const IndexNode* top_;  // nullptr: the whole index
    uint32_t base_depth_;   // depth of the walk's first level
    uint32_t max_depth_;
    IndexNode* next_ = nullptr;  // the next node to visit; nullptr: done
  };

  // Chained key of a block given its parent's key (0 for the first block).
  uint64_t ChainKey(uint64_t parent_key, std::span<const Token> block) const {
    return hasher_->ChainKey(parent_key, block);
  }
  // Lookup hash of a block given its parent's (0 for the first block).
  uint64_t LookupHash(uint64_t parent_hash, std::span<const Token> block) const {
    return hasher_->LookupHash(parent_hash, block);
  }

 private:
  IndexNode* NewNode(std::span<const Token> block);
  static void DeleteNode(IndexNode* node);
  // Takes `node` out of its parent's child list.
  void Unlink(IndexNode* node);
  // Visits the nodes of `order` and every node below them, children first.
  static void VisitBelow(std::vector<IndexNode*> order, absl::FunctionRef<void(IndexNode*)> visit);

  const uint32_t block_tokens_;
  const std::shared_ptr<const BlockHasher> hasher_;
  EvictionPolicy* host_policy_ = nullptr;
  // Holds the first blocks as its children; no block of its own.
  IndexNode root_;
  // Every node, by lookup hash. The index owns the nodes.
  absl::flat_hash_map<uint64_t, IndexNode*> nodes_;
  // The walks in progress (usually none); told of every removal.
  mutable std::vector<Cursor*> cursors_;
};

inline std::span<const Token> IndexNode::tokens() const {
  // The node was allocated with room for block_tokens() tokens after it.
  return {reinterpret_cast<const Token*>(this + 1), index->block_tokens()};
}

}  // namespace kvcache

#endif  // KVCACHE_SERVER_CORE_PREFIX_INDEX_H_
