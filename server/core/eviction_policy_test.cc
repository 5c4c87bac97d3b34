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
