// Checkpointer and Restorer over real Caches and real files: what one cache
// held, another gets back exactly (blocks, bytes, per-block state), through
// full and incremental checkpoints, failed writes (injected below the file
// layer), a corrupt data file, a full host tier and concurrent appends.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <atomic>
#include <filesystem>
#include <fstream>
#include <thread>

#include "absl/strings/str_cat.h"
#include "server/checkpoint/checkpoint_directory.h"
#include "server/checkpoint/checkpoint_format.h"
#include "server/checkpoint/checkpointer.h"
#include "server/checkpoint/fault_injecting_file_system.h"
#include "server/checkpoint/manifest.h"
#include "server/checkpoint/restorer.h"
#include "server/core/cache_test_util.h"
#include "server/core/checkpoint_source.h"
#include "server/core/memory_tier.h"

namespace kvcache::checkpoint {
namespace {

using cache_test::Append;
using cache_test::Big;
using cache_test::Ids;
using cache_test::kBt;
using cache_test::kSlab;
using cache_test::Mid;
using cache_test::PlanHolds;
using cache_test::Seq;
using cache_test::TestModel;

class CheckpointCacheTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = ::testing::TempDir() + "/checkpoint_cache_test_" +
           ::testing::UnitTest::GetInstance()->current_test_info()->name();
    std::filesystem::remove_all(dir_);
    source_ = MakeCache(64);
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }

  std::unique_ptr<Cache> MakeCache(uint64_t slabs) {
    auto pool = SlabPool::Create(
        {.capacity_bytes = slabs * kSlab, .slab_bytes = kSlab, .min_class_bytes = 64});
    EXPECT_TRUE(pool.ok()) << pool.status();
    return std::make_unique<Cache>(CacheOptions{}, *std::move(pool), NewLruKPolicy({}, &clock_),
                                   &clock_);
  }

  // Sequences s = 0..n-1 of `m`: three blocks each, the first two shared by
  // pairs (a tree, not only chains), with hints that the checkpoint keeps.
  void Fill(Cache& cache, const TestModel& m, uint32_t n, uint32_t salt = 0) {
    ASSERT_TRUE(cache.RegisterModel(m.key, m.layout).ok());
    for (uint32_t s = 0; s < n; ++s) {
      AppendHints hints{.priority = static_cast<int32_t>(s % 3),
                        .ttl = s % 4 == 0 ? absl::Hours(1) : absl::ZeroDuration(),
                        .protected_ranges = {{.begin = 0, .end = 5}}};
      auto r = Append(cache, m, Sequence(s, salt), 0, hints);
      ASSERT_TRUE(r.ok()) << r.status();
    }
  }
  static std::vector<Token> Sequence(uint32_t s, uint32_t salt = 0) {
    return Seq(Ids{100 + salt + s / 2, 500 + salt + s, 900 + salt + s});
  }

  absl::StatusOr<CheckpointRun> Checkpoint(Cache& cache, FileSystem* fs, uint64_t sequence,
                                           uint32_t full_every = 8, CheckpointKey key = {}) {
    Checkpointer c(&cache, fs, {.dir = dir_, .keep = 3, .full_every = full_every, .mac_key = key},
                   sequence);
    return c.Run();
  }
  RestoreProgress Restore(Cache& cache, CheckpointKey key = {}) {
    Restorer r(&cache, DefaultFileSystem(), dir_, key);
    EXPECT_TRUE(r.Prepare().ok());
    std::atomic<bool> stop{false};
    r.Run(stop);
    return r.progress();
  }
  uint64_t Fetched(Cache& cache, const TestModel& m, const std::vector<Token>& tokens) {
    auto plan = cache.PrepareFetch(m.key, {.tokens = tokens});
    EXPECT_TRUE(plan.ok()) << plan.status();
    if (!plan.ok()) return 0;
    EXPECT_TRUE(PlanHolds(*plan, m, tokens));
    return plan->matched_tokens;
  }

  ManualClock clock_;
  std::string dir_;
  std::unique_ptr<Cache> source_;
};

TEST_F(CheckpointCacheTest, ARestoredCacheHoldsEveryBlockAndItsState) {
  ASSERT_NO_FATAL_FAILURE(Fill(*source_, Mid(), 20));
  ASSERT_NO_FATAL_FAILURE(Fill(*source_, Big(), 6, 5000));
  auto run = Checkpoint(*source_, DefaultFileSystem(), 1);
  ASSERT_TRUE(run.ok()) << run.status();
  const uint64_t blocks = source_->GetStats().blocks;
  EXPECT_EQ(run->blocks, blocks);
  EXPECT_EQ(run->host_payloads, blocks);
  EXPECT_TRUE(run->full);

  std::unique_ptr<Cache> target = MakeCache(64);
  const RestoreProgress p = Restore(*target);
  EXPECT_EQ(p.state, RestoreState::kDone);
  EXPECT_EQ(p.restored_blocks, blocks);
  EXPECT_EQ(p.sequence, 1u);

  // The same images (before any fetch touches the blocks): tree, seals and the per-block state the
  // policies use.
  const std::vector<ModelImage> before = CheckpointSource(source_.get()).CaptureModels();
  const std::vector<ModelImage> after = CheckpointSource(target.get()).CaptureModels();
  ASSERT_EQ(before.size(), after.size());
  for (size_t i = 0; i < before.size(); ++i) {
    EXPECT_EQ(before[i].key, after[i].key);
    EXPECT_EQ(before[i].layout, after[i].layout);
    EXPECT_THAT(after[i].blocks, ::testing::UnorderedElementsAreArray(before[i].blocks));
    std::vector<BlockImage> a, b;
    CheckpointSource(source_.get()).CaptureBlocks(before[i].key, before[i].blocks, &a);
    CheckpointSource(target.get()).CaptureBlocks(after[i].key, before[i].blocks, &b);
    ASSERT_EQ(a.size(), b.size());
    for (size_t j = 0; j < a.size(); ++j) {
      SCOPED_TRACE(j);
      EXPECT_EQ(a[j].key, b[j].key);
      EXPECT_EQ(a[j].parent_lookup_hash, b[j].parent_lookup_hash);
      EXPECT_EQ(a[j].seal.checksum, b[j].seal.checksum);
      EXPECT_EQ(a[j].seal.raw_checksum, b[j].seal.raw_checksum);
      EXPECT_EQ(a[j].priority, b[j].priority);
      EXPECT_EQ(a[j].expires, b[j].expires);
      EXPECT_EQ(a[j].references, b[j].references);
      EXPECT_EQ(a[j].token_state.pinned, b[j].token_state.pinned);
      EXPECT_EQ(a[j].token_state.novelty, b[j].token_state.novelty);
      EXPECT_EQ(a[j].history_age_ms, b[j].history_age_ms);
    }
  }
  for (uint32_t s = 0; s < 20; ++s) EXPECT_EQ(Fetched(*target, Mid(), Sequence(s)), 3 * kBt);
  for (uint32_t s = 0; s < 6; ++s) EXPECT_EQ(Fetched(*target, Big(), Sequence(s, 5000)), 3 * kBt);
}

TEST_F(CheckpointCacheTest, AnIncrementalCheckpointRefersToUnchangedPayloads) {
  ASSERT_NO_FATAL_FAILURE(Fill(*source_, Mid(), 10));
  const uint64_t first_blocks = source_->GetStats().blocks;
  Checkpointer c(source_.get(), DefaultFileSystem(), {.dir = dir_, .keep = 3, .full_every = 4}, 1);
  auto full = c.Run();
  ASSERT_TRUE(full.ok()) << full.status();
  for (uint32_t s = 10; s < 14; ++s) ASSERT_TRUE(Append(*source_, Mid(), Sequence(s)).ok());
  const uint64_t blocks = source_->GetStats().blocks;
  auto incremental = c.Run();
  ASSERT_TRUE(incremental.ok()) << incremental.status();
  EXPECT_FALSE(incremental->full);
  EXPECT_EQ(incremental->referenced_payloads, first_blocks);
  EXPECT_EQ(incremental->host_payloads, blocks - first_blocks);
  EXPECT_THAT(incremental->references, ::testing::ElementsAre(1u));
  EXPECT_LT(incremental->data_bytes, full->data_bytes);

  std::unique_ptr<Cache> target = MakeCache(64);
  const RestoreProgress p = Restore(*target);
  EXPECT_EQ(p.sequence, 2u);
  EXPECT_EQ(p.restored_blocks, blocks);
  for (uint32_t s = 0; s < 14; ++s) EXPECT_EQ(Fetched(*target, Mid(), Sequence(s)), 3 * kBt);
  // Pruning keeps the full checkpoint the incremental one refers to.
  for (int i = 0; i < 4; ++i) ASSERT_TRUE(c.Run().ok());
  EXPECT_EQ(Restore(*MakeCache(64)).restored_blocks, blocks);
}

TEST_F(CheckpointCacheTest, AWriteRateLimitPacesTheCheckpoint) {
  ASSERT_NO_FATAL_FAILURE(Fill(*source_, Mid(), 10));
  // Written as fast as it can, to learn the payload bytes.
  auto free_run = Checkpoint(*source_, DefaultFileSystem(), 1, /*full_every=*/1);
  ASSERT_TRUE(free_run.ok()) << free_run.status();
  const uint64_t payload = free_run->payload_bytes;
  ASSERT_GT(payload, 0u);
  // At half the payload a second, stored raw (the limit counts the bytes
  // written): a second's worth goes at once (the bucket starts full), the
  // rest takes at least another second.
  const uint64_t rate = payload / 2;
  Checkpointer paced(source_.get(), DefaultFileSystem(),
                     {.dir = dir_,
                      .keep = 3,
                      .full_every = 1,
                      .zstd_level = 0,
                      .max_write_bytes_per_second = rate},
                     2);
  const absl::Time start = absl::Now();
  auto run = paced.Run();
  const absl::Duration took = absl::Now() - start;
  ASSERT_TRUE(run.ok()) << run.status();
  EXPECT_EQ(run->payload_bytes, payload);
  EXPECT_GE(took, absl::Seconds(0.95)) << "the limit did not pace the writes";
  // What was written restores exactly.
  std::unique_ptr<Cache> target = MakeCache(64);
  EXPECT_EQ(Restore(*target).restored_blocks, source_->GetStats().blocks);
}

TEST_F(CheckpointCacheTest, AFailedWriteLeavesThePreviousCheckpointNewest) {
  ASSERT_NO_FATAL_FAILURE(Fill(*source_, Mid(), 8));
  const uint64_t first_blocks = source_->GetStats().blocks;
  ASSERT_TRUE(Checkpoint(*source_, DefaultFileSystem(), 1).ok());
  for (uint32_t s = 8; s < 16; ++s) ASSERT_TRUE(Append(*source_, Mid(), Sequence(s)).ok());

  FaultInjectingFileSystem faulty(DefaultFileSystem());
  uint64_t sequence = 2;
  for (FaultKind kind : {FaultKind::kShortWrite, FaultKind::kNoSpace, FaultKind::kIoError,
                         FaultKind::kSyncFails, FaultKind::kRenameFails}) {
    SCOPED_TRACE(static_cast<int>(kind));
    faulty.ClearFaults();
    faulty.AddFault(
        {.kind = kind, .path_contains = kind == FaultKind::kSyncFails ? "" : "ckpt-", .nth = 1});
    auto run = Checkpoint(*source_, &faulty, sequence++);
    EXPECT_FALSE(run.ok());
    auto newest = CheckpointDirectory(DefaultFileSystem(), dir_, CheckpointKey{}).NewestComplete();
    ASSERT_TRUE(newest.ok()) << newest.status();
    EXPECT_EQ(newest->sequence, 1u);
  }
  std::unique_ptr<Cache> target = MakeCache(64);
  const RestoreProgress p = Restore(*target);
  EXPECT_EQ(p.sequence, 1u);
  EXPECT_EQ(p.restored_blocks, first_blocks);
  for (uint32_t s = 0; s < 8; ++s) EXPECT_EQ(Fetched(*target, Mid(), Sequence(s)), 3 * kBt);
  for (uint32_t s = 8; s < 16; ++s) Fetched(*target, Mid(), Sequence(s));  // exact if any
}

TEST_F(CheckpointCacheTest, ACorruptDataFileFallsBackToTheOneBefore) {
  ASSERT_NO_FATAL_FAILURE(Fill(*source_, Mid(), 8));
  ASSERT_TRUE(Checkpoint(*source_, DefaultFileSystem(), 1, /*full_every=*/1).ok());
  for (uint32_t s = 8; s < 16; ++s) ASSERT_TRUE(Append(*source_, Mid(), Sequence(s)).ok());
  auto second = Checkpoint(*source_, DefaultFileSystem(), 2, 1);
  ASSERT_TRUE(second.ok());
  FaultInjectingFileSystem fs(DefaultFileSystem());
  const std::string data = dir_ + "/ckpt-00000000000000000002.data";
  ASSERT_TRUE(fs.CorruptByte(data, second->data_bytes * 3 / 4).ok());

  std::unique_ptr<Cache> target = MakeCache(64);
  const RestoreProgress p = Restore(*target);
  EXPECT_EQ(p.failed_checkpoints, 1u);
  EXPECT_THAT(p.error, ::testing::HasSubstr("checkpoint 2"));
  EXPECT_EQ(p.sequence, 1u);
  EXPECT_EQ(p.state, RestoreState::kDone);
  for (uint32_t s = 0; s < 8; ++s) EXPECT_EQ(Fetched(*target, Mid(), Sequence(s)), 3 * kBt);
  for (uint32_t s = 8; s < 16; ++s) Fetched(*target, Mid(), Sequence(s));
}

TEST_F(CheckpointCacheTest, RestoreKeepsBlocksAppendedMeanwhileAndStopsWhenFull) {
  ASSERT_NO_FATAL_FAILURE(Fill(*source_, Mid(), 40));
  ASSERT_TRUE(Checkpoint(*source_, DefaultFileSystem(), 1).ok());
  const uint64_t blocks = source_->GetStats().blocks;
  // A smaller host tier that a worker already wrote to.
  std::unique_ptr<Cache> target = MakeCache(2);
  ASSERT_TRUE(target->RegisterModel(Mid().key, Mid().layout).ok());
  ASSERT_TRUE(Append(*target, Mid(), Sequence(0)).ok());
  const RestoreProgress p = Restore(*target);
  EXPECT_EQ(p.state, RestoreState::kDone);
  EXPECT_GE(p.present_blocks, 3u) << p.restored_blocks << " restored, " << p.orphan_blocks
                                  << " orphans, " << p.lost_blocks << " lost, " << p.skipped_blocks
                                  << " skipped";
  EXPECT_LT(p.restored_blocks, blocks);
  EXPECT_GT(p.lost_blocks + p.orphan_blocks, 0u);
  for (uint32_t s = 0; s < 40; ++s) Fetched(*target, Mid(), Sequence(s));  // exact if any
  EXPECT_EQ(Fetched(*target, Mid(), Sequence(0)), 3 * kBt);
}

// Checkpoints taken while four threads append to a cache that evicts: each
// one restores into a fresh cache with nothing but exact blocks.
TEST_F(CheckpointCacheTest, CheckpointsWhileWorkersAppendAndEvictRestoreExactly) {
  source_ = MakeCache(8);  // 512 KiB: 256 Mid blocks; the workers append far more
  ASSERT_TRUE(source_->RegisterModel(Mid().key, Mid().layout).ok());
  std::atomic<bool> stop{false};
  std::vector<std::thread> workers;
  for (uint32_t w = 0; w < 4; ++w) {
    workers.emplace_back([&, w] {
      for (uint32_t s = w; !stop.load(); s += 4) {
        auto r = Append(*source_, Mid(), Sequence(s % 2000));
        if (!r.ok()) ADD_FAILURE() << r.status();
      }
    });
  }
  Checkpointer c(source_.get(), DefaultFileSystem(), {.dir = dir_, .keep = 2, .full_every = 3}, 1);
  uint64_t gone = 0;
  for (int i = 0; i < 6; ++i) {
    auto run = c.Run();
    ASSERT_TRUE(run.ok()) << run.status();
    gone += run->gone_blocks;
  }
  // The newest checkpoint taken under churn: exact blocks only. How many
  // survived from capture to write depends on the scheduling (on a busy
  // machine every captured block can be evicted first), so none may be.
  std::unique_ptr<Cache> churned = MakeCache(64);
  const RestoreProgress during = Restore(*churned);
  EXPECT_EQ(during.state, RestoreState::kDone);
  EXPECT_EQ(during.corrupt_payloads, 0u);
  for (uint32_t s = 0; s < 2000; ++s) Fetched(*churned, Mid(), Sequence(s));  // exact if any
  stop = true;
  for (std::thread& t : workers) t.join();
  // One more, incremental over those, once the workers stopped: it holds
  // what the cache holds, and restores it exactly.
  auto last = c.Run();
  ASSERT_TRUE(last.ok()) << last.status();
  std::unique_ptr<Cache> target = MakeCache(64);
  const RestoreProgress p = Restore(*target);
  EXPECT_EQ(p.state, RestoreState::kDone);
  EXPECT_EQ(p.restored_blocks, source_->GetStats().blocks);
  EXPECT_EQ(p.corrupt_payloads, 0u);
  for (uint32_t s = 0; s < 2000; ++s) Fetched(*target, Mid(), Sequence(s));  // exact if any
  std::printf("blocks evicted between capture and write: %llu; restored under churn: %llu\n",
              static_cast<unsigned long long>(gone),
              static_cast<unsigned long long>(during.restored_blocks));
}

// A newest checkpoint of a format version this kvcached cannot read stops
// the restore (the daemon refuses to start) rather than be skipped and pruned.
TEST_F(CheckpointCacheTest, ANewerFormatVersionIsRefusedNotSkipped) {
  ASSERT_NO_FATAL_FAILURE(Fill(*source_, Mid(), 4));
  ASSERT_TRUE(Checkpoint(*source_, DefaultFileSystem(), 1).ok());
  ASSERT_TRUE(Checkpoint(*source_, DefaultFileSystem(), 2).ok());
  const std::string path = JoinPath(dir_, ManifestFileName(2));
  std::string text;
  {
    std::ifstream in(path, std::ios::binary);
    text.assign(std::istreambuf_iterator<char>(in), {});
  }
  Manifest m = DecodeManifest(text, 2, CheckpointKey{}, "test").value();
  m.format_version = kFormatVersion + 1;
  { std::ofstream(path, std::ios::binary | std::ios::trunc) << EncodeManifest(m, CheckpointKey{}); }

  std::unique_ptr<Cache> target = MakeCache(64);
  Restorer r(target.get(), DefaultFileSystem(), dir_, CheckpointKey{});
  const absl::Status s = r.Prepare();
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << s;
  EXPECT_THAT(s.message(), ::testing::HasSubstr("this kvcached reads up to"));
  EXPECT_TRUE(std::filesystem::exists(path));
}

// Blocks that live only in a lower tier that cannot re-attach (the heap
// stand-in) have nothing to record: the checkpoint leaves them out instead
// of writing records the restore would refuse, and the rest restores.
TEST_F(CheckpointCacheTest, BlocksOnlyInAVolatileLowerTierAreLeftOut) {
  auto pool = SlabPool::Create({.capacity_bytes = 4 * kSlab, .slab_bytes = kSlab});
  ASSERT_TRUE(pool.ok());
  source_ = std::make_unique<Cache>(CacheOptions{}, *std::move(pool), NewLruPolicy(), &clock_,
                                    MemoryTier::Create(uint64_t{64} << 20), NewLruPolicy());
  ASSERT_NO_FATAL_FAILURE(Fill(*source_, Big(), 40));  // 8 KiB blocks: past the host tier
  for (int i = 0; i < 20 && source_->tiers().NeedsMigration(); ++i) source_->tiers().Migrate();
  const CacheStats stats = source_->GetStats();
  ASSERT_GT(stats.tiers.lower_only_blocks(), 0u);
  auto run = Checkpoint(*source_, DefaultFileSystem(), 1);
  ASSERT_TRUE(run.ok()) << run.status();
  EXPECT_EQ(run->gone_blocks, stats.tiers.lower_only_blocks());
  EXPECT_EQ(run->lower_copies, 0u);

  std::unique_ptr<Cache> target = MakeCache(64);
  const RestoreProgress p = Restore(*target);
  EXPECT_EQ(p.state, RestoreState::kDone) << p.error;
  EXPECT_EQ(p.failed_checkpoints, 0u) << p.error;
  EXPECT_EQ(p.restored_blocks + p.orphan_blocks, run->blocks);
  EXPECT_GT(p.restored_blocks, 0u);
  for (uint32_t s = 0; s < 40; ++s) Fetched(*target, Big(), Sequence(s));  // exact if any
}

CheckpointKey Key(uint8_t fill) {
  CheckpointKey key;
  key.fill(fill);
  return key;
}

// A checkpoint restores only under the key it was written under (the
// daemon's secret); under another one nothing is restored and the reason is
// reported.
TEST_F(CheckpointCacheTest, ACheckpointRestoresOnlyUnderItsKey) {
  ASSERT_NO_FATAL_FAILURE(Fill(*source_, Mid(), 8));
  ASSERT_TRUE(Checkpoint(*source_, DefaultFileSystem(), 1, 8, Key(0xa)).ok());
  const uint64_t blocks = source_->GetStats().blocks;

  std::unique_ptr<Cache> other = MakeCache(64);
  const RestoreProgress refused = Restore(*other, Key(0xb));
  EXPECT_EQ(refused.restored_blocks, 0u);
  EXPECT_EQ(refused.failed_checkpoints, 1u);
  EXPECT_THAT(refused.error, ::testing::HasSubstr("MAC mismatch"));
  EXPECT_EQ(other->GetStats().blocks, 0u);

  std::unique_ptr<Cache> same = MakeCache(64);
  const RestoreProgress restored = Restore(*same, Key(0xa));
  EXPECT_EQ(restored.state, RestoreState::kDone);
  EXPECT_EQ(restored.restored_blocks, blocks);
}

// A newer checkpoint planted by someone without the key (written by a cache
// of theirs under their own key) is refused; the restore uses the one before
// it, exactly.
TEST_F(CheckpointCacheTest, APlantedCheckpointIsRefusedAndTheOneBeforeRestores) {
  ASSERT_NO_FATAL_FAILURE(Fill(*source_, Mid(), 8));
  ASSERT_TRUE(Checkpoint(*source_, DefaultFileSystem(), 1, 8, Key(0xa)).ok());
  const uint64_t blocks = source_->GetStats().blocks;
  // The forger's checkpoint 2, written in a folder of their own (their
  // pruning would delete ours, which is corrupt under their key), then
  // copied in.
  std::unique_ptr<Cache> forger = MakeCache(64);
  ASSERT_NO_FATAL_FAILURE(Fill(*forger, Mid(), 8, /*salt=*/77));
  const std::string ours = dir_;
  dir_ = ours + "_forged";
  std::filesystem::remove_all(dir_);
  ASSERT_TRUE(Checkpoint(*forger, DefaultFileSystem(), 2, 8, Key(0xf)).ok());
  for (const std::string& name : {ManifestFileName(2), DataFileName(2)}) {
    std::filesystem::copy_file(JoinPath(dir_, name), JoinPath(ours, name));
  }
  std::filesystem::remove_all(dir_);
  dir_ = ours;

  std::unique_ptr<Cache> target = MakeCache(64);
  const RestoreProgress p = Restore(*target, Key(0xa));
  EXPECT_EQ(p.sequence, 1u);
  EXPECT_EQ(p.restored_blocks, blocks);
  EXPECT_EQ(p.failed_checkpoints, 1u);
  for (uint32_t s = 0; s < 8; ++s) EXPECT_EQ(Fetched(*target, Mid(), Sequence(s)), 3 * kBt);
  for (uint32_t s = 0; s < 8; ++s) EXPECT_EQ(Fetched(*target, Mid(), Sequence(s, 77)), 0u);
}

// A manifest summary whose keys have the wrong types (under a valid MAC:
// what a bug of a writer could leave) is DATA_LOSS: the restore falls back to
// the checkpoint before it instead of throwing at start-up.
TEST_F(CheckpointCacheTest, AMalformedSummaryFallsBackToTheOneBefore) {
  ASSERT_NO_FATAL_FAILURE(Fill(*source_, Mid(), 8));
  ASSERT_TRUE(Checkpoint(*source_, DefaultFileSystem(), 1, 1).ok());
  const uint64_t blocks = source_->GetStats().blocks;
  for (const char* text_of_summary : {
           R"({"lower_index": "12"})",
           R"({"lower_index": [-1]})",
           R"({"lower_index": [64], "model_keys": [[1, 2]]})",
           R"({"lower_index": [64], "model_keys": "m"})",
           R"({"lower_index": [64], "model_keys": [["ns"]]})",
           R"({"full": 1})",
           R"({"blocks": "many"})",
       }) {
    SCOPED_TRACE(text_of_summary);
    const nlohmann::json summary = nlohmann::json::parse(text_of_summary);
    std::filesystem::remove(JoinPath(dir_, ManifestFileName(2)));
    std::filesystem::remove(JoinPath(dir_, DataFileName(2)));
    ASSERT_TRUE(Checkpoint(*source_, DefaultFileSystem(), 2, 1).ok());
    const std::string path = JoinPath(dir_, ManifestFileName(2));
    std::string text;
    {
      std::ifstream in(path, std::ios::binary);
      text.assign(std::istreambuf_iterator<char>(in), {});
    }
    Manifest m = DecodeManifest(text, 2, CheckpointKey{}, "test").value();
    for (const auto& [key, value] : summary.items()) m.summary[key] = value;
    {
      std::ofstream(path, std::ios::binary | std::ios::trunc) << EncodeManifest(m, CheckpointKey{});
    }

    std::unique_ptr<Cache> target = MakeCache(64);
    const RestoreProgress p = Restore(*target);
    EXPECT_EQ(p.sequence, 1u);
    EXPECT_EQ(p.restored_blocks, blocks);
    EXPECT_EQ(p.failed_checkpoints, 1u);
    EXPECT_THAT(p.error, ::testing::HasSubstr("manifest summary"));
  }
}

std::vector<uint64_t> BlocksOf(Cache& cache) {
  std::vector<uint64_t> blocks;
  for (const ModelImage& m : CheckpointSource(&cache).CaptureModels()) {
    blocks.insert(blocks.end(), m.blocks.begin(), m.blocks.end());
  }
  return blocks;
}

// A crash at every point of an (incremental) checkpoint in turn, each changing
// file call, with everything not yet synced lost as a power loss may lose it:
// the restore is exactly the last checkpoint that completed, never a mix of
// two and never nothing.
TEST_F(CheckpointCacheTest, ACrashAnywhereRestoresTheLastCompletedCheckpointExactly) {
  bool completed_before_crash = false;
  uint32_t crash_at = 0;
  for (; !completed_before_crash; ++crash_at) {
    SCOPED_TRACE(absl::StrCat("crash after ", crash_at, " changes"));
    ASSERT_LT(crash_at, 500u) << "the checkpoint never finished";
    std::filesystem::remove_all(dir_);
    source_ = MakeCache(64);
    FaultInjectingFileSystem fs(DefaultFileSystem());
    Checkpointer c(source_.get(), &fs, {.dir = dir_, .keep = 1, .full_every = 8}, 1);
    ASSERT_NO_FATAL_FAILURE(Fill(*source_, Mid(), 6));
    ASSERT_TRUE(c.Run().ok());
    const std::vector<uint64_t> first = BlocksOf(*source_);
    ASSERT_NO_FATAL_FAILURE(Fill(*source_, Mid(), 6, /*salt=*/1000));
    const std::vector<uint64_t> second = BlocksOf(*source_);

    fs.CrashAfter(crash_at);
    const absl::StatusOr<CheckpointRun> run = c.Run();  // refers to the first
    completed_before_crash = !fs.crashed();
    if (run.ok()) {
      EXPECT_FALSE(run->full);
    }
    ASSERT_TRUE(fs.LoseUnsyncedWrites().ok());

    std::unique_ptr<Cache> target = MakeCache(64);
    const RestoreProgress p = Restore(*target);
    EXPECT_EQ(p.state, RestoreState::kDone) << p.error;
    EXPECT_EQ(p.sequence, run.ok() ? 2u : 1u) << run.status();
    EXPECT_THAT(BlocksOf(*target), ::testing::UnorderedElementsAreArray(run.ok() ? second : first));
    for (uint32_t s = 0; s < 6; ++s) EXPECT_EQ(Fetched(*target, Mid(), Sequence(s)), 3 * kBt);
    for (uint32_t s = 0; s < 6; ++s) {
      EXPECT_EQ(Fetched(*target, Mid(), Sequence(s, 1000)), run.ok() ? 3 * kBt : 0u);
    }
  }
  // Every step of the commit protocol was a crash point: the directory, the
  // data file's writes and sync, the manifest's, its rename, the folder's sync.
  EXPECT_GE(crash_at, 9u);
}

TEST_F(CheckpointCacheTest, NothingToRestoreIsNotAnError) {
  std::unique_ptr<Cache> target = MakeCache(4);
  const RestoreProgress p = Restore(*target);
  EXPECT_EQ(p.state, RestoreState::kOff);
  EXPECT_EQ(p.restored_blocks, 0u);
}

}  // namespace
}  // namespace kvcache::checkpoint
