// What LRU-K remembers of a block's references: history retained past eviction, and probation.
//
// Retained history: an evicted block's references outlive it (bounded, per
// index) and resume when it comes back. Probation: blocks with a single
// reference wait in their own segment, which gives the victim while it holds
// more than its share. The rest of LRU-K's promises: lru_k_policy_test.cc.
#include "server/core/lru_k_policy_test_util.h"

namespace kvcache {
namespace lru_k_test {
namespace {

TEST_F(LruKPolicyTest, EvictedBlockResumesItsHistory) {
  IndexNode* a = Add(1);
  Advance(absl::Seconds(2));
  policy_->Touch(a);
  // Tracked: the key form knows only evicted blocks.
  EXPECT_FALSE(policy_->SeenAtLeast(&index_, a->key, 1));
  EXPECT_TRUE(policy_->SeenAtLeast(*a, 2));
  EXPECT_FALSE(policy_->SeenAtLeast(*a, 3));
  policy_->Erase(a);
  EXPECT_EQ(policy_->retained_size(), 1u);
  EXPECT_TRUE(policy_->SeenAtLeast(&index_, a->key, 2));
  EXPECT_FALSE(policy_->SeenAtLeast(&index_, a->key, 3));
  EXPECT_TRUE(policy_->SeenAtLeast(&index_, a->key, 0));
  EXPECT_FALSE(policy_->SeenAtLeast(&index_, a->key ^ 1, 1));

  // A newcomer with one reference goes before a block that comes back with
  // its earlier references.
  Advance(absl::Seconds(2));
  IndexNode* fresh = Add(2);
  Advance(absl::Seconds(2));
  policy_->Insert(a);
  EXPECT_EQ(policy_->References(*a), 3);
  EXPECT_EQ(policy_->retained_size(), 0u);  // resumed: no longer retained
  EXPECT_EQ(policy_->PickVictim(All), fresh);
}

TEST_F(LruKPolicyTest, RetainedHistoryBelongsToItsIndex) {
  // Another (namespace, model) has its own index: a block there whose chain
  // key equals an erased block's here must not inherit that history, nor
  // may the key form answer for it.
  PrefixIndex other(kBt);
  IndexNode* a = Add(1);
  Advance(absl::Seconds(2));
  policy_->Touch(a);
  policy_->Erase(a);
  ASSERT_TRUE(policy_->SeenAtLeast(&index_, a->key, 2));
  EXPECT_FALSE(policy_->SeenAtLeast(&other, a->key, 1));

  IndexNode* stranger = other.AddChild(nullptr, Block(1), payload_);
  ASSERT_NE(stranger, nullptr);
  stranger->key = a->key;  // the same key, whatever the hashing
  Advance(absl::Seconds(2));
  policy_->Insert(stranger);
  EXPECT_EQ(policy_->References(*stranger), 1);
  EXPECT_EQ(policy_->retained_size(), 1u);  // a's history is still a's
  policy_->Erase(stranger);

  Advance(absl::Seconds(2));
  policy_->Insert(a);
  EXPECT_EQ(policy_->References(*a), 3);
  policy_->Erase(a);
}

TEST_F(LruKPolicyTest, NoRetainedHistoryStartsOver) {
  Reset({.retained_history = 0});
  IndexNode* a = Add(1);
  Advance(absl::Seconds(2));
  policy_->Touch(a);
  policy_->Erase(a);
  EXPECT_EQ(policy_->retained_size(), 0u);
  EXPECT_FALSE(policy_->SeenAtLeast(&index_, a->key, 1));
  Advance(absl::Seconds(2));
  policy_->Insert(a);
  EXPECT_EQ(policy_->References(*a), 1);
}

TEST_F(LruKPolicyTest, RetainedHistoryIsBoundedLeastRecentlyErasedFirst) {
  Reset({.retained_history = 2});
  std::vector<IndexNode*> n = {Add(1), Add(2), Add(3)};
  for (IndexNode* node : n) policy_->Erase(node);
  EXPECT_EQ(policy_->retained_size(), 2u);
  EXPECT_FALSE(policy_->SeenAtLeast(&index_, n[0]->key, 1));
  EXPECT_TRUE(policy_->SeenAtLeast(&index_, n[1]->key, 1));
  EXPECT_TRUE(policy_->SeenAtLeast(&index_, n[2]->key, 1));
}

// Probation (LruKOptions::probation_share): blocks with one reference wait
// in their own segment, which gives the victim while it holds more than its
// share.
TEST_F(LruKPolicyTest, ProbationGivesTheVictimWhileOverItsShare) {
  Reset({.probation_share = 0.5});
  // Two blocks referenced twice (main), then three newcomers (probation).
  IndexNode* m1 = Add(1);
  IndexNode* m2 = Add(2);
  Advance(absl::Seconds(5));
  for (IndexNode* n : {m1, m2}) policy_->Touch(n);
  Advance(absl::Hours(1));
  IndexNode* p1 = Add(3);
  IndexNode* p2 = Add(4);
  IndexNode* p3 = Add(5);
  EXPECT_EQ(policy_->probation_size(), 3u);
  // 3 of 5 is over half: the coldest newcomer goes, although the main
  // blocks rank lower (their 2nd reference is an hour old).
  EXPECT_EQ(policy_->PickVictim(All), p1);
  policy_->Erase(p1);
  // 2 of 4 is not over half: the main segment's lowest rank goes.
  EXPECT_EQ(policy_->PickVictim(All), m1);
  policy_->Erase(m1);
  // Then p2 (2 of 3 on probation), m2 (1 of 2), p3.
  EXPECT_THAT(Drain(), ElementsAre(p2, m2, p3));
}

TEST_F(LruKPolicyTest, WithoutProbationNewcomersRankAgainstEveryBlock) {
  // The same blocks without probation: the hour-old main blocks go first.
  IndexNode* m1 = Add(1);
  IndexNode* m2 = Add(2);
  Advance(absl::Seconds(5));
  for (IndexNode* n : {m1, m2}) policy_->Touch(n);
  Advance(absl::Hours(1));
  IndexNode* p1 = Add(3);
  EXPECT_EQ(policy_->probation_size(), 0u);
  EXPECT_THAT(Drain(), ElementsAre(m1, m2, p1));
}

TEST_F(LruKPolicyTest, AnUncorrelatedReferencePromotesOffProbation) {
  Reset({.probation_share = 0.5});
  IndexNode* a = Add(1);
  IndexNode* b = Add(2);
  IndexNode* c = Add(3);
  EXPECT_EQ(policy_->probation_size(), 3u);
  Advance(absl::Milliseconds(500));  // within the correlated period: stays
  policy_->Touch(a);
  EXPECT_EQ(policy_->probation_size(), 3u);
  Advance(absl::Seconds(2));  // another request: promoted
  policy_->Touch(a);
  EXPECT_EQ(policy_->probation_size(), 2u);
  EXPECT_EQ(policy_->References(*a), 2);
  // b and c (2 of 3) are over half: b goes; then 1 of 2 is not: a, then c.
  EXPECT_THAT(Drain(), ElementsAre(b, a, c));
}

TEST_F(LruKPolicyTest, ABlockComingBackWithRetainedHistorySkipsProbation) {
  Reset({.probation_share = 0.5});
  IndexNode* a = Add(1);
  policy_->Erase(a);  // one reference retained
  Advance(absl::Seconds(2));
  policy_->Insert(a);  // the second: straight to the main segment
  EXPECT_EQ(policy_->References(*a), 2);
  EXPECT_EQ(policy_->probation_size(), 0u);
  IndexNode* b = Add(2);
  IndexNode* c = Add(3);
  EXPECT_EQ(policy_->probation_size(), 2u);
  EXPECT_THAT(Drain(), ElementsAre(b, a, c));
}

TEST_F(LruKPolicyTest, PriorityAndImportanceKeepABlockOffProbation) {
  Reset({.probation_share = 0.5});
  IndexNode* plain = Add(1);
  IndexNode* urgent = Add(2, kUnspecified, /*priority=*/1);
  IndexNode* negative = Add(3, kUnspecified, /*priority=*/-1);
  IndexNode* valued = Add(4);
  EXPECT_EQ(policy_->probation_size(), 3u);
  policy_->SetImportance(valued, 0.4f);  // below kProtectImportance: stays
  EXPECT_EQ(policy_->probation_size(), 3u);
  policy_->SetImportance(valued, LruKOptions::kProtectImportance);
  EXPECT_EQ(policy_->probation_size(), 2u);
  policy_->SetImportance(valued, 0.0f);  // once in the main segment, it stays there
  EXPECT_EQ(policy_->probation_size(), 2u);
  // plain and negative (2 of 4) are not over half: the main segment first,
  // where valued (importance 0 now) ranks below urgent (priority 1).
  EXPECT_EQ(policy_->PickVictim(All), valued);
  policy_->Erase(valued);
  // Then 2 of 3 on probation: negative (1 minute lower than plain); then
  // 1 of 2: urgent, and plain last.
  EXPECT_THAT(Drain(), ElementsAre(negative, urgent, plain));
}

TEST_F(LruKPolicyTest, ProbationParentsAreSetAsideAndTheMainSegmentServes) {
  // A chain on probation under the Cache's leaf-only rule, with a main block.
  Reset({.probation_share = 0.5});
  IndexNode* m = Add(9);
  Advance(absl::Seconds(2));
  policy_->Touch(m);
  Advance(absl::Seconds(2));
  IndexNode* a = Add(1);
  IndexNode* b = Add(2, kUnspecified, 0, a);
  IndexNode* c = Add(3, kUnspecified, 0, b);
  for (IndexNode* n : {c, b, a}) policy_->Touch(n);  // correlated: still on probation
  EXPECT_EQ(policy_->probation_size(), 3u);
  std::vector<const IndexNode*> asked;
  auto leaf_not_c = [&](const IndexNode& n) {
    asked.push_back(&n);
    return n.is_leaf() && &n != c;  // c is the tail of an append in progress
  };
  // Probation (3 of 4) first: c is pinned, a and b have children; then m.
  EXPECT_EQ(policy_->PickVictim(leaf_not_c), m);
  EXPECT_THAT(asked, ElementsAre(c, b, a, m));
  asked.clear();
  EXPECT_EQ(policy_->PickVictim(leaf_not_c), m);
  EXPECT_THAT(asked, ElementsAre(c, m));  // a and b were set aside
  // The chain drains leaf first once c may go.
  policy_->Erase(m);
  for (IndexNode* expected : {c, b, a}) {
    IndexNode* victim = policy_->PickVictim([](const IndexNode& n) { return n.is_leaf(); });
    ASSERT_EQ(victim, expected);
    policy_->Erase(victim);
    index_.RemoveSubtree(victim, [](IndexNode*) {});
  }
  EXPECT_EQ(policy_->size(), 0u);
}

}  // namespace
}  // namespace lru_k_test
}  // namespace kvcache
