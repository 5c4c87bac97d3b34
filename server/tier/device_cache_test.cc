// The Cache with a GPU tier (server/core/device_tiering.cc) on the
// host-memory stand-in for a device: placement, the leases that keep device
// copies where they were reported, dropping copies for room and past the
// watermark, invalidation when a block's bytes change, SSD-only blocks placed
// after a verified read-back, and many threads at once. A worker's view is
// real: it maps the daemon's arenas through the stand-in's IPC and reads the
// reported slots.
#include <gtest/gtest.h>

#include <atomic>
#include <cstring>
#include <numeric>
#include <random>
#include <thread>
#include <vector>

#include "kvcache/gpu/arena_mappings.h"
#include "kvcache/gpu/device_memory.h"
#include "server/core/cache.h"
#include "server/core/compactor.h"
#include "server/core/memory_tier.h"
#include "server/tier/gpu_device_tier.h"

namespace kvcache {
namespace {

constexpr uint32_t kBt = 16;
// 2 layers x 2 (K, V) x 2 heads x 16 tokens x 16 dims x 4 bytes: 8 KiB.
const ModelLayout kLayout{2, 2, 16, DType::kFp32, kBt};
const ModelKey kModel{"default", "m"};
constexpr uint64_t kSlab = uint64_t{64} << 10;
constexpr uint64_t kBlockBytes = 8192;

std::vector<Token> Sequence(uint32_t id, uint32_t blocks) {
  std::vector<Token> t(blocks * kBt);
  std::iota(t.begin(), t.end(), id * 100'000);
  return t;
}

// Block `b` of sequence `id`: a deterministic pattern of normal floats (so
// compaction can quantize it).
std::vector<std::byte> BlockBytes(uint32_t id, uint32_t b) {
  std::mt19937 rng(id * 1000 + b);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> f(kBlockBytes / sizeof(float));
  for (float& x : f) x = normal(rng);
  std::vector<std::byte> out(kBlockBytes);
  std::memcpy(out.data(), f.data(), kBlockBytes);
  return out;
}

class DeviceCacheTest : public ::testing::Test {
 protected:
  void SetUp() override {
    options_.importance.cold_after = absl::Seconds(60);
    options_.importance.default_policy.params.sink_tokens = 0;
    options_.importance.default_policy.params.recent_window = 0;
  }
  // A cache of `host_slabs` 64 KiB slabs over a GPU tier of `device_bytes`
  // (slots of 8 KiB in 64 KiB slabs), with an in-memory lower tier if asked.
  void MakeCache(uint64_t host_slabs, uint64_t device_bytes, bool lower = false) {
    cache_.reset();
    auto tier = OpenGpuDeviceTier({.kind = "host_stand_in",
                                   .capacity_bytes = device_bytes,
                                   .arena_bytes = kSlab,
                                   .slab_bytes = kSlab,
                                   .min_block_bytes = 4096});
    ASSERT_TRUE(tier.ok()) << tier.status();
    device_ = *tier;
    auto pool = SlabPool::Create(
        {.capacity_bytes = host_slabs * kSlab, .slab_bytes = kSlab, .min_class_bytes = 64});
    ASSERT_TRUE(pool.ok()) << pool.status();
    std::shared_ptr<Tier> store;
    if (lower) store = MemoryTier::Create(uint64_t{64} << 20);
    cache_ = std::make_unique<Cache>(options_, *std::move(pool), NewLruPolicy(), &clock_, store,
                                     lower ? NewLruPolicy() : nullptr, device_);
    ASSERT_TRUE(cache_->RegisterModel(kModel, kLayout).ok());
  }

  void Append(uint32_t id, uint32_t blocks) {
    const std::vector<Token> tokens = Sequence(id, blocks);
    auto session = cache_->BeginAppend(kModel, tokens, 0, {}, {});
    ASSERT_TRUE(session.ok()) << session.status();
    for (uint32_t b = 0; b < blocks; ++b) {
      ASSERT_TRUE((*session)->Write(BlockBytes(id, b)).ok());
    }
    auto r = (*session)->Commit();
    ASSERT_TRUE(r.ok()) << r.status();
  }

  // The bytes of `slot` as a worker sees them: through its own mapping of
  // the daemon's arena.
  std::vector<std::byte> WorkerRead(const DeviceSlot& slot) {
    for (const DeviceArena& a : device_->Arenas()) {
      gpu::ExportedArena e{.arena = a.arena};
      std::memcpy(&e.handle, a.ipc_handle.data(), sizeof(e.handle));
      EXPECT_TRUE(mappings_.Map(e).ok());
    }
    std::byte* at = nullptr;
    const gpu::GpuStatus s = mappings_.Resolve(slot.arena, slot.offset, slot.bytes, &at);
    EXPECT_TRUE(s.ok()) << s.ToString();
    std::vector<std::byte> out(slot.bytes);
    if (s.ok()) std::memcpy(out.data(), at, slot.bytes);  // stand-in pointers are host memory
    return out;
  }

  // Every placed block holds exactly what was appended for sequence `id`.
  void ExpectPlacementHolds(const DevicePlacement& p, uint32_t id) {
    for (const DeviceBlock& b : p.blocks) {
      const std::vector<std::byte> want = BlockBytes(id, b.index);
      EXPECT_EQ(b.slot.bytes, kBlockBytes);
      EXPECT_EQ(b.checksum, Checksum(want));
      EXPECT_TRUE(WorkerRead(b.slot) == want) << "block " << b.index;
    }
  }

  CacheOptions options_;
  ManualClock clock_;
  std::shared_ptr<DeviceTier> device_;
  std::unique_ptr<Cache> cache_;
  std::unique_ptr<gpu::DeviceMemory> worker_device_ = gpu::NewHostStandInMemory();
  gpu::ArenaMappings mappings_{worker_device_.get()};
};

TEST_F(DeviceCacheTest, PlacesTheCachedPrefixAndAWorkerReadsItsSlots) {
  MakeCache(16, uint64_t{1} << 20);
  Append(1, 4);
  std::vector<Token> asked = Sequence(1, 6);  // two blocks more than cached
  auto p = cache_->tiers().PlaceOnDevice(kModel, asked);
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_EQ(p->matched_tokens, 4 * kBt);
  EXPECT_EQ(p->unplaced_tokens, 0u);
  EXPECT_EQ(p->copied_blocks, 4u);
  ASSERT_EQ(p->blocks.size(), 4u);
  EXPECT_NE(p->lease_id, 0u);
  ExpectPlacementHolds(*p, 1);

  // Placed again: found there, nothing copied.
  auto again = cache_->tiers().PlaceOnDevice(kModel, asked);
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(again->copied_blocks, 0u);
  EXPECT_EQ(again->blocks[2].slot.offset, p->blocks[2].slot.offset);
  const CacheStats s = cache_->GetStats();
  EXPECT_EQ(s.tiers.device_blocks, 4u);
  EXPECT_EQ(s.tiers.device_placements, 4u);
  EXPECT_EQ(s.tiers.device_hits, 4u);
  EXPECT_TRUE(s.has_device);
  EXPECT_EQ(s.device_store.live_copies, 4u);
  EXPECT_EQ(s.device_store.kind, "gpu");
  // The lease works as a Lookup's does: a fetch by lease serves the bytes.
  auto plan = cache_->PrepareFetch(kModel, {.lease_id = p->lease_id});
  ASSERT_TRUE(plan.ok());
  EXPECT_EQ(plan->matched_tokens, 4 * kBt);
  EXPECT_TRUE(cache_->ReleaseLease(p->lease_id));
  EXPECT_TRUE(cache_->ReleaseLease(again->lease_id));
}

TEST_F(DeviceCacheTest, BadRequestsChangeNothing) {
  MakeCache(16, uint64_t{1} << 20);
  Append(1, 2);
  EXPECT_EQ(cache_->tiers().PlaceOnDevice({"default", "nope"}, Sequence(1, 2)).status().code(),
            absl::StatusCode::kNotFound);
  EXPECT_EQ(cache_->tiers().PlaceOnDevice(kModel, Sequence(1, 2), absl::Hours(48)).status().code(),
            absl::StatusCode::kInvalidArgument);
  auto miss = cache_->tiers().PlaceOnDevice(kModel, Sequence(9, 2));
  ASSERT_TRUE(miss.ok());
  EXPECT_EQ(miss->matched_tokens, 0u);
  EXPECT_EQ(miss->lease_id, 0u);
  EXPECT_EQ(cache_->GetStats().tiers.device_blocks, 0u);
  EXPECT_EQ(cache_->GetStats().active_leases, 0u);

  // Without a GPU tier.
  auto pool = SlabPool::Create({.capacity_bytes = 4 * kSlab, .slab_bytes = kSlab});
  ASSERT_TRUE(pool.ok());
  Cache plain(options_, *std::move(pool), NewLruPolicy(), &clock_);
  ASSERT_TRUE(plain.RegisterModel(kModel, kLayout).ok());
  EXPECT_EQ(plain.tiers().PlaceOnDevice(kModel, Sequence(1, 2)).status().code(),
            absl::StatusCode::kFailedPrecondition);
}

TEST_F(DeviceCacheTest, LeasedCopiesStayPutWhileTheTierMakesRoom) {
  // Room for 8 blocks on the device; 12 blocks placed 4 at a time.
  MakeCache(64, 8 * kBlockBytes);
  for (uint32_t id = 1; id <= 3; ++id) Append(id, 4);
  auto first = cache_->tiers().PlaceOnDevice(kModel, Sequence(1, 4));
  ASSERT_TRUE(first.ok());
  ASSERT_EQ(first->matched_tokens, 4 * kBt);
  auto second = cache_->tiers().PlaceOnDevice(kModel, Sequence(2, 4));
  ASSERT_TRUE(second.ok());
  ASSERT_EQ(second->matched_tokens, 4 * kBt);
  // Full, and every copy leased: the third placement cannot make room.
  auto third = cache_->tiers().PlaceOnDevice(kModel, Sequence(3, 4));
  ASSERT_TRUE(third.ok()) << third.status();
  EXPECT_EQ(third->matched_tokens, 0u);
  EXPECT_EQ(third->unplaced_tokens, 4 * kBt);
  EXPECT_EQ(third->lease_id, 0u);
  ExpectPlacementHolds(*first, 1);
  ExpectPlacementHolds(*second, 2);

  // Released, the first sequence's copies are the least recently used: the
  // third placement takes their room, and the second's stay as reported.
  EXPECT_TRUE(cache_->ReleaseLease(first->lease_id));
  auto retry = cache_->tiers().PlaceOnDevice(kModel, Sequence(3, 4));
  ASSERT_TRUE(retry.ok());
  EXPECT_EQ(retry->matched_tokens, 4 * kBt);
  ExpectPlacementHolds(*retry, 3);
  ExpectPlacementHolds(*second, 2);
  EXPECT_EQ(cache_->GetStats().tiers.device_drops_room, 4u);
  // The dropped copies were clean: the blocks are still served from host memory.
  auto plan = cache_->PrepareFetch(kModel, {.tokens = Sequence(1, 4)});
  ASSERT_TRUE(plan.ok());
  EXPECT_EQ(plan->matched_tokens, 4 * kBt);
}

TEST_F(DeviceCacheTest, MigrateDropsUnleasedCopiesDownToTheLowWatermark) {
  options_.tiers.device_high_watermark = 0.5;
  options_.tiers.device_low_watermark = 0.25;
  MakeCache(64, 16 * kBlockBytes);
  Append(1, 12);
  auto p = cache_->tiers().PlaceOnDevice(kModel, Sequence(1, 12));
  ASSERT_TRUE(p.ok());
  ASSERT_EQ(p->matched_tokens, 12 * kBt);
  EXPECT_TRUE(cache_->tiers().NeedsMigration());
  EXPECT_EQ(cache_->tiers().Migrate().device_drops, 0u);  // all leased
  ASSERT_TRUE(cache_->ReleaseLease(p->lease_id));
  const MigrationResult r = cache_->tiers().Migrate();
  EXPECT_EQ(r.device_drops, 8u);  // 12 -> 4 blocks of 16
  EXPECT_FALSE(cache_->tiers().NeedsMigration());
  EXPECT_EQ(cache_->GetStats().tiers.device_drops_pressure, 8u);
  EXPECT_EQ(cache_->GetStats().device_store.live_copies, 4u);
  // LRU order: the placement touched blocks leaf first, so the prefix's
  // first blocks are the most recent and stay.
  auto again = cache_->tiers().PlaceOnDevice(kModel, Sequence(1, 12));
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(again->copied_blocks, 8u);
  ExpectPlacementHolds(*again, 1);
}

TEST_F(DeviceCacheTest, ACopyWhoseBlockIsRecompressedIsDroppedAndNotPlacedAgain) {
  MakeCache(64, uint64_t{1} << 20);
  Append(1, 4);
  auto p = cache_->tiers().PlaceOnDevice(kModel, Sequence(1, 4));
  ASSERT_TRUE(p.ok());
  ASSERT_TRUE(cache_->ReleaseLease(p->lease_id));
  ASSERT_EQ(cache_->GetStats().tiers.device_blocks, 4u);
  ASSERT_TRUE(cache_->UpdatePolicy(kModel, {.mode = CompressionMode::kQuantize}).ok());
  clock_.Advance(absl::Seconds(61));
  const CompactionResult c = Compactor(cache_.get()).Compact();
  ASSERT_GT(c.compressed_blocks, 0u);
  const CacheStats s = cache_->GetStats();
  EXPECT_EQ(s.tiers.device_drops_invalidated, c.compressed_blocks);
  EXPECT_EQ(s.tiers.device_blocks, 4 - c.compressed_blocks);
  // A lossy block is never placed: the placement stops before it.
  auto after = cache_->tiers().PlaceOnDevice(kModel, Sequence(1, 4));
  ASSERT_TRUE(after.ok());
  EXPECT_LT(after->matched_tokens, 4 * kBt);
  EXPECT_GT(after->withheld_tokens, 0u);
  ExpectPlacementHolds(*after, 1);
}

TEST_F(DeviceCacheTest, SsdOnlyBlocksAreReadBackAndPlaced) {
  // Migrate keeps at most 28 of the GPU tier's 128 slots.
  options_.tiers.device_high_watermark = 0.22;
  options_.tiers.device_low_watermark = 0.22;
  // A host tier of 2 slabs (16 blocks) over an in-memory lower tier.
  MakeCache(2, uint64_t{1} << 20, /*lower=*/true);
  for (uint32_t id = 1; id <= 4; ++id) Append(id, 8);  // 32 blocks: half demoted
  const CacheStats before = cache_->GetStats();
  ASSERT_GT(before.tiers.lower_only_blocks(), 0u);
  for (uint32_t id = 1; id <= 4; ++id) {
    auto p = cache_->tiers().PlaceOnDevice(kModel, Sequence(id, 8));
    ASSERT_TRUE(p.ok()) << p.status();
    EXPECT_EQ(p->matched_tokens, 8 * kBt) << id;
    ExpectPlacementHolds(*p, id);
    ASSERT_TRUE(cache_->ReleaseLease(p->lease_id));
  }
  EXPECT_GT(cache_->GetStats().tiers.lower[0].reads, 0u);
  // The first 4 blocks of sequence 1 are the least recently placed: they
  // lose their device copies, the other 28 keep theirs.
  ASSERT_EQ(cache_->tiers().Migrate().device_drops, 4u);
  const CacheStats placed = cache_->GetStats();
  // Placed again: only blocks without a device copy may be read back.
  auto p = cache_->tiers().PlaceOnDevice(kModel, Sequence(1, 8));
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_EQ(p->copied_blocks, 4u);
  ExpectPlacementHolds(*p, 1);
  EXPECT_LE(cache_->GetStats().tiers.lower[0].reads - placed.tiers.lower[0].reads, 4u);
  ASSERT_TRUE(cache_->ReleaseLease(p->lease_id));
}

TEST_F(DeviceCacheTest, FetchByAPlacementLeaseReadsBlocksOnlyTheSsdAndTheDeviceHold) {
  // A placement leases blocks whose host copies were demoted: the lease
  // holds device and SSD copies only. A fetch by that lease serves host
  // bytes, so it reads the SSD copies back (verified), never a null block.
  options_.tiers.device_high_watermark = 0.9;
  options_.tiers.device_low_watermark = 0.9;
  MakeCache(2, uint64_t{1} << 20, /*lower=*/true);  // a 16-block host tier
  Append(1, 8);
  auto first =
      cache_->tiers().PlaceOnDevice(kModel, Sequence(1, 8));  // device copies of sequence 1
  ASSERT_TRUE(first.ok()) << first.status();
  ASSERT_EQ(first->matched_tokens, 8 * kBt);
  ASSERT_TRUE(cache_->ReleaseLease(first->lease_id));
  // Newer sequences push sequence 1's host copies down to the lower tier;
  // its device copies stay.
  for (uint32_t id = 2; id <= 4; ++id) Append(id, 8);
  (void)cache_->tiers().Migrate();
  // Placed again: every block is on the device already, some only there
  // and in the lower tier.
  auto placed = cache_->tiers().PlaceOnDevice(kModel, Sequence(1, 8));
  ASSERT_TRUE(placed.ok()) << placed.status();
  ASSERT_EQ(placed->matched_tokens, 8 * kBt);
  ASSERT_EQ(placed->copied_blocks, 0u);
  ASSERT_GT(cache_->GetStats().tiers.lower_only_blocks(), 0u);  // the state this test is about
  auto plan = cache_->PrepareFetch(kModel, {.lease_id = placed->lease_id, .accept_lossy = false});
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_EQ(plan->matched_tokens, 8 * kBt);
  ASSERT_EQ(plan->blocks.size(), 8u);
  for (uint32_t b = 0; b < plan->blocks.size(); ++b) {
    ASSERT_NE(plan->blocks[b], nullptr) << "block " << b;
    const std::vector<std::byte> want = BlockBytes(1, b);
    ASSERT_EQ(plan->blocks[b]->size(), want.size());
    EXPECT_EQ(std::memcmp(plan->blocks[b]->data().data(), want.data(), want.size()), 0) << b;
  }
  ASSERT_TRUE(cache_->ReleaseLease(placed->lease_id));
}

TEST_F(DeviceCacheTest, ConcurrentPlacementsAppendsAndMigrationServeOnlyAppendedBytes) {
  options_.tiers.device_high_watermark = 0.6;
  options_.tiers.device_low_watermark = 0.3;
  MakeCache(32, 24 * kBlockBytes);  // a tiny device: constant churn
  constexpr uint32_t kSequences = 24;
  for (uint32_t id = 1; id <= kSequences; ++id) Append(id, 3);
  std::atomic<bool> stop{false};
  std::atomic<int> bad{0};
  std::atomic<uint64_t> placed{0};
  std::thread migrator([&] {
    while (!stop.load()) (void)cache_->tiers().Migrate();
  });
  std::vector<std::thread> workers;
  for (int t = 0; t < 8; ++t) {
    workers.emplace_back([&, t] {
      std::unique_ptr<gpu::DeviceMemory> mine = gpu::NewHostStandInMemory();
      gpu::ArenaMappings maps(mine.get());
      std::mt19937 rng(t);
      for (int i = 0; i < 300; ++i) {
        const uint32_t id = 1 + rng() % kSequences;
        auto p = cache_->tiers().PlaceOnDevice(kModel, Sequence(id, 3));
        if (!p.ok()) {
          ++bad;
          continue;
        }
        for (const DeviceArena& a : device_->Arenas()) {
          gpu::ExportedArena e{.arena = a.arena};
          std::memcpy(&e.handle, a.ipc_handle.data(), sizeof(e.handle));
          if (!maps.Map(e).ok()) ++bad;
        }
        for (const DeviceBlock& b : p->blocks) {
          std::byte* at = nullptr;
          if (!maps.Resolve(b.slot.arena, b.slot.offset, b.slot.bytes, &at).ok() ||
              Checksum({at, b.slot.bytes}) != Checksum(BlockBytes(id, b.index))) {
            ++bad;
          }
        }
        placed += p->blocks.size();
        if (p->lease_id != 0 && !cache_->ReleaseLease(p->lease_id)) ++bad;
        if (i % 50 == 0) {  // appends and evictions race the placements
          (void)cache_->EvictPrefix(kModel, Sequence(id, 3));
          std::vector<Token> tokens = Sequence(id, 3);
          auto session = cache_->BeginAppend(kModel, tokens, 0, {}, {});
          if (session.ok()) {
            for (uint32_t b = 0; b < 3; ++b) (void)(*session)->Write(BlockBytes(id, b));
            (void)(*session)->Commit();
          }
        }
      }
    });
  }
  for (std::thread& w : workers) w.join();
  stop = true;
  migrator.join();
  EXPECT_EQ(bad.load(), 0);
  EXPECT_GT(placed.load(), 1000u);
  const CacheStats s = cache_->GetStats();
  EXPECT_EQ(s.active_leases, 0u);
  EXPECT_EQ(s.device_store.live_copies, s.tiers.device_blocks);
  EXPECT_LE(s.device_store.allocated_bytes, s.device_store.capacity_bytes);
}

}  // namespace
}  // namespace kvcache
