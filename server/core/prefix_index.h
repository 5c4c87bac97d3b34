// PrefixIndex: a radix tree over the token blocks of one (namespace, model).
//
// Every node is one block of `block_tokens` tokens; the path from the root to
// a node spells the token prefix whose KV the node's payload holds. A node's
// children are found by their block's tokens: the first four live inline in
// the node, more move to a hash map keyed by the hash of the child's tokens.
// Lookups compare the tokens themselves, so a hash collision can only cost a
// cache miss, never return another prefix's KV. Each node also carries a key
// chained over the whole prefix (XXH3 of its tokens seeded with its parent's
// key), the block's identity in the API.
//
// A node per block is the path compression this index needs: an edge already
// spans a whole block (16..1024 tokens), and per-block nodes let eviction
// trim a branch one block at a time.
//
// Not thread-safe: the owning Cache serialises access. Node pointers stay valid
// until the node is removed.
#ifndef KVCACHE_SERVER_CORE_PREFIX_INDEX_H_
#define KVCACHE_SERVER_CORE_PREFIX_INDEX_H_

#include <array>
#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/functional/function_ref.h"
#include "absl/time/time.h"
#include "server/core/block.h"
#include "server/core/layout.h"
#include "server/core/token_state.h"

namespace kvcache {

class PrefixIndex;

struct IndexNode {
  PrefixIndex* index = nullptr;  // the tree this node belongs to
  IndexNode* parent = nullptr;   // nullptr for a first block
  uint64_t key = 0;              // chained over tokens[0 .. (depth+1)*block_tokens)
  uint64_t tokens_hash = 0;      // hash of this block's own tokens
  uint32_t depth = 0;            // block index in the sequence
  std::vector<Token> tokens;     // this block's tokens
  BlockRef payload;
  // Hints from the append that stored the block (read by policies).
  absl::Time expires = absl::InfiniteFuture();
  int32_t priority = 0;
  uint8_t workload = 0;
  // When a lookup, fetch, append or attention report last used the block.
  absl::Time last_access = absl::InfinitePast();
  // Per-token importance inputs and the block's precision (token_state.h).
  BlockTokenState tokens_state;
  // Metadata bytes the owning cache counted for this node (its budget).
  uint64_t metadata_bytes = 0;

  bool is_leaf() const { return num_children == 0; }

  // Children: inline first, then a map.
  static constexpr int kInlineChildren = 4;
  uint32_t num_children = 0;
  std::array<std::unique_ptr<IndexNode>, kInlineChildren> inline_children;
  std::unique_ptr<absl::flat_hash_map<uint64_t, std::unique_ptr<IndexNode>>> child_map;
};

class PrefixIndex {
 public:
  explicit PrefixIndex(uint32_t block_tokens);
  ~PrefixIndex();
  PrefixIndex(const PrefixIndex&) = delete;
  PrefixIndex& operator=(const PrefixIndex&) = delete;

  uint32_t block_tokens() const { return block_tokens_; }
  uint64_t num_blocks() const { return num_blocks_; }

  // Appends to `path` the nodes of the longest cached prefix of `tokens`
  // (whole blocks only), from the first block on.
  void Match(std::span<const Token> tokens, std::vector<IndexNode*>* path) const;

  // The child of `parent` (nullptr: the root) whose tokens are `block`, or
  // nullptr. REQUIRES: block.size() == block_tokens().
  IndexNode* FindChild(const IndexNode* parent, std::span<const Token> block) const;

  // Adds a child of `parent` (nullptr: the root) for `block` holding `payload`.
  // Returns nullptr without inserting when a child with the same tokens
  // exists, or when another child has the same token hash (a collision; the
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

  // Chained key of a block given its parent's key (0 for the first block).
  static uint64_t ChainKey(uint64_t parent_key, std::span<const Token> block);

 private:
  // The tree hangs from a sentinel root node that holds no block.
  IndexNode* ChildOf(const IndexNode* parent, uint64_t tokens_hash) const;
  std::unique_ptr<IndexNode> Detach(IndexNode* node);
  void DestroySubtree(std::unique_ptr<IndexNode> node,
                      absl::FunctionRef<void(IndexNode*)> on_remove);

  const uint32_t block_tokens_;
  IndexNode root_;
  uint64_t num_blocks_ = 0;
};

}  // namespace kvcache

#endif  // KVCACHE_SERVER_CORE_PREFIX_INDEX_H_
