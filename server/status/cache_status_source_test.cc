// CacheStatusSource over a real Cache: a costly TopPrefixes walk runs at most
// once per kTopPrefixesRefresh, however often it is asked; cheap ones always run.
#include "server/status/cache_status_source.h"

#include <gtest/gtest.h>

#include <numeric>
#include <vector>

#include "server/core/eviction_policy.h"
#include "server/core/slab_pool.h"

namespace kvcache {
namespace {

const ModelKey kModel{"default", "m"};
const ModelLayout kLayout{1, 1, 16, DType::kFp16, 16};  // 1 KiB blocks

class CacheStatusSourceTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto pool = SlabPool::Create({.capacity_bytes = uint64_t{4} << 20,
                                  .slab_bytes = uint64_t{1} << 20,
                                  .min_class_bytes = 64});
    ASSERT_TRUE(pool.ok()) << pool.status();
    cache_ = std::make_unique<Cache>(CacheOptions{}, *std::move(pool), NewLruPolicy(), &clock_);
    ASSERT_TRUE(cache_->RegisterModel(kModel, kLayout).ok());
    // Every walk counts as costly here (the manual clock stands still).
    source_ = std::make_unique<CacheStatusSource>(cache_.get(), StatusIdentity{}, "{}", nullptr,
                                                  nullptr, &clock_, absl::ZeroDuration());
  }
  void AppendSequence(Token first) {
    std::vector<Token> tokens(16);
    std::iota(tokens.begin(), tokens.end(), first);
    auto session = cache_->BeginAppend(kModel, tokens, 0, {}, {});
    ASSERT_TRUE(session.ok()) << session.status();
    ASSERT_TRUE((*session)->Write(std::vector<std::byte>(kLayout.BlockBytes())).ok());
    ASSERT_TRUE((*session)->Commit().ok());
  }

  ManualClock clock_;
  std::unique_ptr<Cache> cache_;
  std::unique_ptr<CacheStatusSource> source_;
};

TEST_F(CacheStatusSourceTest, TopPrefixesIsWalkedAtMostOncePerRefresh) {
  AppendSequence(1);
  EXPECT_EQ(source_->TopPrefixes(10).size(), 1u);
  AppendSequence(1000);
  // Within the refresh: the last walk's answer, however often it is asked.
  EXPECT_EQ(source_->TopPrefixes(10).size(), 1u);
  clock_.Advance(CacheStatusSource::kTopPrefixesRefresh - absl::Milliseconds(1));
  EXPECT_EQ(source_->TopPrefixes(10).size(), 1u);
  EXPECT_EQ(source_->TopPrefixes(1).size(), 1u);  // fewer: a slice of it
  // A longer list than was walked, or the refresh passed: walked again.
  EXPECT_EQ(source_->TopPrefixes(11).size(), 2u);
  AppendSequence(2000);
  clock_.Advance(CacheStatusSource::kTopPrefixesRefresh);
  EXPECT_EQ(source_->TopPrefixes(11).size(), 3u);
}

TEST_F(CacheStatusSourceTest, CheapWalksAreNeverReused) {
  CacheStatusSource fresh(cache_.get(), StatusIdentity{}, "{}", nullptr, nullptr, &clock_,
                          absl::Milliseconds(1));
  EXPECT_EQ(fresh.TopPrefixes(10).size(), 0u);
  AppendSequence(1);
  EXPECT_EQ(fresh.TopPrefixes(10).size(), 1u);  // no clock advance needed
}

}  // namespace
}  // namespace kvcache
