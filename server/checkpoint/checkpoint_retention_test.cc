// The SSD tier's retention as checkpoints commit and fail over a Cache whose
// SSD tier churns (docs/checkpoints.md, "How retention and the SSD tier
// interact"): while every checkpoint fails (the disk under checkpoint.dir is
// full, injected below the file layer), retention holds no more than the
// newest committed checkpoint lists and demotions keep finding room; a
// checkpoint that lists the whole tier gives way past the retained share.
#include <gtest/gtest.h>

#include <filesystem>
#include <memory>
#include <string>

#include "server/checkpoint/checkpoint_service.h"
#include "server/checkpoint/checkpointer.h"
#include "server/checkpoint/fault_injecting_file_system.h"
#include "server/core/cache_test_util.h"
#include "server/tier/ssd_tier.h"

namespace kvcache::checkpoint {
namespace {

using cache_test::Append;
using cache_test::Big;
using cache_test::Ids;
using cache_test::kSlab;
using cache_test::Seq;

constexpr uint64_t kSsdBytes = uint64_t{1} << 20;  // 16 regions of 64 KiB
constexpr uint64_t kFootprint = 12 << 10;          // an 8 KiB block's slot: 80 slots

class CheckpointRetentionTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = ::testing::TempDir() + "/checkpoint_retention_test_" +
           ::testing::UnitTest::GetInstance()->current_test_info()->name();
    std::filesystem::remove_all(dir_);
    std::filesystem::create_directories(dir_);
  }
  void TearDown() override {
    checkpointer_.reset();
    service_.reset();
    cache_.reset();
    lower_.reset();
    std::filesystem::remove_all(dir_);
  }

  // A host tier of 32 blocks (8 KiB, Big) over an SSD tier of 80, with
  // retention on as the checkpoint service sets it for `share`.
  void Make(double share) {
    SsdStoreOptions ssd;
    ssd.path = dir_ + "/ssd.bin";
    ssd.capacity_bytes = kSsdBytes;
    ssd.region_bytes = 64 << 10;
    ssd.direct_io = false;
    auto lower = OpenSsdTier(ssd);
    ASSERT_TRUE(lower.ok()) << lower.status();
    lower_ = *std::move(lower);
    auto pool =
        SlabPool::Create({.capacity_bytes = 4 * kSlab, .slab_bytes = kSlab, .min_class_bytes = 64});
    ASSERT_TRUE(pool.ok()) << pool.status();
    cache_ = std::make_unique<Cache>(CacheOptions{}, *std::move(pool), NewLruKPolicy({}, &clock_),
                                     &clock_, lower_, NewLruKPolicy({}, &clock_));
    ASSERT_TRUE(cache_->RegisterModel(Big().key, Big().layout).ok());
    const CheckpointerOptions options{.dir = dir_ + "/ckpt"};
    auto service = CheckpointService::Open(
        cache_.get(), &fs_,
        {.checkpointer = options, .interval = absl::ZeroDuration(), .lower_retained_share = share});
    ASSERT_TRUE(service.ok()) << service.status();
    service_ = *std::move(service);
    checkpointer_ = std::make_unique<Checkpointer>(cache_.get(), &fs_, options, 1);
  }

  // Appends sequences [first, first + n) of 4 blocks each; the host tier
  // demotes to make room and the SSD tier evicts its coldest.
  void AppendSequences(uint32_t first, uint32_t n) {
    for (uint32_t s = first; s < first + n; ++s) {
      Ids ids;
      for (uint32_t b = 0; b < 4; ++b) ids.push_back(s * 100 + b + 1);
      auto r = Append(*cache_, Big(), Seq(ids));
      ASSERT_TRUE(r.ok()) << "sequence " << s << ": " << r.status();
    }
  }

  // A checkpoint that fails: the disk is full for its first write.
  void FailedCheckpoint() {
    fs_.AddFault({.kind = FaultKind::kNoSpace, .path_contains = "", .nth = 1});
    auto run = checkpointer_->Run();
    EXPECT_FALSE(run.ok()) << "the checkpoint committed despite a full disk";
    fs_.ClearFaults();
  }

  TierStats Lower() const { return lower_->GetStats(); }
  TierCounters Tiers() const { return cache_->GetStats().tiers; }

  ManualClock clock_;
  std::string dir_;
  FaultInjectingFileSystem fs_{DefaultFileSystem()};
  std::shared_ptr<Tier> lower_;
  std::unique_ptr<Cache> cache_;
  std::unique_ptr<CheckpointService> service_;
  std::unique_ptr<Checkpointer> checkpointer_;
};

// Retained space is never reused here (share 1), so what stays retained is
// what retention decided: after the last commit, only the copies it lists,
// however many checkpoints fail and however much the tier churns.
TEST_F(CheckpointRetentionTest, FailingCheckpointsRetainNoMoreThanTheLastCommitListed) {
  ASSERT_NO_FATAL_FAILURE(Make(/*share=*/1.0));
  ASSERT_NO_FATAL_FAILURE(AppendSequences(0, 12));  // 48 blocks: 32 in host memory
  auto committed = checkpointer_->Run();
  ASSERT_TRUE(committed.ok()) << committed.status();
  const uint64_t listed = committed->lower_copies;
  ASSERT_GT(listed, 0u);
  ASSERT_LT(listed * 2, kSsdBytes / kFootprint) << "the test needs a commit listing few copies";

  uint32_t next = 12;
  for (int round = 0; round < 6; ++round) {
    SCOPED_TRACE(::testing::Message() << "round " << round);
    ASSERT_NO_FATAL_FAILURE(FailedCheckpoint());
    const uint64_t demotions = Tiers().lower[0].demotions;
    ASSERT_NO_FATAL_FAILURE(AppendSequences(next, 30));  // 120 blocks: the SSD tier turns over
    next += 30;
    EXPECT_GT(Tiers().lower[0].demotions, demotions + 60);
    const TierStats lower = Lower();
    EXPECT_LE(lower.retained_bytes, listed * kFootprint);
    EXPECT_EQ(Tiers().lower[0].write_failures, 0u) << "retained space filled the tier";
  }
  EXPECT_GT(Tiers().lower[0].evictions, 0u);
  EXPECT_EQ(Lower().retained_reused, 0u);

  // A checkpoint that commits at last releases what the old one listed.
  auto recovered = checkpointer_->Run();
  ASSERT_TRUE(recovered.ok()) << recovered.status();
  EXPECT_EQ(Lower().retained_bytes, 0u);
}

// With the default share, a commit that lists the whole tier keeps at most
// that share from new demotions: writes reuse the oldest retained space
// first, and no demotion is refused.
TEST_F(CheckpointRetentionTest, ACommitListingTheWholeTierGivesWayPastItsShare) {
  ASSERT_NO_FATAL_FAILURE(Make(/*share=*/0.1));
  ASSERT_NO_FATAL_FAILURE(AppendSequences(0, 30));  // 120 blocks: the SSD tier is full
  auto committed = checkpointer_->Run();
  ASSERT_TRUE(committed.ok()) << committed.status();
  ASSERT_GE(committed->lower_copies * kFootprint, kSsdBytes * 9 / 10);

  uint32_t next = 30;
  for (int round = 0; round < 4; ++round) {
    SCOPED_TRACE(::testing::Message() << "round " << round);
    ASSERT_NO_FATAL_FAILURE(FailedCheckpoint());
    ASSERT_NO_FATAL_FAILURE(AppendSequences(next, 30));
    next += 30;
    const TierStats lower = Lower();
    EXPECT_LE(lower.retained_bytes, kSsdBytes / 10 + kFootprint);
    EXPECT_GE(lower.allocated_bytes, kSsdBytes * 3 / 4) << "the tier holds too little";
    EXPECT_EQ(Tiers().lower[0].write_failures, 0u);
  }
  EXPECT_GT(Lower().retained_reused, 0u);
}

}  // namespace
}  // namespace kvcache::checkpoint
