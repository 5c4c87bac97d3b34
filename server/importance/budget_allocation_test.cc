#include "server/importance/budget_allocation.h"

#include <algorithm>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "gtest/gtest.h"

namespace kvcache::importance {
namespace {

using P = TokenPrecision;

std::string MapString(const std::vector<P>& p) {
  std::string s;
  for (P v : p) s += static_cast<char>('0' + static_cast<int>(v));
  return s;
}

// tests/eval/kv_policies.py allocate() on one block of 2 layers x 2 KV heads x
// 16 tokens (head_dim 8, fp16): scores k/8 with ties, sinks (2) protected, the
// recent window (4) ranked first (ours(recent_fp16=False)). The maps below are
// what the reference returned for each budget.
TEST(AllocateBudgetTest, MatchesTheEvaluationReference) {
  const BlockShape shape{2, 2, 8, 16, 1};
  const std::vector<int> eighths = {1, 2, 6, 5, 1, 3, 4, 1, 6, 1, 3, 4, 3, 5, 6, 8,
                                    2, 5, 6, 2, 0, 8, 2, 3, 7, 5, 4, 6, 0, 6, 3, 1,
                                    5, 7, 2, 5, 2, 6, 6, 2, 7, 5, 5, 7, 3, 6, 7, 1,
                                    7, 3, 4, 1, 6, 2, 7, 2, 4, 3, 5, 2, 1, 6, 6, 5};
  std::vector<float> scores;
  for (int e : eighths) scores.push_back(e / 8.0f);
  std::vector<uint8_t> fixed(64, 0), first(64, 0);
  for (size_t i = 0; i < 64; ++i) {
    fixed[i] = i % 16 < 2;
    first[i] = i % 16 >= 12;
  }
  struct Case {
    double budget;
    uint64_t bytes;
    const char* map;
  };
  const std::vector<Case> cases = {
      {0.02, 320, "0022222222222222002222222222222200222222222222220022222222222222"},
      {0.1, 320, "0022222222222222002222222222222200222222222222220022222222222222"},
      {0.2, 400, "0022222222222222002222222222222200222222222222220022222222223333"},
      {0.3, 604, "0022222222222223002222222222333300222222222233330022222222223333"},
      {0.37, 748, "0022222222223333002223223223333300222332322333330022323222223333"},
      {0.5, 1024, "0033233232333333003223233333333300233333333333330032333333333333"},
      {0.6, 1228, "0033333333333333003333333333331100333333333311110033333333331111"},
      {0.9, 1828, "0001111101110000000110110110000000111001000000000011010111010000"},
      {1.0, 2044, "0000100101000000000110100000000000101001000000000001000000000000"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.budget);
    const absl::StatusOr<BudgetAllocation> a =
        AllocateBudget(shape, scores, fixed, first, c.budget * 2048);
    ASSERT_TRUE(a.ok()) << a.status();
    EXPECT_EQ(MapString(a->precision), c.map);
    EXPECT_EQ(a->bytes, c.bytes);
    EXPECT_EQ(a->fits, c.budget > 0.1);
    EXPECT_EQ(a->bytes, *CompressedSizeV2(shape, a->precision));
  }
}

TEST(AllocateBudgetTest, BudgetMetOrderRespectedProtectedFull) {
  const BlockShape shape{3, 2, 16, 8, 2};
  const size_t n = shape.entries();
  std::vector<float> scores(n);
  for (size_t i = 0; i < n; ++i) scores[i] = static_cast<float>((i * 37) % 23) / 23.0f;
  std::vector<uint8_t> fixed(n, 0), first(n, 0);
  fixed[5] = fixed[17] = 1;
  first[7] = first[15] = 1;
  for (double target : {0.15, 0.25, 0.37, 0.5, 0.7, 0.95}) {
    SCOPED_TRACE(target);
    const double budget = target * static_cast<double>(shape.raw_bytes());
    const absl::StatusOr<BudgetAllocation> a = AllocateBudget(shape, scores, fixed, first, budget);
    ASSERT_TRUE(a.ok());
    EXPECT_TRUE(a->fits);
    EXPECT_LE(static_cast<double>(a->bytes), budget);
    EXPECT_EQ(a->precision[5], P::kFull);
    EXPECT_EQ(a->precision[17], P::kFull);
    // A precision's rank: pruned < int4 < int8 < full. A more important free
    // entry (the recent ones first) never gets a lower rank than a less important one.
    auto rank = [](P p) { return p == P::kPruned ? 0 : p == P::kInt4 ? 1 : p == P::kInt8 ? 2 : 3; };
    for (size_t i = 0; i < n; ++i) {
      for (size_t j = 0; j < n; ++j) {
        if (fixed[i] || fixed[j]) continue;
        const bool j_above = first[j] > first[i] || (first[j] == first[i] && scores[j] > scores[i]);
        if (j_above) {
          EXPECT_GE(rank(a->precision[j]), rank(a->precision[i])) << i << " " << j;
        }
      }
    }
  }
}

TEST(AllocateBudgetTest, NothingFitsStoresFullyPruned) {
  const BlockShape shape{1, 1, 8, 4, 1};
  const std::vector<float> scores = {0.1f, 0.9f, 0.5f, 0.2f};
  const std::vector<uint8_t> fixed = {1, 0, 0, 0};
  const absl::StatusOr<BudgetAllocation> a = AllocateBudget(shape, scores, fixed, {}, 10);
  ASSERT_TRUE(a.ok());
  EXPECT_FALSE(a->fits);
  EXPECT_EQ(MapString(a->precision), "0222");
  EXPECT_EQ(a->pruned, 3u);
}

TEST(AllocateBudgetTest, MismatchedSizesAreInvalidArgument) {
  const BlockShape shape{1, 2, 8, 4, 1};
  const std::vector<float> scores(8, 0.5f);
  EXPECT_EQ(AllocateBudget(shape, std::vector<float>(7), {}, {}, 100).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(AllocateBudget(shape, scores, std::vector<uint8_t>(3), {}, 100).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(AllocateBudget(shape, scores, {}, std::vector<uint8_t>(9), 100).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(AllocateBudget(BlockShape{}, scores, {}, {}, 100).status().code(),
            absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace kvcache::importance
