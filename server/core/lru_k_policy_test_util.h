// Shared helpers for the LRU-K policy's unit tests (lru_k_policy_test.cc,
// lru_k_policy_history_test.cc): blocks in a PrefixIndex with workload and
// priority hints, and the LruKPolicyTest fixture over a ManualClock. Test-only.
#ifndef KVCACHE_SERVER_CORE_LRU_K_POLICY_TEST_UTIL_H_
#define KVCACHE_SERVER_CORE_LRU_K_POLICY_TEST_UTIL_H_

#include <cstdint>
#include <memory>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server/common/clock.h"
#include "server/core/block_test_util.h"
#include "server/core/eviction_policy.h"
#include "server/core/lru_k_policy.h"
#include "server/core/prefix_index.h"

namespace kvcache {
namespace lru_k_test {

using ::testing::ElementsAre;

constexpr uint32_t kBt = 16;
constexpr uint8_t kUnspecified = 0, kChat = 1, kCode = 2, kDocument = 3;

inline std::vector<Token> Block(uint32_t id) {
  std::vector<Token> block(kBt);
  for (uint32_t t = 0; t < kBt; ++t) block[t] = id * 1024 + t;
  return block;
}

inline bool All(const IndexNode&) { return true; }

class LruKPolicyTest : public ::testing::Test {
 protected:
  void SetUp() override {
    payload_ = SealedHeapBlock(std::vector<std::byte>(4096));
    Reset({});
  }

  void Reset(const LruKOptions& options) {
    ASSERT_TRUE(options.Validate().ok()) << options.Validate();
    policy_ = std::make_unique<LruKPolicy>(options, &clock_);
  }

  // A block in the index (not yet tracked) with hints set as an append does.
  IndexNode* Make(uint32_t id, uint8_t workload = kUnspecified, int32_t priority = 0,
                  IndexNode* parent = nullptr) {
    IndexNode* node = index_.AddChild(parent, Block(id), payload_);
    EXPECT_NE(node, nullptr);
    node->workload = workload;
    node->priority = priority;
    return node;
  }
  IndexNode* Add(uint32_t id, uint8_t workload = kUnspecified, int32_t priority = 0,
                 IndexNode* parent = nullptr) {
    IndexNode* node = Make(id, workload, priority, parent);
    policy_->Insert(node);
    return node;
  }

  void Advance(absl::Duration d) { clock_.Advance(d); }

  // The policy against a model that keeps every reference time and ranks by
  // the header's formula, over random inserts, touches, erases, importance
  // changes and clock steps; with probation the model also keeps each
  // block's segment by the header's rules and picks from the segment
  // PickVictim must. Defined in lru_k_policy_test.cc, whose tests run it.
  void RunModel(double probation_share, uint32_t seed);

  std::vector<IndexNode*> Drain() {
    std::vector<IndexNode*> order;
    while (IndexNode* victim = policy_->PickVictim(All)) {
      policy_->Erase(victim);
      order.push_back(victim);
      if (order.size() > 10000) break;
    }
    return order;
  }

  ManualClock clock_;
  BlockRef payload_;
  PrefixIndex index_{kBt};
  std::unique_ptr<LruKPolicy> policy_;  // destroyed before the nodes it points to
};

}  // namespace lru_k_test
}  // namespace kvcache

#endif  // KVCACHE_SERVER_CORE_LRU_K_POLICY_TEST_UTIL_H_
