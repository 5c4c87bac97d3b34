// ModelRegistry: max_models, daemon-wide and as each namespace's share.
#include "server/core/model_registry.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <memory>
#include <string>

namespace kvcache {
namespace {

using ::testing::HasSubstr;

std::unique_ptr<ModelState> State(const std::string& ns, const std::string& id) {
  return std::make_unique<ModelState>(ModelKey{ns, id}, ModelLayout{.block_tokens = 16},
                                      ImportancePolicy{}, 0);
}

TEST(ModelRegistryTest, MaxModelsRefusesAndAddsNothing) {
  ModelRegistry r(2);
  ASSERT_TRUE(r.Add(State("a", "1")).ok());
  ASSERT_TRUE(r.Add(State("a", "2")).ok());
  auto third = r.Add(State("b", "1"));
  EXPECT_EQ(third.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(std::string(third.status().message()), HasSubstr("max_models (2)"));
  EXPECT_EQ(r.size(), 2u);
}

TEST(ModelRegistryTest, ANamespacePastItsShareIsRefusedAndLeavesOthersRoom) {
  ModelRegistry r(5, 0.5);  // each namespace: 2 models
  ASSERT_TRUE(r.Add(State("tenant-a", "1")).ok());
  ASSERT_TRUE(r.Add(State("tenant-a", "2")).ok());
  auto third = r.Add(State("tenant-a", "3"));
  EXPECT_EQ(third.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(std::string(third.status().message()),
              HasSubstr("namespace \"tenant-a\" holds 2 models; 1 more would pass its share 2 "
                        "(limits.max_models 5 x security.tenant_limits.max_share 0.5)"));
  EXPECT_EQ(r.Find({"tenant-a", "3"}), nullptr);
  EXPECT_EQ(r.size_of("tenant-a"), 2u);
  ASSERT_TRUE(r.Add(State("tenant-b", "1")).ok());
  ASSERT_TRUE(r.Add(State("tenant-b", "2")).ok());
  // Removing one gives its place back.
  ASSERT_NE(r.Remove({"tenant-a", "1"}), nullptr);
  EXPECT_EQ(r.size_of("tenant-a"), 1u);
  EXPECT_TRUE(r.Add(State("tenant-a", "3")).ok());
}

TEST(ModelRegistryTest, ATinyShareStillAllowsOneModel) {
  ModelRegistry r(3, 0.1);
  EXPECT_TRUE(r.Add(State("a", "1")).ok());
  EXPECT_EQ(r.Add(State("a", "2")).status().code(), absl::StatusCode::kResourceExhausted);
}

}  // namespace
}  // namespace kvcache
