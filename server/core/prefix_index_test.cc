// Unit tests for PrefixIndex: whole-block matching, many siblings, subtree
// removal order, chained keys, lookup-hash collisions, duplicates, deep
// chains, and a randomized comparison with a reference set of block prefixes.
#include "server/core/prefix_index.h"

#include <algorithm>
#include <cstdint>
#include <memory>
#include <random>
#include <set>
#include <vector>

#include "absl/container/flat_hash_set.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server/core/block_test_util.h"

namespace kvcache {
namespace {

constexpr uint32_t kBt = 16;

// The tokens of block `id`: distinct ids give distinct blocks.
std::vector<Token> Block(uint32_t id) {
  std::vector<Token> block(kBt);
  for (uint32_t t = 0; t < kBt; ++t) block[t] = id * 1024 + t;
  return block;
}

std::vector<Token> Seq(const std::vector<uint32_t>& ids) {
  std::vector<Token> tokens;
  for (uint32_t id : ids) {
    std::vector<Token> b = Block(id);
    tokens.insert(tokens.end(), b.begin(), b.end());
  }
  return tokens;
}

uint32_t IdOf(const IndexNode& node) { return node.tokens()[0] / 1024; }

// The block ids on the path from the root to `node`.
std::vector<uint32_t> PathOf(const IndexNode* node) {
  std::vector<uint32_t> ids;
  for (; node != nullptr; node = node->parent) ids.push_back(IdOf(*node));
  std::reverse(ids.begin(), ids.end());
  return ids;
}

class PrefixIndexTest : public ::testing::Test {
 protected:
  void SetUp() override {
    // The index never reads payloads, so every node shares this one.
    payload_ = SealedHeapBlock(std::vector<std::byte>(64));
  }

  // Adds the blocks of `ids` that are missing; returns the last node.
  IndexNode* Insert(const std::vector<uint32_t>& ids) {
    IndexNode* node = nullptr;
    for (uint32_t id : ids) {
      const std::vector<Token> block = Block(id);
      IndexNode* child = index_.FindChild(node, block);
      if (child == nullptr) child = index_.AddChild(node, block, payload_);
      EXPECT_NE(child, nullptr);
      node = child;
    }
    return node;
  }

  size_t MatchLength(const std::vector<Token>& tokens) {
    std::vector<IndexNode*> path;
    index_.Match(tokens, &path);
    return path.size();
  }

  BlockRef payload_;
  PrefixIndex index_{kBt};
};

TEST_F(PrefixIndexTest, MatchesWholeBlocksOnly) {
  Insert({1, 2, 3});
  EXPECT_EQ(index_.num_blocks(), 3u);
  EXPECT_EQ(index_.block_tokens(), kBt);

  std::vector<Token> tokens = Seq({1, 2, 3});
  tokens.insert(tokens.end(), {7, 7, 7, 7, 7});  // trailing partial block
  std::vector<IndexNode*> path;
  index_.Match(tokens, &path);
  ASSERT_EQ(path.size(), 3u);
  for (uint32_t i = 0; i < 3; ++i) {
    EXPECT_EQ(path[i]->depth, i);
    EXPECT_THAT(path[i]->tokens(), ::testing::ElementsAreArray(Block(i + 1)));
    EXPECT_EQ(path[i]->parent, i == 0 ? nullptr : path[i - 1]);
    EXPECT_EQ(path[i]->index, &index_);
  }
  EXPECT_TRUE(path[2]->is_leaf());
  EXPECT_FALSE(path[0]->is_leaf());

  // The third block's tokens are there but incomplete: only two blocks match.
  std::vector<Token> partial = Seq({1, 2, 3});
  partial.resize(3 * kBt - 1);
  EXPECT_EQ(MatchLength(partial), 2u);
  EXPECT_EQ(MatchLength({}), 0u);
  std::vector<Token> short_block = Block(1);
  short_block.pop_back();
  EXPECT_EQ(MatchLength(short_block), 0u);
  EXPECT_EQ(MatchLength(Seq({2})), 0u);  // a block is only found at its depth

  // Match appends to what the path already holds.
  std::vector<IndexNode*> appended = {nullptr};
  index_.Match(Seq({1}), &appended);
  EXPECT_EQ(appended.size(), 2u);
}

TEST_F(PrefixIndexTest, DivergenceInsideABlockStopsBeforeIt) {
  Insert({1, 2, 3});
  for (uint32_t pos : {0u, 7u, kBt - 1}) {
    std::vector<Token> tokens = Seq({1, 2, 3});
    tokens[kBt + pos] += 1;  // block 1 differs at one token
    EXPECT_EQ(MatchLength(tokens), 1u) << "pos " << pos;
  }
  std::vector<Token> tokens = Seq({1, 2, 3});
  tokens[2 * kBt + 9] = 0;
  EXPECT_EQ(MatchLength(tokens), 2u);
}

TEST_F(PrefixIndexTest, ManySiblingsStayFindable) {
  // Siblings with children of their own.
  constexpr uint32_t kSiblings = 20;
  for (uint32_t i = 0; i < kSiblings; ++i) {
    Insert({100 + i, 500 + i});
    Insert({1, 200 + i, 600 + i});
  }
  EXPECT_EQ(index_.num_blocks(), 2 * kSiblings + 1 + 2 * kSiblings);
  IndexNode* one = index_.FindChild(nullptr, Block(1));
  ASSERT_NE(one, nullptr);
  EXPECT_EQ(one->num_children, kSiblings);
  for (uint32_t i = 0; i < kSiblings; ++i) {
    EXPECT_EQ(MatchLength(Seq({100 + i, 500 + i})), 2u) << i;
    EXPECT_EQ(MatchLength(Seq({1, 200 + i, 600 + i})), 3u) << i;
    IndexNode* child = index_.FindChild(one, Block(200 + i));
    ASSERT_NE(child, nullptr);
    EXPECT_EQ(child->parent, one);
  }
  // Remove every other sibling; the rest stay.
  for (uint32_t i = 0; i < kSiblings; i += 2) {
    index_.RemoveSubtree(index_.FindChild(one, Block(200 + i)), [](IndexNode*) {});
  }
  EXPECT_EQ(one->num_children, kSiblings / 2);
  for (uint32_t i = 0; i < kSiblings; ++i) {
    EXPECT_EQ(MatchLength(Seq({1, 200 + i, 600 + i})), i % 2 == 0 ? 1u : 3u) << i;
  }
  // Re-adding works.
  Insert({1, 200, 600});
  EXPECT_EQ(MatchLength(Seq({1, 200, 600})), 3u);
}

TEST_F(PrefixIndexTest, RemovalKeepsTheOtherSiblings) {
  constexpr uint32_t kChildren = 4;
  for (uint32_t i = 0; i < kChildren; ++i) Insert({1, 10 + i});
  IndexNode* one = index_.FindChild(nullptr, Block(1));
  index_.RemoveSubtree(index_.FindChild(one, Block(11)), [](IndexNode*) {});
  EXPECT_EQ(one->num_children, kChildren - 1);
  for (uint32_t i = 0; i < kChildren; ++i) {
    EXPECT_EQ(MatchLength(Seq({1, 10 + i})), i == 1 ? 1u : 2u) << i;
  }
  Insert({1, 11});
  Insert({1, 14});
  Insert({1, 15});
  for (uint32_t i = 0; i < 6; ++i) EXPECT_EQ(MatchLength(Seq({1, 10 + i})), 2u) << i;
}

TEST_F(PrefixIndexTest, RemoveSubtreeReportsChildrenBeforeParents) {
  Insert({1, 2, 3, 4});
  Insert({1, 2, 5});
  for (uint32_t i = 0; i < 6; ++i) Insert({1, 2, 6, 20 + i});
  Insert({1, 7});
  Insert({8});
  const uint64_t before = index_.num_blocks();
  ASSERT_EQ(before, 4 + 1 + 1 + 6 + 1 + 1u);

  IndexNode* two = index_.FindChild(index_.FindChild(nullptr, Block(1)), Block(2));
  ASSERT_NE(two, nullptr);
  std::vector<std::vector<uint32_t>> removed;
  absl::flat_hash_set<const IndexNode*> seen;
  index_.RemoveSubtree(two, [&](IndexNode* n) {
    // A node's children were all reported before it; its parent is still alive.
    EXPECT_EQ(n->num_children, 0u);
    EXPECT_FALSE(seen.contains(n->parent)) << "parent reported before child";
    EXPECT_NE(n->payload, nullptr);
    seen.insert(n);
    removed.push_back(PathOf(n));
  });
  EXPECT_EQ(removed.size(), 1 + 3 + 1 + 6u);
  EXPECT_EQ(removed.back(), (std::vector<uint32_t>{1, 2}));
  EXPECT_THAT(removed, ::testing::Contains(std::vector<uint32_t>{1, 2, 6, 25}));
  EXPECT_EQ(index_.num_blocks(), before - removed.size());
  EXPECT_EQ(MatchLength(Seq({1, 2, 3, 4})), 1u);
  EXPECT_EQ(MatchLength(Seq({1, 7})), 2u);
  EXPECT_EQ(MatchLength(Seq({8})), 1u);

  size_t cleared = 0;
  index_.Clear([&](IndexNode*) { ++cleared; });
  EXPECT_EQ(cleared, 3u);
  EXPECT_EQ(index_.num_blocks(), 0u);
  EXPECT_EQ(MatchLength(Seq({1})), 0u);
}

TEST_F(PrefixIndexTest, VisitsOneSubtreeOrOneLevel) {
  Insert({1, 2, 3});
  Insert({1, 2, 4});
  Insert({1, 5});
  Insert({6, 7});
  IndexNode* two = index_.FindChild(index_.FindChild(nullptr, Block(1)), Block(2));
  ASSERT_NE(two, nullptr);
  std::vector<std::vector<uint32_t>> below;
  absl::flat_hash_set<const IndexNode*> seen;
  index_.VisitSubtree(two, [&](IndexNode* n) {
    for (const IndexNode* c : seen) EXPECT_NE(c, n->parent) << "a parent came before its child";
    seen.insert(n);
    below.push_back(PathOf(n));
  });
  EXPECT_THAT(below, ::testing::UnorderedElementsAre(std::vector<uint32_t>{1, 2},
                                                     std::vector<uint32_t>{1, 2, 3},
                                                     std::vector<uint32_t>{1, 2, 4}));
  EXPECT_EQ(below.back(), (std::vector<uint32_t>{1, 2}));  // the node itself last

  std::vector<uint32_t> firsts;
  index_.VisitChildren(nullptr, [&](IndexNode* n) { firsts.push_back(IdOf(*n)); });
  EXPECT_THAT(firsts, ::testing::UnorderedElementsAre(1u, 6u));
  std::vector<uint32_t> children;
  index_.VisitChildren(index_.FindChild(nullptr, Block(1)),
                       [&](IndexNode* n) { children.push_back(IdOf(*n)); });
  EXPECT_THAT(children, ::testing::UnorderedElementsAre(2u, 5u));
  size_t none = 0;
  index_.VisitChildren(index_.FindChild(two, Block(3)), [&](IndexNode*) { ++none; });
  EXPECT_EQ(none, 0u);
}

// Walks `cursor` to its end, `step` nodes at a time; the paths visited.
std::vector<std::vector<uint32_t>> WalkAll(PrefixIndex::Cursor& cursor, size_t step) {
  std::vector<std::vector<uint32_t>> paths;
  while (!cursor.done()) {
    const size_t visited = cursor.Step(step, [&](IndexNode* n) { paths.push_back(PathOf(n)); });
    EXPECT_GT(visited, 0u);
    EXPECT_LE(visited, step);
  }
  return paths;
}

TEST_F(PrefixIndexTest, CursorWalksParentsFirstInBoundedSteps) {
  Insert({1, 2, 3});
  Insert({1, 2, 4});
  Insert({1, 5});
  Insert({6, 7});
  using P = std::vector<uint32_t>;
  PrefixIndex::Cursor all(&index_);
  const std::vector<P> paths = WalkAll(all, 2);
  EXPECT_THAT(paths, ::testing::UnorderedElementsAre(P{1}, P{1, 2}, P{1, 2, 3}, P{1, 2, 4}, P{1, 5},
                                                     P{6}, P{6, 7}));
  for (size_t i = 0; i < paths.size(); ++i) {
    const P parent(paths[i].begin(), paths[i].end() - 1);
    if (parent.empty()) continue;
    EXPECT_NE(std::find(paths.begin(), paths.begin() + static_cast<ptrdiff_t>(i), parent),
              paths.begin() + static_cast<ptrdiff_t>(i))
        << "a child came before its parent";
  }
  EXPECT_EQ(all.Step(5, [](IndexNode*) { ADD_FAILURE() << "visited past the end"; }), 0u);

  PrefixIndex::Cursor firsts(&index_, nullptr, /*max_depth=*/0);
  EXPECT_THAT(WalkAll(firsts, 1), ::testing::UnorderedElementsAre(P{1}, P{6}));
  IndexNode* two = index_.FindChild(index_.FindChild(nullptr, Block(1)), Block(2));
  PrefixIndex::Cursor below(&index_, two);
  EXPECT_THAT(WalkAll(below, 1), ::testing::UnorderedElementsAre(P{1, 2}, P{1, 2, 3}, P{1, 2, 4}));
  PrefixIndex::Cursor one_level(&index_, index_.FindChild(nullptr, Block(1)), 1);
  EXPECT_THAT(WalkAll(one_level, 3), ::testing::UnorderedElementsAre(P{1}, P{1, 2}, P{1, 5}));
}

TEST_F(PrefixIndexTest, CursorSurvivesRemovalsAndAdditionsBetweenSteps) {
  std::mt19937 gen(7);
  auto rng = [&] { return static_cast<uint32_t>(gen()); };
  // Random trees of 3-deep paths; remove random subtrees between steps (the
  // node the cursor would visit next among them) and add new ones. Every
  // node present from start to end is visited exactly once, nothing twice,
  // nothing removed.
  for (int round = 0; round < 200; ++round) {
    std::set<std::vector<uint32_t>> before, removed, ever_removed, visited;
    PrefixIndex index(kBt);
    auto insert = [&](const std::vector<uint32_t>& ids) {
      IndexNode* node = nullptr;
      for (uint32_t id : ids) {
        const std::vector<Token> block = Block(id);
        IndexNode* child = index.FindChild(node, block);
        if (child == nullptr) child = index.AddChild(node, block, payload_);
        node = child;
        removed.erase(PathOf(node));  // a new node where a removed one was
      }
    };
    for (int i = 0; i < 30; ++i) insert({rng() % 4u, 10 + rng() % 3u, 20 + rng() % 3u});
    index.VisitPostOrder([&](IndexNode* n) { before.insert(PathOf(n)); });
    PrefixIndex::Cursor cursor(&index);
    while (!cursor.done()) {
      cursor.Step(1 + rng() % 3, [&](IndexNode* n) {
        EXPECT_TRUE(visited.insert(PathOf(n)).second) << "visited twice";
        EXPECT_FALSE(removed.contains(PathOf(n))) << "visited a removed node";
      });
      if (rng() % 2 == 0) {
        std::vector<IndexNode*> all;
        index.VisitPostOrder([&](IndexNode* n) { all.push_back(n); });
        if (!all.empty()) {
          index.RemoveSubtree(all[rng() % all.size()], [&](IndexNode* n) {
            removed.insert(PathOf(n));
            ever_removed.insert(PathOf(n));
          });
        }
      }
      if (rng() % 2 == 0) insert({rng() % 6u, 10 + rng() % 3u, 20 + rng() % 3u});
    }
    for (const auto& path : before) {
      if (!ever_removed.contains(path)) {
        EXPECT_TRUE(visited.contains(path)) << "missed a node";
      }
    }
  }
}

TEST_F(PrefixIndexTest, CursorEndsWhenItsSubtreeOrIndexGoes) {
  IndexNode* two = Insert({1, 2, 3});
  IndexNode* first = index_.FindChild(nullptr, Block(1));
  PrefixIndex::Cursor below(&index_, two->parent);
  index_.RemoveSubtree(first, [](IndexNode*) {});
  EXPECT_TRUE(below.done());

  auto index = std::make_unique<PrefixIndex>(kBt);
  index->AddChild(nullptr, Block(1), payload_);
  PrefixIndex::Cursor outliving(index.get());
  index.reset();
  EXPECT_TRUE(outliving.done());
  EXPECT_EQ(outliving.index(), nullptr);
}

TEST_F(PrefixIndexTest, KeysChainOverTheWholePrefix) {
  IndexNode* a = Insert({1, 3});
  IndexNode* b = Insert({2, 3});
  ASSERT_NE(a, nullptr);
  ASSERT_NE(b, nullptr);
  EXPECT_THAT(a->tokens(), ::testing::ElementsAreArray(b->tokens()));  // same block tokens...
  EXPECT_NE(a->key, b->key);                                           // ...under different parents
  EXPECT_NE(a->lookup_hash, b->lookup_hash);
  const uint64_t k1 = index_.ChainKey(0, Block(1));
  EXPECT_EQ(a->parent->key, k1);
  EXPECT_EQ(a->key, index_.ChainKey(k1, Block(3)));
  EXPECT_NE(index_.ChainKey(0, Block(3)), a->key);  // depth matters too

  // Keys are a function of the tokens alone: another index agrees.
  PrefixIndex other(kBt);
  IndexNode* p = other.AddChild(nullptr, Block(1), payload_);
  IndexNode* c = other.AddChild(p, Block(3), payload_);
  EXPECT_EQ(c->key, a->key);
  EXPECT_EQ(c->lookup_hash, a->lookup_hash);
  EXPECT_EQ(c->depth, 1u);
  // The lookup hashes of a sequence are those of its nodes.
  const BlockHashes hashes = BlockHashes::Of(index_.hasher(), kBt, Seq({1, 3}));
  EXPECT_EQ(hashes.block_tokens, kBt);
  EXPECT_THAT(hashes.hashes, ::testing::ElementsAre(a->parent->lookup_hash, a->lookup_hash));
}

BlockHashKeys KeysOf(uint8_t lookup, uint8_t chain) {
  BlockHashKeys keys;
  keys.lookup.fill(lookup);
  keys.chain.fill(chain);
  return keys;
}

TEST_F(PrefixIndexTest, HashesAreKeyedPerIndex) {
  // The same tokens in indexes of other keys (another daemon's secret, or
  // another (namespace, model)) have other chain keys and lookup hashes:
  // a key learnt in one names nothing in the other.
  IndexNode* a = Insert({1, 3});
  ASSERT_NE(a, nullptr);
  PrefixIndex keyed(kBt, std::make_shared<const BlockHasher>(KeysOf(1, 2)));
  IndexNode* p = keyed.AddChild(nullptr, Block(1), payload_);
  IndexNode* c = keyed.AddChild(p, Block(3), payload_);
  ASSERT_NE(c, nullptr);
  EXPECT_NE(c->key, a->key);
  EXPECT_NE(c->lookup_hash, a->lookup_hash);
  EXPECT_NE(p->key, a->parent->key);
  // Each key moves only its own hash.
  const BlockHasher other_chain(KeysOf(1, 3));
  const BlockHasher other_lookup(KeysOf(4, 2));
  EXPECT_EQ(other_chain.LookupHash(0, Block(1)), p->lookup_hash);
  EXPECT_NE(other_chain.ChainKey(0, Block(1)), p->key);
  EXPECT_EQ(other_lookup.ChainKey(0, Block(1)), p->key);
  EXPECT_NE(other_lookup.LookupHash(0, Block(1)), p->lookup_hash);
  // The same keys give the same hashes (a restart with the same secret).
  const BlockHasher again(KeysOf(1, 2));
  EXPECT_EQ(again.ChainKey(again.ChainKey(0, Block(1)), Block(3)), c->key);
  EXPECT_EQ(again.LookupHash(again.LookupHash(0, Block(1)), Block(3)), c->lookup_hash);

  // A keyed index matches its prompts, also from hashes another hasher
  // made (it hashes again), and finds children by tokens.
  std::vector<IndexNode*> path;
  keyed.Match(Seq({1, 3}), &path);
  EXPECT_THAT(path, ::testing::ElementsAre(p, c));
  path.clear();
  keyed.Match(Seq({1, 3}), BlockHashes::Of(index_.hasher(), kBt, Seq({1, 3})), &path);
  EXPECT_THAT(path, ::testing::ElementsAre(p, c));
  EXPECT_EQ(keyed.FindChild(p, Block(3)), c);
  EXPECT_EQ(keyed.FindByLookupHash(a->lookup_hash), nullptr);
}

TEST_F(PrefixIndexTest, WrongCandidatesNeverMatch) {
  // Whatever the hashes say, a node matches only where its parent and its
  // tokens agree with the prompt: hashes of another prompt (as a collision
  // would give) find nodes that the checks then refuse.
  Insert({1, 2, 3});
  Insert({4, 5, 6});
  const std::vector<Token> prompt = Seq({1, 2, 3});
  std::vector<IndexNode*> path;
  index_.Match(prompt, BlockHashes::Of(index_.hasher(), kBt, Seq({4, 5, 6})), &path);
  EXPECT_TRUE(path.empty());
  // A hash of the right node at the wrong place: block 2 under block 4.
  BlockHashes mixed = BlockHashes::Of(index_.hasher(), kBt, Seq({1, 2, 3}));
  mixed.hashes[1] = BlockHashes::Of(index_.hasher(), kBt, Seq({4, 5})).hashes[1];
  index_.Match(prompt, mixed, &path);
  EXPECT_EQ(path.size(), 1u);
  // Hashes for another block size are recomputed.
  path.clear();
  index_.Match(prompt, BlockHashes::Of(index_.hasher(), 2 * kBt, prompt), &path);
  EXPECT_EQ(path.size(), 3u);
}

TEST_F(PrefixIndexTest, AddChildRefusesDuplicates) {
  IndexNode* first = index_.AddChild(nullptr, Block(1), payload_);
  ASSERT_NE(first, nullptr);
  EXPECT_EQ(index_.AddChild(nullptr, Block(1), payload_), nullptr);
  EXPECT_EQ(index_.num_blocks(), 1u);
  EXPECT_EQ(index_.FindChild(nullptr, Block(1)), first);
  // The same in map mode.
  for (uint32_t i = 0; i < 10; ++i)
    ASSERT_NE(index_.AddChild(first, Block(10 + i), payload_), nullptr);
  IndexNode* seven = index_.FindChild(first, Block(17));
  EXPECT_EQ(index_.AddChild(first, Block(17), payload_), nullptr);
  EXPECT_EQ(index_.FindChild(first, Block(17)), seven);
  EXPECT_EQ(index_.num_blocks(), 11u);
  EXPECT_EQ(first->num_children, 10u);
}

TEST_F(PrefixIndexTest, DeepChainRemovesWithoutRecursion) {
  constexpr uint32_t kDepth = 100'000;
  std::vector<Token> tokens;
  tokens.reserve(size_t{kDepth} * kBt);
  IndexNode* node = nullptr;
  for (uint32_t i = 0; i < kDepth; ++i) {
    const std::vector<Token> block = Block(i);
    node = index_.AddChild(node, block, payload_);
    ASSERT_NE(node, nullptr);
    tokens.insert(tokens.end(), block.begin(), block.end());
  }
  EXPECT_EQ(index_.num_blocks(), kDepth);
  EXPECT_EQ(MatchLength(tokens), kDepth);

  int64_t expected_depth = kDepth - 1;
  index_.RemoveSubtree(index_.FindChild(nullptr, Block(0)), [&](IndexNode* n) {
    EXPECT_EQ(n->depth, expected_depth);  // leaf first, root block last
    --expected_depth;
  });
  EXPECT_EQ(expected_depth, -1);
  EXPECT_EQ(index_.num_blocks(), 0u);

  // The destructor takes the same path.
  auto deep = std::make_unique<PrefixIndex>(kBt);
  node = nullptr;
  for (uint32_t i = 0; i < kDepth; ++i) node = deep->AddChild(node, Block(i), payload_);
  deep.reset();
}

// The reference: the set of cached prefixes, as block-id vectors. Every prefix
// of a member is a member.
size_t ReferenceMatch(const std::set<std::vector<uint32_t>>& ref,
                      const std::vector<uint32_t>& ids) {
  size_t k = 0;
  while (k < ids.size() && ref.contains(std::vector<uint32_t>(ids.begin(), ids.begin() + k + 1))) {
    ++k;
  }
  return k;
}

TEST_F(PrefixIndexTest, RandomOperationsAgreeWithReference) {
  std::mt19937_64 rng(20240601);
  std::set<std::vector<uint32_t>> ref;
  // Six block ids per level: enough siblings to use both inline and map storage.
  auto random_ids = [&](size_t min_depth, size_t max_depth) {
    std::vector<uint32_t> ids(min_depth + rng() % (max_depth - min_depth + 1));
    for (auto& id : ids) id = 1 + rng() % 6;
    return ids;
  };
  for (int op = 0; op < 5000; ++op) {
    const int kind = rng() % 10;
    if (kind < 4) {  // insert
      const std::vector<uint32_t> ids = random_ids(1, 5);
      IndexNode* last = Insert(ids);
      ASSERT_NE(last, nullptr);
      EXPECT_EQ(PathOf(last), ids);
      for (size_t k = 1; k <= ids.size(); ++k) ref.emplace(ids.begin(), ids.begin() + k);
    } else if (kind < 6) {  // remove a subtree
      const std::vector<uint32_t> prefix = random_ids(1, 3);
      std::vector<IndexNode*> path;
      index_.Match(Seq(prefix), &path);
      auto first = ref.lower_bound(prefix);
      auto last = first;
      while (last != ref.end() && last->size() >= prefix.size() &&
             std::equal(prefix.begin(), prefix.end(), last->begin())) {
        ++last;
      }
      std::set<std::vector<uint32_t>> expected(first, last);
      if (path.size() != prefix.size()) {
        EXPECT_TRUE(expected.empty()) << "reference holds a prefix the index lacks";
        continue;
      }
      std::set<std::vector<uint32_t>> removed;
      index_.RemoveSubtree(path.back(), [&](IndexNode* n) { removed.insert(PathOf(n)); });
      EXPECT_EQ(removed, expected);
      ref.erase(first, last);
    } else {  // match, with a partial trailing block
      const std::vector<uint32_t> ids = random_ids(0, 6);
      std::vector<Token> tokens = Seq(ids);
      tokens.resize(tokens.size() + rng() % kBt, 7);
      std::vector<IndexNode*> path;
      index_.Match(tokens, &path);
      ASSERT_EQ(path.size(), ReferenceMatch(ref, ids)) << "op " << op;
      for (size_t i = 0; i < path.size(); ++i) {
        EXPECT_EQ(path[i]->depth, i);
        EXPECT_EQ(IdOf(*path[i]), ids[i]);
      }
    }
    ASSERT_EQ(index_.num_blocks(), ref.size()) << "op " << op;
  }
  size_t cleared = 0;
  index_.Clear([&](IndexNode*) { ++cleared; });
  EXPECT_EQ(cleared, ref.size());
  EXPECT_EQ(index_.num_blocks(), 0u);
}

}  // namespace
}  // namespace kvcache
