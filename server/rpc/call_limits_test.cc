#include "server/rpc/call_limits.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

namespace kvcache {
namespace {

using ::testing::HasSubstr;

TEST(StreamLimiterTest, CapsEachPeerAndTheTotal) {
  StreamLimiter limiter(/*max_total=*/3, /*max_per_client=*/2);
  std::string_view limit;
  ASSERT_TRUE(limiter.Acquire("ipv4:10.0.0.1:1000").ok());
  ASSERT_TRUE(limiter.Acquire("ipv4:10.0.0.1:1000").ok());
  absl::Status third = limiter.Acquire("ipv4:10.0.0.1:1000", &limit);
  EXPECT_EQ(third.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(std::string(third.message()), HasSubstr("max_streams_per_client (2)"));
  EXPECT_THAT(std::string(third.message()), HasSubstr("ipv4:10.0.0.1:1000"));
  EXPECT_EQ(limit, "max_streams_per_client");
  EXPECT_EQ(limiter.active("ipv4:10.0.0.1:1000"), 2);

  // Another client still gets a slot, until the total is reached.
  ASSERT_TRUE(limiter.Acquire("ipv4:10.0.0.2:2000").ok());
  absl::Status full = limiter.Acquire("ipv4:10.0.0.3:3000", &limit);
  EXPECT_EQ(full.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(std::string(full.message()), HasSubstr("max_concurrent_streams (3)"));
  EXPECT_EQ(limit, "max_concurrent_streams");
  EXPECT_EQ(limiter.active(), 3);

  limiter.Release("ipv4:10.0.0.1:1000");
  EXPECT_TRUE(limiter.Acquire("ipv4:10.0.0.3:3000").ok());
  limiter.Release("ipv4:10.0.0.3:3000");
  limiter.Release("ipv4:10.0.0.2:2000");
  limiter.Release("ipv4:10.0.0.1:1000");
  EXPECT_EQ(limiter.active(), 0);
  EXPECT_EQ(limiter.active("ipv4:10.0.0.1:1000"), 0);
  limiter.Release("ipv4:10.0.0.9:9");  // never acquired: ignored
  EXPECT_EQ(limiter.active(), 0);
}

TEST(UnaryLimiterTest, RefusesPastTheLimitAndRecovers) {
  UnaryLimiter limiter(2);
  ASSERT_TRUE(limiter.Acquire().ok());
  ASSERT_TRUE(limiter.Acquire().ok());
  absl::Status s = limiter.Acquire();
  EXPECT_EQ(s.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(std::string(s.message()), HasSubstr("max_concurrent_unary (2)"));
  limiter.Release();
  EXPECT_TRUE(limiter.Acquire().ok());
  EXPECT_EQ(limiter.in_flight(), 2);
}

}  // namespace
}  // namespace kvcache
