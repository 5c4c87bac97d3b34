#include "server/core/prefix_index.h"

#include <xxhash.h>

#include <algorithm>
#include <utility>

namespace kvcache {
namespace {

uint64_t HashTokens(std::span<const Token> block, uint64_t seed) {
  return XXH3_64bits_withSeed(block.data(), block.size_bytes(), seed);
}

bool SameTokens(const IndexNode& node, std::span<const Token> block) {
  return std::equal(node.tokens.begin(), node.tokens.end(), block.begin(), block.end());
}

}  // namespace

PrefixIndex::PrefixIndex(uint32_t block_tokens) : block_tokens_(block_tokens) {
  root_.index = this;
}

PrefixIndex::~PrefixIndex() {
  Clear([](IndexNode*) {});
}

uint64_t PrefixIndex::ChainKey(uint64_t parent_key, std::span<const Token> block) {
  return HashTokens(block, parent_key);
}

IndexNode* PrefixIndex::ChildOf(const IndexNode* parent, uint64_t tokens_hash) const {
  if (parent == nullptr) parent = &root_;
  if (parent->child_map != nullptr) {
    auto it = parent->child_map->find(tokens_hash);
    return it == parent->child_map->end() ? nullptr : it->second.get();
  }
  for (uint32_t i = 0; i < parent->num_children; ++i) {
    if (parent->inline_children[i]->tokens_hash == tokens_hash) {
      return parent->inline_children[i].get();
    }
  }
  return nullptr;
}

IndexNode* PrefixIndex::FindChild(const IndexNode* parent, std::span<const Token> block) const {
  IndexNode* child = ChildOf(parent, HashTokens(block, 0));
  return child != nullptr && SameTokens(*child, block) ? child : nullptr;
}

void PrefixIndex::Match(std::span<const Token> tokens, std::vector<IndexNode*>* path) const {
  const IndexNode* node = nullptr;
  for (size_t pos = 0; pos + block_tokens_ <= tokens.size(); pos += block_tokens_) {
    IndexNode* child = FindChild(node, tokens.subspan(pos, block_tokens_));
    if (child == nullptr) return;
    path->push_back(child);
    node = child;
  }
}

IndexNode* PrefixIndex::AddChild(IndexNode* parent, std::span<const Token> block,
                                 BlockRef payload) {
  IndexNode* holder = parent == nullptr ? &root_ : parent;
  const uint64_t tokens_hash = HashTokens(block, 0);
  if (ChildOf(holder, tokens_hash) != nullptr) return nullptr;

  auto node = std::make_unique<IndexNode>();
  node->index = this;
  node->parent = parent;
  node->key = ChainKey(parent == nullptr ? 0 : parent->key, block);
  node->tokens_hash = tokens_hash;
  node->depth = parent == nullptr ? 0 : parent->depth + 1;
  node->tokens.assign(block.begin(), block.end());
  node->payload = std::move(payload);
  IndexNode* raw = node.get();

  if (holder->child_map == nullptr && holder->num_children == IndexNode::kInlineChildren) {
    // Grow from inline slots into a map.
    holder->child_map =
        std::make_unique<absl::flat_hash_map<uint64_t, std::unique_ptr<IndexNode>>>();
    for (auto& child : holder->inline_children) {
      uint64_t h = child->tokens_hash;
      holder->child_map->emplace(h, std::move(child));
    }
  }
  if (holder->child_map != nullptr) {
    holder->child_map->emplace(tokens_hash, std::move(node));
  } else {
    holder->inline_children[holder->num_children] = std::move(node);
  }
  ++holder->num_children;
  ++num_blocks_;
  return raw;
}

std::unique_ptr<IndexNode> PrefixIndex::Detach(IndexNode* node) {
  IndexNode* holder = node->parent == nullptr ? &root_ : node->parent;
  std::unique_ptr<IndexNode> owned;
  if (holder->child_map != nullptr) {
    auto it = holder->child_map->find(node->tokens_hash);
    owned = std::move(it->second);
    holder->child_map->erase(it);
  } else {
    auto* begin = holder->inline_children.begin();
    auto* end = begin + holder->num_children;
    auto* it = std::find_if(begin, end, [node](const auto& c) { return c.get() == node; });
    owned = std::move(*it);
    std::move(it + 1, end, it);  // keep the inline slots dense
  }
  --holder->num_children;
  return owned;
}

void PrefixIndex::DestroySubtree(std::unique_ptr<IndexNode> node,
                                 absl::FunctionRef<void(IndexNode*)> on_remove) {
  // Iterative post-order so a deep chain cannot overflow the stack.
  std::vector<std::unique_ptr<IndexNode>> stack;
  std::vector<std::unique_ptr<IndexNode>> order;
  stack.push_back(std::move(node));
  while (!stack.empty()) {
    std::unique_ptr<IndexNode> n = std::move(stack.back());
    stack.pop_back();
    if (n->child_map != nullptr) {
      for (auto& [h, child] : *n->child_map) stack.push_back(std::move(child));
      n->child_map.reset();
    } else {
      for (uint32_t i = 0; i < n->num_children; ++i) {
        stack.push_back(std::move(n->inline_children[i]));
      }
    }
    n->num_children = 0;
    order.push_back(std::move(n));
  }
  // `order` lists parents before children; report children first.
  for (auto it = order.rbegin(); it != order.rend(); ++it) {
    on_remove(it->get());
    --num_blocks_;
  }
}

void PrefixIndex::RemoveSubtree(IndexNode* node, absl::FunctionRef<void(IndexNode*)> on_remove) {
  DestroySubtree(Detach(node), on_remove);
}

void PrefixIndex::Clear(absl::FunctionRef<void(IndexNode*)> on_remove) {
  while (root_.num_children > 0) {
    IndexNode* first = root_.child_map != nullptr ? root_.child_map->begin()->second.get()
                                                  : root_.inline_children[0].get();
    RemoveSubtree(first, on_remove);
  }
  root_.child_map.reset();
}

void PrefixIndex::VisitPostOrder(absl::FunctionRef<void(IndexNode*)> visit) const {
  // Iterative: parents are pushed to `order` before their children.
  std::vector<IndexNode*> stack;
  std::vector<IndexNode*> order;
  auto push_children = [&stack](const IndexNode* n) {
    if (n->child_map != nullptr) {
      for (const auto& [h, child] : *n->child_map) stack.push_back(child.get());
    } else {
      for (uint32_t i = 0; i < n->num_children; ++i) stack.push_back(n->inline_children[i].get());
    }
  };
  push_children(&root_);
  while (!stack.empty()) {
    IndexNode* n = stack.back();
    stack.pop_back();
    order.push_back(n);
    push_children(n);
  }
  for (auto it = order.rbegin(); it != order.rend(); ++it) visit(*it);
}

}  // namespace kvcache
