#include "server/common/token_bucket.h"

#include "gtest/gtest.h"

namespace kvcache {
namespace {

const absl::Time kStart = absl::FromUnixSeconds(1000);

TEST(TokenBucketTest, UnlimitedTakesEverythingAtOnce) {
  TokenBucket bucket(0);
  EXPECT_TRUE(bucket.unlimited());
  EXPECT_TRUE(bucket.TryTake(uint64_t{1} << 40, kStart));
  EXPECT_EQ(bucket.Take(uint64_t{1} << 40, kStart), absl::ZeroDuration());
}

TEST(TokenBucketTest, StartsFullAndRefusesPastItsBalance) {
  TokenBucket bucket(1000);
  EXPECT_TRUE(bucket.TryTake(600, kStart));
  EXPECT_FALSE(bucket.TryTake(600, kStart));  // 400 left: refused, nothing taken
  EXPECT_TRUE(bucket.TryTake(400, kStart));
  EXPECT_FALSE(bucket.TryTake(1, kStart));
  // Half a second refills 500, never past one second's worth.
  EXPECT_TRUE(bucket.TryTake(500, kStart + absl::Milliseconds(500)));
  EXPECT_FALSE(bucket.TryTake(1001, kStart + absl::Seconds(100)));
  EXPECT_TRUE(bucket.TryTake(1000, kStart + absl::Seconds(100)));
}

TEST(TokenBucketTest, TakeGoesIntoDebtAndSaysHowLongToWait) {
  TokenBucket bucket(1000);
  EXPECT_EQ(bucket.Take(1000, kStart), absl::ZeroDuration());  // the first second's worth
  EXPECT_EQ(bucket.Take(500, kStart), absl::Milliseconds(500));
  // A writer that waits as told runs at the rate: 500 more after the wait
  // puts it 500 behind again.
  EXPECT_EQ(bucket.Take(500, kStart + absl::Milliseconds(500)), absl::Milliseconds(500));
  // A clock that goes back refills nothing.
  EXPECT_EQ(bucket.Take(100, kStart), absl::Milliseconds(600));
}

}  // namespace
}  // namespace kvcache
