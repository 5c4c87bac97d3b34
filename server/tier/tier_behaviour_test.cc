// The behaviour suite every Tier passes (server/core/tier.h):
// the heap-backed MemoryTier, host memory (HostTier over a slab pool), the
// SSD tier over a real file and the GPU tier on the host-memory stand-in for
// a device.
#include <gtest/gtest.h>

#include <atomic>
#include <filesystem>
#include <optional>
#include <random>
#include <thread>
#include <vector>

#include "server/core/block_test_util.h"
#include "server/core/host_tier.h"
#include "server/core/memory_tier.h"
#include "server/core/tier.h"
#include "server/tier/gpu_device_tier.h"
#include "server/tier/ssd_tier.h"

namespace kvcache {
namespace {

constexpr uint64_t kCapacity = uint64_t{8} << 20;

// A sealed heap payload of `size` bytes derived from `seed`.
BlockRef MakePayload(uint64_t size, uint64_t seed, bool compressed = false) {
  std::vector<std::byte> bytes(size);
  std::mt19937_64 rng(seed);
  for (std::byte& b : bytes) b = static_cast<std::byte>(rng());
  if (!compressed) return SealedHeapBlock(bytes);
  return SealedHeapBlock(bytes, {.checksum = Checksum(bytes),
                                 .raw_checksum = seed,
                                 .decoded_checksum = seed + 1,
                                 .compressed = true});
}

// Each factory makes a store on `path` (ignored by a volatile store); a
// persistent store opened again on the same path with another epoch is a
// restart.
struct MemoryStoreFactory {
  static constexpr bool kPersistent = false;
  static std::shared_ptr<Tier> Make(const std::string&, uint64_t /*epoch*/ = 1) {
    return MemoryTier::Create(kCapacity);
  }
};

// 64 KiB slabs: the suite's dozen block sizes each take a span of their own.
struct HostTierFactory {
  static constexpr bool kPersistent = false;
  static std::shared_ptr<Tier> Make(const std::string&, uint64_t /*epoch*/ = 1) {
    auto pool = SlabPool::Create(
        {.capacity_bytes = kCapacity, .slab_bytes = uint64_t{64} << 10, .min_class_bytes = 64});
    EXPECT_TRUE(pool.ok()) << pool.status();
    return pool.ok() ? std::make_shared<HostTier>(*std::move(pool)) : nullptr;
  }
};

struct SsdStoreFactory {
  static constexpr bool kPersistent = true;
  static std::shared_ptr<Tier> Make(const std::string& path, uint64_t epoch = 1) {
    SsdStoreOptions options{.path = path,
                            .capacity_bytes = kCapacity,
                            .region_bytes = uint64_t{1} << 20,
                            .epoch = epoch};
    auto store = OpenSsdTier(options);
    EXPECT_TRUE(store.ok()) << store.status();
    return store.ok() ? *store : nullptr;
  }
};

struct GpuStandInFactory {
  static constexpr bool kPersistent = false;
  static std::shared_ptr<Tier> Make(const std::string&, uint64_t /*epoch*/ = 1) {
    auto tier = OpenGpuDeviceTier({.kind = "host_stand_in",
                                   .capacity_bytes = kCapacity,
                                   .arena_bytes = kCapacity / 2,
                                   .slab_bytes = uint64_t{1} << 20,
                                   .min_block_bytes = 4096});
    EXPECT_TRUE(tier.ok()) << tier.status();
    return tier.ok() ? *tier : nullptr;
  }
};

template <typename Factory>
class TierBehaviourTest : public ::testing::Test {
 protected:
  void SetUp() override {
    path_ = ::testing::TempDir() + "/tier_behaviour_test_" +
            std::to_string(reinterpret_cast<uintptr_t>(this)) + ".bin";
    std::filesystem::remove(path_);
    store_ = Factory::Make(path_);
    ASSERT_NE(store_, nullptr);
  }
  void TearDown() override {
    store_.reset();
    std::filesystem::remove(path_);
  }

  std::string path_;
  std::shared_ptr<Tier> store_;
};

using Factories =
    ::testing::Types<MemoryStoreFactory, HostTierFactory, SsdStoreFactory, GpuStandInFactory>;
TYPED_TEST_SUITE(TierBehaviourTest, Factories);

TYPED_TEST(TierBehaviourTest, ACopyReadsBackExactlyWithItsSeal) {
  for (uint64_t size : {uint64_t{1}, uint64_t{4095}, uint64_t{4096}, uint64_t{100} << 10}) {
    const BlockRef p = MakePayload(size, size, /*compressed=*/size == 4096);
    auto copy = this->store_->Write(size * 7, *p);
    ASSERT_TRUE(copy.ok()) << size << ": " << copy.status();
    EXPECT_EQ((*copy)->key(), size * 7);
    EXPECT_EQ((*copy)->seal().size, size);
    EXPECT_EQ((*copy)->seal().checksum, p->checksum());
    EXPECT_EQ((*copy)->seal().raw_checksum, p->raw_checksum());
    EXPECT_EQ((*copy)->seal().compressed, p->compressed());
    EXPECT_GE((*copy)->footprint(), size);
    std::vector<std::byte> out(size);
    ASSERT_TRUE(this->store_->Read(**copy, out).ok());
    EXPECT_TRUE(std::equal(out.begin(), out.end(), p->data().begin())) << size;
  }
}

TYPED_TEST(TierBehaviourTest, CopiesCountAgainstCapacityUntilTheLastReferenceDrops) {
  const BlockRef p = MakePayload(64 << 10, 1);
  std::vector<StoredRef> copies;
  while (true) {
    auto copy = this->store_->Write(copies.size(), *p);
    if (!copy.ok()) {
      EXPECT_TRUE(absl::IsResourceExhausted(copy.status())) << copy.status();
      break;
    }
    copies.push_back(*std::move(copy));
    ASSERT_LT(copies.size(), 1000u) << "the store never filled";
  }
  ASSERT_GT(copies.size(), 10u);
  const TierStats full = this->store_->GetStats();
  EXPECT_EQ(full.live_copies, copies.size());
  EXPECT_LE(full.allocated_bytes, full.capacity_bytes);
  EXPECT_GE(full.failed_writes, 1u);
  // A reader's reference keeps a copy's space; dropping the rest frees room.
  StoredRef kept = copies[3];
  copies.clear();
  EXPECT_EQ(this->store_->GetStats().live_copies, 1u);
  auto again = this->store_->Write(99, *p);
  ASSERT_TRUE(again.ok()) << again.status();
  std::vector<std::byte> out(p->size());
  EXPECT_TRUE(this->store_->Read(*kept, out).ok());
  EXPECT_TRUE(std::equal(out.begin(), out.end(), p->data().begin()));
}

TYPED_TEST(TierBehaviourTest, ReadBatchSetsEveryStatus) {
  std::vector<BlockRef> payloads;
  std::vector<StoredRef> copies;
  for (int i = 0; i < 12; ++i) {
    payloads.push_back(MakePayload(8192 + i * 1000, i));
    auto copy = this->store_->Write(i, *payloads.back());
    ASSERT_TRUE(copy.ok());
    copies.push_back(*copy);
  }
  std::vector<std::vector<std::byte>> outs(copies.size());
  std::vector<StoredRead> reads;
  for (size_t i = 0; i < copies.size(); ++i) {
    outs[i].resize(payloads[i]->size());
    reads.push_back({.copy = copies[i].get(), .out = outs[i], .status = absl::UnknownError("")});
  }
  this->store_->ReadBatch(std::span<StoredRead>(reads));
  for (size_t i = 0; i < copies.size(); ++i) {
    EXPECT_TRUE(reads[i].status.ok()) << i << ": " << reads[i].status;
    EXPECT_TRUE(std::equal(outs[i].begin(), outs[i].end(), payloads[i]->data().begin())) << i;
  }
  EXPECT_EQ(this->store_->GetStats().reads, copies.size());
}

TYPED_TEST(TierBehaviourTest, ConcurrentWritersAndReadersSeeOnlyTheirBytes) {
  std::atomic<int> bad{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < 8; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < 40; ++i) {
        const BlockRef p = MakePayload(4096 + 977 * ((t + i) % 17), t * 1000 + i);
        auto copy = this->store_->Write(t * 1000 + i, *p);
        if (!copy.ok()) {
          if (!absl::IsResourceExhausted(copy.status())) ++bad;
          continue;
        }
        std::vector<std::byte> out(p->size());
        if (!this->store_->Read(**copy, out).ok() ||
            !std::equal(out.begin(), out.end(), p->data().begin())) {
          ++bad;
        }
      }
    });
  }
  for (std::thread& t : threads) t.join();
  EXPECT_EQ(bad.load(), 0);
  EXPECT_EQ(this->store_->GetStats().live_copies, 0u);
}

TYPED_TEST(TierBehaviourTest, SyncSucceeds) {
  const BlockRef p = MakePayload(10000, 3);
  auto copy = this->store_->Write(3, *p);
  ASSERT_TRUE(copy.ok());
  EXPECT_TRUE(this->store_->Sync().ok());
}

TYPED_TEST(TierBehaviourTest, PersistenceIsWhatTheStoreSays) {
  EXPECT_EQ(this->store_->persistent(), TypeParam::kPersistent);
  const BlockRef p = MakePayload(10000, 4);
  auto copy = this->store_->Write(4, *p);
  ASSERT_TRUE(copy.ok());
  const std::optional<StoredLocation> where = this->store_->Locate(**copy);
  EXPECT_EQ(where.has_value(), TypeParam::kPersistent);
  if (where) {
    EXPECT_EQ(where->footprint, (*copy)->footprint());
    EXPECT_NE(where->sequence, 0u);
  }
  // After a Write, re-attaching is refused either way.
  ReattachRequest request{
      .key = 4, .seal = (*copy)->seal(), .location = where.value_or(StoredLocation{})};
  this->store_->ReattachBatch({&request, 1});
  EXPECT_EQ(request.status.code(), TypeParam::kPersistent ? absl::StatusCode::kFailedPrecondition
                                                          : absl::StatusCode::kUnimplemented)
      << request.status;
  EXPECT_EQ(request.copy, nullptr);
  EXPECT_EQ(this->store_->GetStats().reattached, 0u);
}

TYPED_TEST(TierBehaviourTest, NothingReattachesThatWasNeverWritten) {
  // A volatile store re-attaches nothing; a persistent one refuses a
  // location that is no slot of its layout.
  ReattachRequest request{.key = 1, .seal = {.size = 100, .checksum = 1}};
  this->store_->ReattachBatch({&request, 1});  // before any Write
  EXPECT_EQ(request.status.code(), TypeParam::kPersistent ? absl::StatusCode::kInvalidArgument
                                                          : absl::StatusCode::kUnimplemented)
      << request.status;
  EXPECT_EQ(request.copy, nullptr);
}

TYPED_TEST(TierBehaviourTest, PersistentCopiesSurviveARestart) {
  if (!TypeParam::kPersistent) {
    // A volatile store's copies end with it: it has no location to record.
    BlockRef payload = MakePayload(1000, 1, /*compressed=*/false);
    auto copy = this->store_->Write(1, *payload);
    ASSERT_TRUE(copy.ok()) << copy.status();
    EXPECT_FALSE(this->store_->Locate(**copy).has_value());
    return;
  }
  std::vector<BlockRef> payloads;
  std::vector<ReattachRequest> checkpoint;
  {
    std::vector<StoredRef> copies;
    for (uint64_t i = 0; i < 24; ++i) {
      payloads.push_back(MakePayload(i % 3 == 0 ? 30000 + i : 1000 + i * 100, i,
                                     /*compressed=*/i % 4 == 1));
      auto copy = this->store_->Write(100 + i, *payloads.back());
      ASSERT_TRUE(copy.ok()) << copy.status();
      const std::optional<StoredLocation> where = this->store_->Locate(**copy);
      ASSERT_TRUE(where.has_value());
      EXPECT_EQ(where->epoch, 1u);
      checkpoint.push_back({.key = 100 + i, .seal = (*copy)->seal(), .location = *where});
      copies.push_back(*std::move(copy));
    }
    ASSERT_TRUE(this->store_->Sync().ok());
  }
  this->store_.reset();  // the process ends; the file stays
  this->store_ = TypeParam::Make(this->path_, /*epoch=*/2);
  ASSERT_NE(this->store_, nullptr);
  checkpoint[5].location.sequence += 1000;  // not what was written there
  this->store_->ReattachBatch(std::span<ReattachRequest>(checkpoint));
  EXPECT_EQ(checkpoint[5].status.code(), absl::StatusCode::kDataLoss) << checkpoint[5].status;
  EXPECT_EQ(checkpoint[5].copy, nullptr);
  for (size_t i = 0; i < checkpoint.size(); ++i) {
    if (i == 5) continue;
    const ReattachRequest& r = checkpoint[i];
    ASSERT_TRUE(r.status.ok()) << i << ": " << r.status;
    ASSERT_NE(r.copy, nullptr);
    EXPECT_EQ(r.copy->key(), r.key);
    EXPECT_EQ(r.copy->seal().checksum, payloads[i]->checksum());
    EXPECT_EQ(r.copy->seal().raw_checksum, payloads[i]->raw_checksum());
    EXPECT_EQ(r.copy->seal().compressed, payloads[i]->compressed());
    EXPECT_EQ(this->store_->Locate(*r.copy)->epoch, 1u);
    std::vector<std::byte> out(payloads[i]->size());
    ASSERT_TRUE(this->store_->Read(*r.copy, out).ok()) << i;
    EXPECT_TRUE(std::equal(out.begin(), out.end(), payloads[i]->data().begin())) << i;
  }
  const TierStats stats = this->store_->GetStats();
  EXPECT_EQ(stats.reattached, checkpoint.size() - 1);
  EXPECT_EQ(stats.live_copies, checkpoint.size() - 1);
  // This process writes with its own epoch.
  auto fresh = this->store_->Write(7, *payloads[0]);
  ASSERT_TRUE(fresh.ok());
  EXPECT_EQ(this->store_->Locate(**fresh)->epoch, 2u);
  for (ReattachRequest& r : checkpoint) r.copy.reset();
}

TYPED_TEST(TierBehaviourTest, RetentionHoldsFreedSpaceUntilReleased) {
  const BlockRef p = MakePayload(20000, 6);
  auto copy = this->store_->Write(6, *p);
  ASSERT_TRUE(copy.ok());
  const uint64_t footprint = (*copy)->footprint();
  this->store_->SetRetention(true);
  const uint64_t mark = this->store_->CheckpointStarted();
  copy->reset();  // while a checkpoint is being taken: it may list the copy
  TierStats stats = this->store_->GetStats();
  EXPECT_EQ(stats.live_copies, 0u);
  EXPECT_EQ(stats.allocated_bytes, 0u);
  EXPECT_EQ(stats.retained_bytes, TypeParam::kPersistent ? footprint : 0u);
  this->store_->CheckpointCommitted(mark);  // taken before the free: keeps it
  EXPECT_EQ(this->store_->GetStats().retained_bytes, TypeParam::kPersistent ? footprint : 0u);
  const uint64_t next = this->store_->CheckpointStarted();
  if (TypeParam::kPersistent) {
    EXPECT_EQ(next, mark + 1);
  }
  this->store_->CheckpointCommitted(next);
  EXPECT_EQ(this->store_->GetStats().retained_bytes, 0u);
  // Written after that commit and freed while no checkpoint runs: in none,
  // so not retained.
  auto later = this->store_->Write(7, *p);
  ASSERT_TRUE(later.ok());
  later->reset();
  EXPECT_EQ(this->store_->GetStats().retained_bytes, 0u);
}

// Retained space is not room while within the budget, and is the first
// room past it (a volatile store retains nothing: freed space is room).
TYPED_TEST(TierBehaviourTest, RetainedSpacePastTheBudgetServesWrites) {
  const BlockRef p = MakePayload(64 << 10, 8);
  std::vector<StoredRef> copies;
  while (true) {
    auto copy = this->store_->Write(copies.size(), *p);
    if (!copy.ok()) break;
    copies.push_back(*std::move(copy));
  }
  ASSERT_GE(copies.size(), 4u);
  this->store_->SetRetention(true);
  this->store_->CheckpointCommitted(this->store_->CheckpointStarted());  // may list every copy
  copies[0].reset();
  auto within = this->store_->Write(1000, *p);
  EXPECT_EQ(within.ok(), !TypeParam::kPersistent) << within.status();
  within = absl::UnavailableError("dropped");  // a volatile store's copy frees its space again
  this->store_->SetRetentionBudget(0);
  auto past = this->store_->Write(1001, *p);
  ASSERT_TRUE(past.ok()) << past.status();
  TierStats stats = this->store_->GetStats();
  EXPECT_EQ(stats.retained_bytes, 0u);
  EXPECT_EQ(stats.retained_reused, TypeParam::kPersistent ? 1u : 0u);
  // A failed checkpoint keeps what the committed one may list.
  this->store_->SetRetentionBudget(UINT64_MAX);
  this->store_->CheckpointStarted();
  copies[1].reset();
  this->store_->CheckpointFailed();
  EXPECT_EQ(this->store_->GetStats().retained_bytes,
            TypeParam::kPersistent ? copies[2]->footprint() : 0u);
}

// Host memory in particular: its copies are read in place, and a byte that
// changes in memory is DATA_LOSS on a read, counted.
TEST(HostTierTest, CopiesAreReadInPlaceAndCheckedOnRead) {
  std::shared_ptr<Tier> store = HostTierFactory::Make("");
  ASSERT_NE(store, nullptr);
  const BlockRef p = MakePayload(20000, 5);
  auto copy = store->Write(1, *p);
  ASSERT_TRUE(copy.ok()) << copy.status();
  const std::optional<std::span<const std::byte>> bytes = (*copy)->in_place_bytes();
  ASSERT_TRUE(bytes.has_value());
  EXPECT_TRUE(std::equal(bytes->begin(), bytes->end(), p->data().begin(), p->data().end()));
  EXPECT_NE(bytes->data(), p->data().data());  // a copy, in the tier's pool
  EXPECT_FALSE(p->in_place_bytes()->empty());
  FlipBits(static_cast<const BlockPayload&>(**copy), 123, std::byte{0x40});
  std::vector<std::byte> out(p->size());
  EXPECT_TRUE(absl::IsDataLoss(store->Read(**copy, out)));
  EXPECT_EQ(store->GetStats().checksum_failures, 1u);
  // A copy of another tier is not read as a host copy.
  auto other = MemoryTier::Create(1 << 20)->Write(2, *p);
  ASSERT_TRUE(other.ok());
  EXPECT_FALSE((*other)->in_place_bytes().has_value());
  EXPECT_TRUE(absl::IsInvalidArgument(store->Read(**other, out)));
}

// The SSD tier in particular: a byte flipped on disk, in the payload or the
// header, is DATA_LOSS and counted.
class SsdTierTest : public TierBehaviourTest<SsdStoreFactory> {
 protected:
  void FlipByteAt(uint64_t offset) {
    std::FILE* f = std::fopen(path_.c_str(), "r+b");
    ASSERT_NE(f, nullptr);
    ASSERT_EQ(std::fseek(f, static_cast<long>(offset), SEEK_SET), 0);
    const int c = std::fgetc(f);
    ASSERT_NE(c, EOF);
    ASSERT_EQ(std::fseek(f, static_cast<long>(offset), SEEK_SET), 0);
    std::fputc(c ^ 0x40, f);
    std::fclose(f);
  }
};

TEST_F(SsdTierTest, CorruptionOnDiskIsDataLoss) {
  const BlockRef p = MakePayload(20000, 5);
  auto a = store_->Write(1, *p);
  auto b = store_->Write(2, *p);
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_EQ(SsdStatsOf(*store_).live_extents, 2u);
  std::vector<std::byte> out(p->size());
  ASSERT_TRUE(store_->Read(**a, out).ok());
  // Copy a: its last payload byte (after the 64-byte header). Copy b: a
  // byte of its header.
  FlipByteAt(SsdExtentOf(**a).offset() + 64 + p->size() - 1);
  FlipByteAt(SsdExtentOf(**b).offset() + 8);
  EXPECT_TRUE(absl::IsDataLoss(store_->Read(**a, out)));
  EXPECT_TRUE(absl::IsDataLoss(store_->Read(**b, out)));
  EXPECT_EQ(store_->GetStats().checksum_failures, 2u);
}

}  // namespace
}  // namespace kvcache
