// What only LRU-K promises (eviction_policy_test.cc runs the behaviour suite
// every policy passes over it too): K by workload, the correlated period,
// the rank's priority and importance terms, and order against a reference
// model built from whole reference lists. Retained history and probation:
// lru_k_policy_history_test.cc.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "server/core/lru_k_policy_test_util.h"

namespace kvcache {
namespace lru_k_test {
namespace {

TEST_F(LruKPolicyTest, KComesFromTheWorkload) {
  LruKOptions options;
  EXPECT_EQ(options.KFor(kUnspecified), 2);
  EXPECT_EQ(options.KFor(kChat), 2);
  EXPECT_EQ(options.KFor(kCode), 3);
  EXPECT_EQ(options.KFor(kDocument), 4);
  EXPECT_EQ(options.KFor(77), 2);  // an unknown kind: default_k

  // Every block is referenced twice, 10 s apart: enough for chat and
  // unspecified (K = 2), not for code (3) or document (4), which go first,
  // least recently used first; then the others by their 2nd reference.
  IndexNode* chat = Add(1, kChat);
  Advance(absl::Seconds(10));
  IndexNode* code = Add(2, kCode);
  Advance(absl::Seconds(10));
  IndexNode* doc = Add(3, kDocument);
  Advance(absl::Seconds(10));
  IndexNode* plain = Add(4, kUnspecified);
  Advance(absl::Seconds(10));
  for (IndexNode* n : {doc, plain, code, chat}) {
    policy_->Touch(n);
    Advance(absl::Seconds(10));
  }
  for (IndexNode* n : {chat, code, doc, plain}) EXPECT_EQ(policy_->References(*n), 2);
  EXPECT_THAT(Drain(), ElementsAre(doc, code, chat, plain));
}

TEST_F(LruKPolicyTest, DocumentBlockWithFourReferencesOutlivesItsNeighbours) {
  IndexNode* doc = Add(1, kDocument);
  IndexNode* chat = Add(2, kChat);
  for (int i = 0; i < 3; ++i) {
    Advance(absl::Seconds(5));
    policy_->Touch(doc);
  }
  Advance(absl::Seconds(5));
  policy_->Touch(chat);  // chat: HIST(2) = 0 s; doc: HIST(4) = 0 s, earlier sequence
  EXPECT_EQ(policy_->References(*doc), 4);
  EXPECT_EQ(policy_->PickVictim(All), doc);
  Advance(absl::Seconds(5));
  policy_->Touch(doc);                      // doc: HIST(4) = 5 s
  EXPECT_EQ(policy_->References(*doc), 4);  // no more is remembered
  EXPECT_EQ(policy_->PickVictim(All), chat);
}

TEST_F(LruKPolicyTest, LargestBackwardKDistanceFirst) {
  // K = 2. References: a at 0 and 10 s, b at 5 and 6 s, c at 1 and 20 s,
  // d once at 30 s. HIST(2): a 0, c 1, b 5; d has fewer than K and goes first.
  IndexNode* a = Add(1);
  Advance(absl::Seconds(1));
  IndexNode* c = Add(3);
  Advance(absl::Seconds(4));
  IndexNode* b = Add(2);
  Advance(absl::Seconds(1));
  policy_->Touch(b);
  Advance(absl::Seconds(4));
  policy_->Touch(a);
  Advance(absl::Seconds(10));
  policy_->Touch(c);
  Advance(absl::Seconds(10));
  IndexNode* d = Add(4);
  EXPECT_THAT(Drain(), ElementsAre(d, a, c, b));
}

TEST_F(LruKPolicyTest, FewerThanKBlocksLeaveInLruOrder) {
  std::vector<IndexNode*> n = {Add(1), Add(2), Add(3)};  // same millisecond: insertion order
  policy_->Touch(n[0]);                                  // correlated: refreshes its last use
  EXPECT_EQ(policy_->References(*n[0]), 1);
  EXPECT_THAT(Drain(), ElementsAre(n[1], n[2], n[0]));
}

TEST_F(LruKPolicyTest, CorrelatedUsesAddNoReference) {
  IndexNode* a = Add(1);
  Advance(absl::Milliseconds(500));
  policy_->Touch(a);  // 0.5 s after the insert: correlated
  EXPECT_EQ(policy_->References(*a), 1);
  Advance(absl::Milliseconds(900));
  policy_->Touch(a);  // 0.9 s after the previous use: still correlated
  EXPECT_EQ(policy_->References(*a), 1);
  Advance(absl::Milliseconds(1000));
  policy_->Touch(a);  // a full period after the previous use
  EXPECT_EQ(policy_->References(*a), 2);

  Reset({.correlated_period = absl::ZeroDuration()});
  IndexNode* b = Add(2);
  policy_->Touch(b);  // with no period every use counts, even in the same millisecond
  EXPECT_EQ(policy_->References(*b), 2);
}

TEST_F(LruKPolicyTest, CorrelatedUseKeepsTheKthReference) {
  // a: references at 0 and 2 s, then a burst up to 2.5 s; b: at 1 and
  // 2.05 s. The burst makes a the most recently used but leaves its HIST(2)
  // at 0 s.
  IndexNode* a = Add(1);
  Advance(absl::Seconds(1));
  IndexNode* b = Add(2);
  Advance(absl::Seconds(1));
  policy_->Touch(a);
  Advance(absl::Milliseconds(50));
  policy_->Touch(b);
  EXPECT_EQ(policy_->References(*b), 2);
  for (int i = 0; i < 5; ++i) {
    Advance(absl::Milliseconds(100));
    policy_->Touch(a);
  }
  EXPECT_EQ(policy_->References(*a), 2);
  EXPECT_EQ(policy_->PickVictim(All), a);
}

TEST_F(LruKPolicyTest, PriorityBuysTimeAtPriorityStep) {
  // Same references (0 s and 10 s); priority 1 is worth priority_step (1 min).
  IndexNode* low = Add(1, kUnspecified, 0);
  IndexNode* high = Add(2, kUnspecified, 1);
  Advance(absl::Seconds(10));
  policy_->Touch(high);
  policy_->Touch(low);  // low is the more recently used
  EXPECT_EQ(policy_->PickVictim(All), low);

  // A K-th reference 2 minutes later beats one unit of priority.
  Advance(absl::Minutes(2));
  IndexNode* later = Add(3);
  Advance(absl::Seconds(10));
  policy_->Touch(later);
  policy_->Erase(low);
  EXPECT_EQ(policy_->PickVictim(All), high);
  // Negative priorities go sooner.
  IndexNode* negative = Add(4, kUnspecified, -3);
  Advance(absl::Seconds(10));
  policy_->Touch(negative);
  EXPECT_EQ(policy_->PickVictim(All), negative);
}

TEST_F(LruKPolicyTest, ImportanceBuysTimeAtImportanceStep) {
  // a's 2nd reference is 3 min later than b's, b has priority 4 (4 min):
  // b stays. Importance 1 on a adds 5 min: a stays. Half of it: 2.5 min.
  IndexNode* b = Add(2, kUnspecified, 4);
  Advance(absl::Seconds(10));
  policy_->Touch(b);
  Advance(absl::Minutes(3));
  IndexNode* a = Add(1);
  Advance(absl::Seconds(10));
  policy_->Touch(a);
  EXPECT_EQ(policy_->PickVictim(All), a);
  policy_->SetImportance(a, 1.0f);
  EXPECT_FLOAT_EQ(a->importance(), 1.0f);
  EXPECT_EQ(policy_->PickVictim(All), b);
  policy_->SetImportance(a, 0.5f);  // 3 + 2.5 > 4
  EXPECT_EQ(policy_->PickVictim(All), b);
  policy_->SetImportance(a, 0.1f);  // 3 + 0.5 < 4
  EXPECT_EQ(policy_->PickVictim(All), a);
  policy_->SetImportance(a, 7.0f);  // clamped to 1
  EXPECT_FLOAT_EQ(a->importance(), 1.0f);
  EXPECT_EQ(policy_->size(), 2u);
  EXPECT_THAT(Drain(), ElementsAre(b, a));
}

TEST_F(LruKPolicyTest, FinitePenaltyLetsARecentNewcomerStay) {
  Reset({.fewer_than_k_penalty = absl::Seconds(10)});
  IndexNode* old = Add(1);
  Advance(absl::Seconds(5));
  policy_->Touch(old);  // HIST(2) = 0 s
  Advance(absl::Minutes(1));
  IndexNode* newcomer = Add(2);  // one reference at 65 s: ranks at 55 s
  EXPECT_EQ(policy_->PickVictim(All), old);

  Reset({.fewer_than_k_penalty = absl::InfiniteDuration()});  // the newcomer goes first
  old = Make(3);
  policy_->Insert(old);
  Advance(absl::Seconds(5));
  policy_->Touch(old);
  Advance(absl::Minutes(1));
  newcomer = Make(4);
  policy_->Insert(newcomer);
  EXPECT_EQ(policy_->PickVictim(All), newcomer);
}

TEST_F(LruKPolicyTest, SkipsBlocksThePredicateRejectsInRankOrder) {
  // A chain used as the Cache uses it (path touched leaf first): only the
  // leaf is evictable, and the walk from the coldest block finds it first.
  IndexNode* a = Add(1);
  IndexNode* b = Add(2, kUnspecified, 0, a);
  IndexNode* c = Add(3, kUnspecified, 0, b);
  IndexNode* other = Add(9);
  for (int round = 0; round < 3; ++round) {
    Advance(absl::Seconds(3));
    for (IndexNode* n : {c, b, a}) policy_->Touch(n);
  }
  std::vector<const IndexNode*> asked;
  auto leaf_not_other = [&](const IndexNode& n) {
    asked.push_back(&n);
    return n.is_leaf() && &n != other;
  };
  EXPECT_EQ(policy_->PickVictim(leaf_not_other), c);
  EXPECT_THAT(asked, ElementsAre(other, c));  // other has one reference: coldest
  for (IndexNode* expected : {c, b, a}) {
    IndexNode* victim = policy_->PickVictim(leaf_not_other);
    ASSERT_EQ(victim, expected);
    policy_->Erase(victim);
    index_.RemoveSubtree(victim, [](IndexNode*) {});
  }
  EXPECT_EQ(policy_->PickVictim(leaf_not_other), nullptr);
  EXPECT_EQ(policy_->PickVictim(All), other);
}

TEST_F(LruKPolicyTest, ParentsRankedBeforeTheirChildrenAreWalkedOnce) {
  // p: references at 0 and 5 s, then with its new child c an hour later
  // (HIST(2) = 5 s); c: one reference (ranks at 1 h - 10 min). p ranks first
  // but has a child.
  IndexNode* p = Add(1);
  Advance(absl::Seconds(5));
  policy_->Touch(p);
  Advance(absl::Hours(1));
  IndexNode* c = Add(2, kUnspecified, 0, p);
  for (IndexNode* n : {c, p}) policy_->Touch(n);
  IndexNode* other = Add(3);
  std::vector<const IndexNode*> asked;
  auto leaf = [&](const IndexNode& n) {
    asked.push_back(&n);
    return n.is_leaf();
  };
  EXPECT_EQ(policy_->PickVictim(leaf), c);
  EXPECT_THAT(asked, ElementsAre(p, c));
  asked.clear();
  EXPECT_EQ(policy_->PickVictim(leaf), c);
  EXPECT_THAT(asked, ElementsAre(c));  // p was set aside
  // A predicate that wants p still finds it, behind the others.
  EXPECT_EQ(policy_->PickVictim([&](const IndexNode& n) { return &n == p; }), p);
  EXPECT_EQ(policy_->size(), 3u);
  // Erasing its child puts p back at its own rank: first.
  policy_->Erase(c);
  index_.RemoveSubtree(c, [](IndexNode*) {});
  EXPECT_EQ(policy_->PickVictim(leaf), p);
  EXPECT_THAT(Drain(), ElementsAre(p, other));
}

TEST_F(LruKPolicyTest, OptionsAreValidated) {
  EXPECT_TRUE(LruKOptions{}.Validate().ok());
  EXPECT_FALSE(LruKOptions{.default_k = 0}.Validate().ok());
  EXPECT_FALSE(LruKOptions{.document_k = 5}.Validate().ok());
  EXPECT_FALSE(LruKOptions{.correlated_period = absl::Seconds(-1)}.Validate().ok());
  EXPECT_FALSE(LruKOptions{.priority_step = absl::Hours(25)}.Validate().ok());
  EXPECT_FALSE(LruKOptions{.fewer_than_k_penalty = absl::Seconds(-1)}.Validate().ok());
  EXPECT_TRUE(LruKOptions{.fewer_than_k_penalty = absl::ZeroDuration()}.Validate().ok());
  EXPECT_TRUE(LruKOptions{.probation_share = 0.9}.Validate().ok());
  EXPECT_FALSE(LruKOptions{.probation_share = 0.95}.Validate().ok());
  EXPECT_FALSE(LruKOptions{.probation_share = -0.1}.Validate().ok());
  EXPECT_FALSE(LruKOptions{.probation_share = std::nan("")}.Validate().ok());
  EXPECT_THAT(std::string(LruKOptions{.code_k = 9}.Validate().message()),
              ::testing::HasSubstr("code_k"));
}

TEST_F(LruKPolicyTest, NodeGrowsByAtMost32Bytes) {
  // The policy hook was LRU's two links (16 bytes) before LRU-K; the rest of
  // the node (its tiers' copies) is counted by Cache::NodeMetadataBytes, which
  // uses sizeof(IndexNode). 216: one copy slot per lower level
  // (kMaxLowerLevels, 16 bytes each) took it from 200.
  EXPECT_LE(sizeof(IndexNode::PolicyHook), 16u + 32u);
  EXPECT_EQ(sizeof(IndexNode::PolicyHook), 40u);
  EXPECT_LE(sizeof(IndexNode), 184u + 16u * kMaxLowerLevels);
}

TEST_F(LruKPolicyTest, MatchesAReferenceModel) { RunModel(0, 11); }

TEST_F(LruKPolicyTest, WithProbationMatchesAReferenceModel) {
  for (uint32_t seed : {11u, 12u, 13u}) RunModel(0.3, seed);
}

}  // namespace

// The model (LruKPolicyTest::RunModel declares it).
void LruKPolicyTest::RunModel(double probation_share, uint32_t seed) {
  const LruKOptions options{.correlated_period = absl::Milliseconds(300),
                            .retained_history = 8,
                            .fewer_than_k_penalty = absl::Seconds(20),
                            .probation_share = probation_share};
  Reset(options);
  struct Model {
    std::vector<int64_t> refs;  // uncorrelated references, newest last
    int64_t last = 0;
    uint64_t seq = 0;
    bool tracked = false;
    bool main = false;  // in the main segment (always, without probation)
  };
  std::mt19937 rng(seed);
  std::vector<IndexNode*> nodes;
  for (uint32_t i = 0; i < 24; ++i) {
    nodes.push_back(Make((seed - 11) * 100 + i + 1, static_cast<uint8_t>(rng() % 4),
                         static_cast<int32_t>(rng() % 3)));
  }
  std::map<uint64_t, Model> model;  // by key: retained history included
  std::vector<uint64_t> erased;     // retained keys, least recently erased first
  uint64_t seq = 0;
  auto now_ms = [&] { return absl::ToUnixMillis(clock_.Now()); };
  // Returns whether the use was an uncorrelated reference.
  auto use = [&](Model& m) {
    const int64_t t = now_ms();
    const bool uncorrelated = m.refs.empty() || t - m.last >= 300;
    if (uncorrelated) m.refs.push_back(t);
    m.last = t;
    m.seq = ++seq;
    return uncorrelated;
  };
  auto hinted = [](const IndexNode& n) { return n.priority > 0 || n.importance() >= 0.5f; };
  auto rank = [&](const IndexNode& n, const Model& m) {
    const size_t k = static_cast<size_t>(options.KFor(n.workload));
    const int64_t base = m.refs.size() >= k ? m.refs[m.refs.size() - k] : m.last - 20000;
    return base + int64_t{n.priority} * 60000 +
           std::llround(static_cast<double>(n.importance()) * 300000.0);
  };
  for (int step = 0; step < 3000; ++step) {
    clock_.Advance(absl::Milliseconds(rng() % 700));
    IndexNode* n = nodes[rng() % nodes.size()];
    Model& m = model[n->key];
    const int op = static_cast<int>(rng() % 10);
    if (!m.tracked) {
      // A retained history resumes (and is no longer retained).
      auto pos = std::find(erased.begin(), erased.end(), n->key);
      if (pos != erased.end()) erased.erase(pos);
      policy_->Insert(n);
      m.tracked = true;
      use(m);
      m.main = probation_share == 0 || m.refs.size() >= 2 || hinted(*n);
    } else if (op < 6) {
      policy_->Touch(n);
      if (use(m)) m.main = true;
    } else if (op < 8) {
      policy_->Erase(n);
      m.tracked = false;
      m.main = false;
      erased.push_back(n->key);
      if (erased.size() > 8) {  // the least recently erased history is forgotten
        model[erased.front()].refs.clear();
        erased.erase(erased.begin());
      }
    } else {
      policy_->SetImportance(n, static_cast<float>(rng() % 5) / 4);
      if (hinted(*n)) m.main = true;
    }
    size_t tracked = 0, on_probation = 0;
    for (IndexNode* c : nodes) {
      const Model& cm = model[c->key];
      tracked += cm.tracked;
      on_probation += cm.tracked && !cm.main;
    }
    ASSERT_EQ(policy_->probation_size(), on_probation) << "step " << step;
    const bool probation_first =
        on_probation > 0 &&
        (on_probation == tracked || static_cast<double>(on_probation) > probation_share * tracked);
    const IndexNode* expected = nullptr;
    for (IndexNode* c : nodes) {
      const Model& cm = model[c->key];
      if (!cm.tracked || cm.main == probation_first) continue;
      if (expected == nullptr) {
        expected = c;
        continue;
      }
      const Model& em = model[expected->key];
      const int64_t rc = rank(*c, cm), re = rank(*expected, em);
      if (rc < re || (rc == re && cm.seq < em.seq)) expected = c;
    }
    if (expected == nullptr) {  // the other segment
      for (IndexNode* c : nodes) {
        const Model& cm = model[c->key];
        if (!cm.tracked) continue;
        const Model* em = expected == nullptr ? nullptr : &model[expected->key];
        if (em == nullptr || rank(*c, cm) < rank(*expected, *em) ||
            (rank(*c, cm) == rank(*expected, *em) && cm.seq < em->seq)) {
          expected = c;
        }
      }
    }
    ASSERT_EQ(policy_->PickVictim(All), expected) << "step " << step;
    if (m.tracked) {
      ASSERT_EQ(policy_->References(*n),
                std::min<int>(static_cast<int>(m.refs.size()), LruKOptions::kMaxK))
          << "step " << step;
    }
  }
}

}  // namespace lru_k_test
}  // namespace kvcache
