// The behaviour suite every EvictionPolicy passes (a typed test over policy
// factories: add a factory to PolicyFactories and the new policy runs it), followed
// by tests of what only LRU promises.
#include "server/core/eviction_policy.h"

#include <algorithm>
#include <cstdint>
#include <list>
#include <memory>
#include <random>
#include <string>
#include <string_view>
#include <vector>

#include "absl/container/flat_hash_set.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server/common/clock.h"
#include "server/core/block_test_util.h"
#include "server/core/capacity_arbiter.h"
#include "server/core/prefix_index.h"

namespace kvcache {
namespace {

constexpr uint32_t kBt = 16;

// One factory per policy. kName names the test instantiation, kPolicyName
// is what the policy's name() says.
struct LruFactory {
  static constexpr std::string_view kName = "lru";
  static constexpr std::string_view kPolicyName = "lru";
  static std::unique_ptr<EvictionPolicy> Make() { return NewLruPolicy(); }
};
// LRU-K with every use counted (no correlated period), on a clock that
// stands still within a test; lru_k_policy_test.cc tests what only LRU-K
// promises.
struct LruKFactory {
  static constexpr std::string_view kName = "lru_k";
  static constexpr std::string_view kPolicyName = "lru_k";
  static std::unique_ptr<EvictionPolicy> Make() {
    static ManualClock clock;
    clock.Advance(absl::Hours(1));
    return NewLruKPolicy({.correlated_period = absl::ZeroDuration()}, &clock);
  }
};

// The same with a probation segment (LruKOptions::probation_share).
struct LruKProbationFactory {
  static constexpr std::string_view kName = "lru_k_probation";
  static constexpr std::string_view kPolicyName = "lru_k";
  static std::unique_ptr<EvictionPolicy> Make() {
    static ManualClock clock;
    clock.Advance(absl::Hours(1));
    return NewLruKPolicy({.correlated_period = absl::ZeroDuration(), .probation_share = 0.25},
                         &clock);
  }
};

std::vector<Token> Block(uint32_t id) {
  std::vector<Token> block(kBt);
  for (uint32_t t = 0; t < kBt; ++t) block[t] = id * 1024 + t;
  return block;
}

auto All() {
  return [](const IndexNode&) { return true; };
}

// Real index nodes (policies may read their hints and payloads), tracked by
// the policy under test.
template <typename Factory>
class EvictionPolicyTest : public ::testing::Test {
 protected:
  void SetUp() override {
    payload_ = SealedHeapBlock(std::vector<std::byte>(4096));
    policy_ = Factory::Make();
    ASSERT_NE(policy_, nullptr);
  }

  // Adds a block to the index (under `parent`, nullptr: the root) and to the policy.
  IndexNode* Add(uint32_t id, IndexNode* parent = nullptr) {
    IndexNode* node = index_.AddChild(parent, Block(id), payload_);
    EXPECT_NE(node, nullptr);
    policy_->Insert(node);
    return node;
  }

  std::vector<IndexNode*> AddRoots(uint32_t n) {
    std::vector<IndexNode*> nodes;
    for (uint32_t i = 0; i < n; ++i) nodes.push_back(Add(i + 1));
    return nodes;
  }

  // Picks and erases victims until none is left; returns them in order.
  std::vector<IndexNode*> Drain() {
    std::vector<IndexNode*> order;
    while (IndexNode* victim = policy_->PickVictim(All())) {
      policy_->Erase(victim);
      order.push_back(victim);
      if (order.size() > 100000) break;  // a policy that never runs dry
    }
    return order;
  }

  BlockRef payload_;
  PrefixIndex index_{kBt};
  std::unique_ptr<EvictionPolicy> policy_;  // destroyed before the nodes it points to
};

struct FactoryName {
  template <typename Factory>
  static std::string GetName(int) {
    return std::string(Factory::kName);
  }
};

using PolicyFactories = ::testing::Types<LruFactory, LruKFactory, LruKProbationFactory>;
TYPED_TEST_SUITE(EvictionPolicyTest, PolicyFactories, FactoryName);

TYPED_TEST(EvictionPolicyTest, StartsEmpty) {
  EXPECT_EQ(this->policy_->size(), 0u);
  EXPECT_EQ(this->policy_->PickVictim(All()), nullptr);
  EXPECT_EQ(this->policy_->name(), TypeParam::kPolicyName);
}

TYPED_TEST(EvictionPolicyTest, SizeCountsTrackedBlocks) {
  std::vector<IndexNode*> nodes = this->AddRoots(5);
  EXPECT_EQ(this->policy_->size(), 5u);
  this->policy_->Touch(nodes[2]);
  EXPECT_EQ(this->policy_->size(), 5u);
  this->policy_->Erase(nodes[2]);
  this->policy_->Erase(nodes[0]);
  EXPECT_EQ(this->policy_->size(), 3u);
  this->policy_->Insert(nodes[0]);  // a block may come back after it left
  EXPECT_EQ(this->policy_->size(), 4u);
}

TYPED_TEST(EvictionPolicyTest, NothingEvictableGivesNull) {
  this->AddRoots(6);
  EXPECT_EQ(this->policy_->PickVictim([](const IndexNode&) { return false; }), nullptr);
  EXPECT_EQ(this->policy_->size(), 6u);  // asking does not change anything
}

TYPED_TEST(EvictionPolicyTest, VictimSatisfiesThePredicate) {
  std::vector<IndexNode*> nodes = this->AddRoots(8);
  for (IndexNode* only : nodes) {
    EXPECT_EQ(this->policy_->PickVictim([only](const IndexNode& n) { return &n == only; }), only);
  }
  absl::flat_hash_set<const IndexNode*> tracked(nodes.begin(), nodes.end());
  auto odd = [&](const IndexNode& n) {
    EXPECT_TRUE(tracked.contains(&n)) << "asked about an untracked block";
    return n.tokens()[0] / 1024 % 2 == 1;
  };
  for (int round = 0; round < 3; ++round) {
    IndexNode* victim = this->policy_->PickVictim(odd);
    ASSERT_NE(victim, nullptr);
    EXPECT_EQ(victim->tokens()[0] / 1024 % 2, 1u);
    this->policy_->Touch(nodes[round]);
  }
}

TYPED_TEST(EvictionPolicyTest, PickVictimDoesNotErase) {
  this->AddRoots(4);
  IndexNode* first = this->policy_->PickVictim(All());
  ASSERT_NE(first, nullptr);
  EXPECT_EQ(this->policy_->PickVictim(All()), first);
  EXPECT_EQ(this->policy_->size(), 4u);
}

TYPED_TEST(EvictionPolicyTest, ErasedBlocksAreNoLongerConsidered) {
  std::vector<IndexNode*> nodes = this->AddRoots(5);
  IndexNode* gone = nodes[3];
  this->policy_->Erase(gone);
  EXPECT_EQ(this->policy_->PickVictim([gone](const IndexNode& n) { return &n == gone; }), nullptr);
  std::vector<const IndexNode*> asked;
  this->policy_->PickVictim([&](const IndexNode& n) {
    asked.push_back(&n);
    return false;
  });
  EXPECT_THAT(asked, ::testing::Not(::testing::Contains(gone)));
  EXPECT_EQ(asked.size(), 4u);  // every other block was considered
}

TYPED_TEST(EvictionPolicyTest, DrainingReturnsEveryBlockOnce) {
  std::vector<IndexNode*> nodes = this->AddRoots(12);
  std::mt19937 rng(7);
  for (int i = 0; i < 40; ++i) this->policy_->Touch(nodes[rng() % nodes.size()]);
  std::vector<IndexNode*> order = this->Drain();
  EXPECT_THAT(order, ::testing::UnorderedElementsAreArray(nodes));
  EXPECT_EQ(this->policy_->size(), 0u);
}

// With the Cache's rule (only leaves are evictable) a chain leaves leaf first,
// whatever else the policy prefers.
TYPED_TEST(EvictionPolicyTest, LeafOnlyPredicateTrimsAChainFromTheLeaf) {
  IndexNode* a = this->Add(1);
  IndexNode* b = this->Add(2, a);
  IndexNode* c = this->Add(3, b);
  for (IndexNode* n : {c, b, a}) this->policy_->Touch(n);  // as the Cache does
  for (IndexNode* expected : {c, b, a}) {
    IndexNode* victim = this->policy_->PickVictim([](const IndexNode& n) { return n.is_leaf(); });
    ASSERT_EQ(victim, expected);
    this->policy_->Erase(victim);
    this->index_.RemoveSubtree(victim, [](IndexNode*) {});
  }
  EXPECT_EQ(this->policy_->size(), 0u);
}

TYPED_TEST(EvictionPolicyTest, ASiblingStartsEmptyWithTheSameSettings) {
  this->AddRoots(3);
  std::unique_ptr<EvictionPolicy> sibling = this->policy_->NewSibling();
  ASSERT_NE(sibling, nullptr);
  EXPECT_EQ(sibling->size(), 0u);
  EXPECT_EQ(sibling->PickVictim(All()), nullptr);
  EXPECT_EQ(sibling->name(), this->policy_->name());
  PrefixIndex other(kBt);
  IndexNode* mine = other.AddChild(nullptr, Block(9), this->payload_);
  sibling->Insert(mine);
  EXPECT_EQ(sibling->size(), 1u);
  EXPECT_EQ(this->policy_->size(), 3u);  // each tracks its own blocks
  EXPECT_EQ(sibling->PickVictim(All()), mine);
  sibling->Erase(mine);
}

// The cache keeps a policy per model and evicts the coldest of their
// victims (CapacityArbiter): for the policies without probation segments
// that is exactly the order one policy tracking every block would give.
template <typename Factory>
class SiblingOrderTest : public ::testing::Test {};
using UnsegmentedFactories = ::testing::Types<LruFactory, LruKFactory>;
TYPED_TEST_SUITE(SiblingOrderTest, UnsegmentedFactories, FactoryName);

TYPED_TEST(SiblingOrderTest, SiblingsEvictInTheOrderOfOnePolicy) {
  constexpr uint32_t kBlocks = 24;
  const BlockRef payload = SealedHeapBlock(std::vector<std::byte>(64));
  PrefixIndex one_index(kBt), split_index(kBt);
  std::unique_ptr<EvictionPolicy> one = TypeParam::Make();
  std::unique_ptr<EvictionPolicy> first = TypeParam::Make();
  std::unique_ptr<EvictionPolicy> second = first->NewSibling();
  // Block i is tracked by `one`, and by `first` or `second` (by parity).
  std::vector<IndexNode*> in_one, in_split;
  auto owner = [&](uint32_t i) { return i % 2 == 0 ? first.get() : second.get(); };
  for (uint32_t i = 0; i < kBlocks; ++i) {
    in_one.push_back(one_index.AddChild(nullptr, Block(i + 1), payload));
    in_split.push_back(split_index.AddChild(nullptr, Block(i + 1), payload));
    one->Insert(in_one[i]);
    owner(i)->Insert(in_split[i]);
  }
  std::mt19937 rng(11);
  for (int t = 0; t < 60; ++t) {
    const uint32_t i = rng() % kBlocks;
    one->Touch(in_one[i]);
    owner(i)->Touch(in_split[i]);
  }
  EvictionPolicy* const both[] = {first.get(), second.get()};
  for (uint32_t n = 0; n < kBlocks; ++n) {
    IndexNode* expected = one->PickVictim(All());
    IndexNode* picked = CapacityArbiter::PickVictim(both, All());
    ASSERT_NE(expected, nullptr);
    ASSERT_NE(picked, nullptr);
    ASSERT_EQ(picked->tokens()[0], expected->tokens()[0]) << "eviction " << n;
    one->Erase(expected);
    const uint32_t i = picked->tokens()[0] / 1024 - 1;
    owner(i)->Erase(picked);
  }
  EXPECT_EQ(CapacityArbiter::PickVictim(both, All()), nullptr);
}

// ---- LRU only ---------------------------------------------------------------

using LruPolicyTest = EvictionPolicyTest<LruFactory>;

TEST_F(LruPolicyTest, ColdestFirstInInsertionOrder) {
  std::vector<IndexNode*> nodes = AddRoots(4);
  EXPECT_EQ(policy_->PickVictim(All()), nodes[0]);
  EXPECT_EQ(Drain(), nodes);
}

TEST_F(LruPolicyTest, TouchMovesToTheBack) {
  std::vector<IndexNode*> nodes = AddRoots(3);  // a b c
  policy_->Touch(nodes[0]);                     // b c a
  EXPECT_EQ(policy_->PickVictim(All()), nodes[1]);
  policy_->Touch(nodes[1]);  // c a b
  EXPECT_EQ(policy_->PickVictim(All()), nodes[2]);
  policy_->Touch(nodes[1]);  // touching the hottest changes nothing
  EXPECT_EQ(Drain(), (std::vector<IndexNode*>{nodes[2], nodes[0], nodes[1]}));
}

TEST_F(LruPolicyTest, SkipsUnevictableInRecencyOrder) {
  std::vector<IndexNode*> nodes = AddRoots(4);
  IndexNode* pinned = nodes[0];
  auto not_pinned = [pinned](const IndexNode& n) { return &n != pinned; };
  EXPECT_EQ(policy_->PickVictim(not_pinned), nodes[1]);
  policy_->Erase(nodes[1]);
  EXPECT_EQ(policy_->PickVictim(not_pinned), nodes[2]);
  EXPECT_EQ(policy_->PickVictim(All()), nodes[0]);
}

TEST_F(LruPolicyTest, ReinsertedBlockIsHottest) {
  std::vector<IndexNode*> nodes = AddRoots(3);
  policy_->Erase(nodes[0]);
  policy_->Insert(nodes[0]);
  EXPECT_EQ(Drain(), (std::vector<IndexNode*>{nodes[1], nodes[2], nodes[0]}));
}

TEST_F(LruPolicyTest, RandomTouchesMatchAReferenceList) {
  std::vector<IndexNode*> nodes = AddRoots(30);
  std::list<IndexNode*> ref(nodes.begin(), nodes.end());
  std::mt19937 rng(42);
  for (int i = 0; i < 500; ++i) {
    IndexNode* n = nodes[rng() % nodes.size()];
    policy_->Touch(n);
    ref.remove(n);
    ref.push_back(n);
    ASSERT_EQ(policy_->PickVictim(All()), ref.front()) << i;
  }
  EXPECT_EQ(Drain(), std::vector<IndexNode*>(ref.begin(), ref.end()));
}

}  // namespace
}  // namespace kvcache
