#include "server/core/prefix_index.h"

#include <algorithm>
#include <cstring>
#include <new>
#include <utility>

namespace kvcache {
namespace {

bool SameTokens(const IndexNode& node, std::span<const Token> block) {
  const std::span<const Token> mine = node.tokens();
  return mine.size() == block.size() &&
         std::memcmp(mine.data(), block.data(), block.size_bytes()) == 0;
}

constexpr size_t kCacheLine = 64;

// Brings what a lookup reads of a node towards the CPU before it is needed:
// the first bytes of the node (IndexNode::kHotBytes) and its `token_bytes`.
void Prefetch(const IndexNode* node, size_t token_bytes) {
  const char* p = reinterpret_cast<const char*>(node);
  for (size_t i = 0; i < IndexNode::kHotBytes; i += kCacheLine) __builtin_prefetch(p + i);
  p = reinterpret_cast<const char*>(node + 1);
  for (size_t i = 0; i < token_bytes; i += kCacheLine) __builtin_prefetch(p + i);
}

// How far ahead Match prefetches map slots and nodes.
constexpr size_t kPrefetchDistance = 8;

}  // namespace

const BlockTokenState IndexNode::kNoTokenState;

BlockHashes BlockHashes::Of(std::shared_ptr<const BlockHasher> hasher, uint32_t block_tokens,
                            std::span<const Token> tokens) {
  BlockHashes out{.block_tokens = block_tokens, .hasher = std::move(hasher)};
  out.hashes.resize(tokens.size() / block_tokens);
  uint64_t h = 0;
  for (size_t b = 0; b < out.hashes.size(); ++b) {
    h = out.hasher->LookupHash(h, tokens.subspan(b * block_tokens, block_tokens));
    out.hashes[b] = h;
  }
  return out;
}

PrefixIndex::PrefixIndex(uint32_t block_tokens, std::shared_ptr<const BlockHasher> hasher)
    : block_tokens_(block_tokens), hasher_(std::move(hasher)) {
  root_.index = this;
}

PrefixIndex::~PrefixIndex() {
  for (Cursor* c : cursors_) {
    c->index_ = nullptr;
    c->top_ = nullptr;
    c->next_ = nullptr;
  }
  cursors_.clear();
  Clear([](IndexNode*) {});
}

IndexNode* PrefixIndex::NewNode(std::span<const Token> block) {
  void* memory =
      ::operator new (sizeof(IndexNode) + block.size_bytes(), std::align_val_t{kCacheLine});
  auto* node = new (memory) IndexNode();
  node->index = this;
  std::memcpy(static_cast<void*>(node + 1), block.data(), block.size_bytes());
  return node;
}

void PrefixIndex::DeleteNode(IndexNode* node) {
  node->~IndexNode();
  ::operator delete (static_cast<void*>(node), std::align_val_t{kCacheLine});
}

IndexNode* PrefixIndex::FindChild(const IndexNode* parent, std::span<const Token> block) const {
  auto it = nodes_.find(LookupHash(parent == nullptr ? 0 : parent->lookup_hash, block));
  if (it == nodes_.end()) return nullptr;
  IndexNode* child = it->second;
  return child->parent == parent && SameTokens(*child, block) ? child : nullptr;
}

void PrefixIndex::Match(std::span<const Token> tokens, std::vector<IndexNode*>* path) const {
  Match(tokens, BlockHashes::Of(hasher_, block_tokens_, tokens), path);
}

void PrefixIndex::Match(std::span<const Token> tokens, const BlockHashes& hashes,
                        std::vector<IndexNode*>* path) const {
  if (hashes.block_tokens != block_tokens_ || hashes.hasher != hasher_) {
    Match(tokens, BlockHashes::Of(hasher_, block_tokens_, tokens), path);
    return;
  }
  const std::vector<uint64_t>& h = hashes.hashes;
  const size_t n = std::min(h.size(), tokens.size() / block_tokens_);
  const size_t first = path->size();
  // Candidates: every block's node by its hash. The look-ups are independent,
  // so the CPU overlaps their misses; the slots are prefetched ahead.
  for (size_t i = 0; i < std::min(n, kPrefetchDistance); ++i) nodes_.prefetch(h[i]);
  for (size_t i = 0; i < n; ++i) {
    if (i + kPrefetchDistance < n) nodes_.prefetch(h[i + kPrefetchDistance]);
    auto it = nodes_.find(h[i]);
    if (it == nodes_.end()) break;
    path->push_back(it->second);
  }
  // Each candidate must be the child of the block before it and hold the
  // prompt's tokens; the path ends before the first that is not.
  const size_t found = path->size() - first;
  const size_t token_bytes = block_tokens_ * sizeof(Token);
  for (size_t i = 0; i < std::min(found, kPrefetchDistance); ++i) {
    Prefetch((*path)[first + i], token_bytes);
  }
  const IndexNode* parent = nullptr;
  size_t i = 0;
  for (; i < found; ++i) {
    if (i + kPrefetchDistance < found) {
      Prefetch((*path)[first + i + kPrefetchDistance], token_bytes);
    }
    const IndexNode* node = (*path)[first + i];
    if (node->parent != parent ||
        !SameTokens(*node, tokens.subspan(i * block_tokens_, block_tokens_))) {
      break;
    }
    parent = node;
  }
  path->resize(first + i);
}

IndexNode* PrefixIndex::AddChild(IndexNode* parent, std::span<const Token> block,
                                 BlockRef payload) {
  IndexNode* holder = parent == nullptr ? &root_ : parent;
  const uint64_t lookup_hash = LookupHash(parent == nullptr ? 0 : parent->lookup_hash, block);
  auto [slot, inserted] = nodes_.try_emplace(lookup_hash, nullptr);
  if (!inserted) return nullptr;  // the same block, or a collision

  IndexNode* node = NewNode(block);
  node->parent = parent;
  node->key = ChainKey(parent == nullptr ? 0 : parent->key, block);
  node->lookup_hash = lookup_hash;
  node->depth = parent == nullptr ? 0 : parent->depth + 1;
  node->payload = std::move(payload);
  slot->second = node;

  node->next_sibling_ = holder->first_child_;
  if (holder->first_child_ != nullptr) holder->first_child_->prev_sibling_ = node;
  holder->first_child_ = node;
  ++holder->num_children;
  return node;
}

void PrefixIndex::Unlink(IndexNode* node) {
  IndexNode* holder = node->parent == nullptr ? &root_ : node->parent;
  if (node->prev_sibling_ != nullptr) {
    node->prev_sibling_->next_sibling_ = node->next_sibling_;
  } else {
    holder->first_child_ = node->next_sibling_;
  }
  if (node->next_sibling_ != nullptr) node->next_sibling_->prev_sibling_ = node->prev_sibling_;
  node->prev_sibling_ = node->next_sibling_ = nullptr;
  --holder->num_children;
}

void PrefixIndex::RemoveSubtree(IndexNode* node, absl::FunctionRef<void(IndexNode*)> on_remove) {
  // Iterative, so a deep chain cannot overflow the stack: `order` lists
  // parents before children, and is removed from the back.
  std::vector<IndexNode*> order = {node};
  for (size_t i = 0; i < order.size(); ++i) {
    for (IndexNode* c = order[i]->first_child_; c != nullptr; c = c->next_sibling_) {
      order.push_back(c);
    }
  }
  for (auto it = order.rbegin(); it != order.rend(); ++it) {
    IndexNode* n = *it;
    on_remove(n);  // its children are gone already; its parent is still there
    for (Cursor* c : cursors_) {
      if (c->top_ == n) {
        c->next_ = nullptr;  // the walk's whole subtree is going
      } else if (c->next_ == n) {
        c->next_ = c->After(n, /*descend=*/false);  // n is a leaf by now
      }
    }
    Unlink(n);
    nodes_.erase(n->lookup_hash);
    DeleteNode(n);
  }
}

void PrefixIndex::Clear(absl::FunctionRef<void(IndexNode*)> on_remove) {
  while (root_.first_child_ != nullptr) RemoveSubtree(root_.first_child_, on_remove);
}

void PrefixIndex::VisitPostOrder(absl::FunctionRef<void(IndexNode*)> visit) const {
  std::vector<IndexNode*> order;
  order.reserve(nodes_.size());
  for (IndexNode* c = root_.first_child_; c != nullptr; c = c->next_sibling_) order.push_back(c);
  VisitBelow(std::move(order), visit);
}

void PrefixIndex::VisitSubtree(const IndexNode* node,
                               absl::FunctionRef<void(IndexNode*)> visit) const {
  VisitBelow({const_cast<IndexNode*>(node)}, visit);
}

void PrefixIndex::VisitChildren(const IndexNode* parent,
                                absl::FunctionRef<void(IndexNode*)> visit) const {
  for (IndexNode* c = (parent != nullptr ? parent : &root_)->first_child_; c != nullptr;
       c = c->next_sibling_) {
    visit(c);
  }
}

PrefixIndex::Cursor::Cursor(const PrefixIndex* index, const IndexNode* top, uint32_t max_depth)
    : index_(index),
      top_(top),
      base_depth_(top == nullptr ? 0 : top->depth),
      max_depth_(max_depth) {
  next_ = top != nullptr ? const_cast<IndexNode*>(top) : index->root_.first_child_;
  index_->cursors_.push_back(this);
}

PrefixIndex::Cursor::~Cursor() {
  if (index_ == nullptr) return;
  std::vector<Cursor*>& open = index_->cursors_;
  open.erase(std::find(open.begin(), open.end(), this));
}

IndexNode* PrefixIndex::Cursor::After(const IndexNode* n, bool descend) const {
  if (descend && n->first_child_ != nullptr && n->depth - base_depth_ < max_depth_) {
    return n->first_child_;
  }
  // The next sibling of `n` or of its nearest ancestor that has one, never
  // leaving the walk's subtree.
  while (n != top_ && n != nullptr) {
    if (n->next_sibling_ != nullptr) return n->next_sibling_;
    n = n->parent;
  }
  return nullptr;
}

size_t PrefixIndex::Cursor::Step(size_t max_nodes, absl::FunctionRef<void(IndexNode*)> visit) {
  size_t visited = 0;
  while (next_ != nullptr && visited < max_nodes) {
    IndexNode* n = next_;
    visit(n);
    next_ = After(n, /*descend=*/true);
    ++visited;
  }
  return visited;
}

void PrefixIndex::VisitBelow(std::vector<IndexNode*> order,
                             absl::FunctionRef<void(IndexNode*)> visit) {
  // Iterative: parents are pushed to `order` before their children.
  for (size_t i = 0; i < order.size(); ++i) {
    for (IndexNode* c = order[i]->first_child_; c != nullptr; c = c->next_sibling_) {
      order.push_back(c);
    }
  }
  for (auto it = order.rbegin(); it != order.rend(); ++it) visit(*it);
}

}  // namespace kvcache
