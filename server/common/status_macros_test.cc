#include "server/common/status_macros.h"

#include <gtest/gtest.h>

#include <memory>
#include <string>

namespace kvcache {
namespace {

absl::Status Fails(int* calls) {
  ++*calls;
  return absl::DataLossError("torn");
}

absl::Status Succeeds(int* calls) {
  ++*calls;
  return absl::OkStatus();
}

absl::Status Propagate(bool fail, int* calls, bool* reached_end) {
  KVCACHE_RETURN_IF_ERROR(Succeeds(calls));
  if (fail) KVCACHE_RETURN_IF_ERROR(Fails(calls));
  *reached_end = true;
  return absl::OkStatus();
}

TEST(StatusMacrosTest, ReturnIfErrorReturnsTheErrorAndEvaluatesOnce) {
  int calls = 0;
  bool reached_end = false;
  absl::Status s = Propagate(/*fail=*/true, &calls, &reached_end);
  EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss);
  EXPECT_EQ(s.message(), "torn");
  EXPECT_EQ(calls, 2);
  EXPECT_FALSE(reached_end);

  calls = 0;
  EXPECT_TRUE(Propagate(/*fail=*/false, &calls, &reached_end).ok());
  EXPECT_EQ(calls, 1);
  EXPECT_TRUE(reached_end);
}

absl::StatusOr<std::unique_ptr<std::string>> MakeName(bool fail) {
  if (fail) return absl::NotFoundError("no name");
  return std::make_unique<std::string>("kv");
}

absl::StatusOr<size_t> NameLengthTwice(bool fail_first, bool fail_second) {
  // Two in one scope: the hidden StatusOr names must not collide.
  KVCACHE_ASSIGN_OR_RETURN(std::unique_ptr<std::string> a, MakeName(fail_first));
  KVCACHE_ASSIGN_OR_RETURN(auto b, MakeName(fail_second));  // a move-only value
  return a->size() + b->size();
}

TEST(StatusMacrosTest, AssignOrReturnAssignsTheValueOrReturnsTheError) {
  absl::StatusOr<size_t> ok = NameLengthTwice(false, false);
  ASSERT_TRUE(ok.ok()) << ok.status();
  EXPECT_EQ(*ok, 4u);
  EXPECT_EQ(NameLengthTwice(true, false).status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(NameLengthTwice(false, true).status().message(), "no name");
}

absl::Status AssignIntoExisting(std::string* out) {
  std::unique_ptr<std::string> name;
  KVCACHE_ASSIGN_OR_RETURN(name, MakeName(false));
  *out = *name;
  return absl::OkStatus();
}

TEST(StatusMacrosTest, AssignOrReturnIntoAnExistingVariable) {
  std::string out;
  ASSERT_TRUE(AssignIntoExisting(&out).ok());
  EXPECT_EQ(out, "kv");
}

}  // namespace
}  // namespace kvcache
