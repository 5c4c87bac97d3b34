// The Cache over two tiers: host memory and a lower tier (a MemoryTier
// standing in for the SSD). Demotion, promotion, admission, the lower tier's
// own eviction, leases across tiers, and corrupt copies that must never be
// served.
#include <future>
#include <thread>

#include "server/core/cache_test_util.h"
#include "server/core/gated_tier.h"
#include "server/core/memory_tier.h"

namespace kvcache {
namespace cache_test {
namespace {

// Every test runs with each eviction policy ranking both tiers.
class TierTest : public CacheTest, public ::testing::WithParamInterface<std::string> {
 protected:
  void SetUp() override {}

  // The fixture's watermarks leave a fifth of the host free after a
  // migration (the defaults keep 0.96 of it full), so fetches may promote.
  static CacheOptions RoomyOptions() {
    CacheOptions options;
    options.tiers.host_high_watermark = 0.9;
    options.tiers.host_low_watermark = 0.8;
    return options;
  }
  // A host tier of `slabs` 64 KiB slabs over a lower tier of `lower_bytes`,
  // seen through gated_ when `gated`.
  void MakeTiered(uint64_t slabs, uint64_t lower_bytes, CacheOptions options = RoomyOptions(),
                  bool gated = false) {
    cache_.reset();
    auto pool = SlabPool::Create(
        {.capacity_bytes = slabs * kSlab, .slab_bytes = kSlab, .min_class_bytes = 64});
    ASSERT_TRUE(pool.ok()) << pool.status();
    lower_ = MemoryTier::Create(lower_bytes);
    gated_ = gated ? std::make_shared<GatedTier>(lower_) : nullptr;
    std::shared_ptr<Tier> tier = lower_;
    if (gated) tier = gated_;
    cache_ = std::make_unique<Cache>(options, *std::move(pool), NewPolicy(), &clock_,
                                     std::move(tier), NewPolicy());
  }
  std::unique_ptr<EvictionPolicy> NewPolicy() {
    return GetParam() == "lru_k" ? NewLruKPolicy(LruKOptions{}, &clock_) : NewLruPolicy();
  }

  // Appends sequences 0..n-1 of `blocks` blocks each (Big: 8 KiB blocks).
  void AppendSequences(uint32_t n, uint32_t blocks) {
    for (uint32_t s = 0; s < n; ++s) {
      auto r = Append(*cache_, Big(), SequenceOf(s, blocks));
      ASSERT_TRUE(r.ok()) << "sequence " << s << ": " << r.status();
    }
  }
  static std::vector<Token> SequenceOf(uint32_t s, uint32_t blocks) {
    Ids ids;
    for (uint32_t b = 0; b < blocks; ++b) ids.push_back(s * 100 + b + 1);
    return Seq(ids);
  }

  TierCounters Tiers() const { return cache_->GetStats().tiers; }

  // A host tier of 32 blocks over a roomy lower tier, 48 blocks appended
  // (the first sequences demoted), and the host brought below its high
  // watermark so fetches may promote.
  void FillPastTheHost() {
    MakeTiered(4, 4 << 20);
    Register(Big());
    AppendSequences(12, 4);
    while (cache_->tiers().NeedsMigration()) cache_->tiers().Migrate();
  }

  std::shared_ptr<MemoryTier> lower_;
  std::shared_ptr<GatedTier> gated_;  // set by MakeTiered(..., gated = true)
};

TEST_P(TierTest, AppendsPastHostCapacityDemoteInsteadOfEvicting) {
  MakeTiered(4, 4 << 20);  // host: 32 blocks of 8 KiB; lower: 512
  Register(Big());
  AppendSequences(20, 4);  // 80 blocks: 2.5x the host
  const CacheStats stats = cache_->GetStats();
  EXPECT_EQ(stats.blocks, 80u);
  EXPECT_GT(stats.tiers.lower[0].demotions, 0u);
  EXPECT_EQ(stats.tiers.lower[0].evictions, 0u);
  EXPECT_EQ(stats.capacity_evictions, 0u);
  EXPECT_EQ(stats.lower_stores[0].live_copies, stats.tiers.lower[0].blocks);
  // Every sequence is still whole, whichever tier holds it, and every byte
  // fetched back is the byte appended.
  for (uint32_t s = 0; s < 20; ++s) {
    const std::vector<Token> tokens = SequenceOf(s, 4);
    EXPECT_EQ(Matched(Big(), tokens), 4 * kBt) << "sequence " << s;
    EXPECT_EQ(Fetched(Big(), tokens), 4 * kBt) << "sequence " << s;
  }
  EXPECT_GT(Tiers().lower[0].reads, 0u);
}

TEST_P(TierTest, AFetchHoldsAtMostMaxFetchHeapBytesOfReadBackBlocks) {
  // Nothing is promoted, so every block read back goes to the heap; a fetch
  // may hold two 8 KiB blocks of it.
  CacheOptions options = RoomyOptions();
  options.tiers.promote_on_fetch = false;
  options.max_fetch_heap_bytes = 2 * 8192;
  MakeTiered(4, 4 << 20, options);
  Register(Big());
  AppendSequences(12, 4);  // the first sequences live in the lower tier only
  const std::vector<Token> tokens = SequenceOf(0, 4);
  ASSERT_EQ(Matched(Big(), tokens), 4 * kBt);
  const uint64_t reads_before = Tiers().lower[0].reads;
  // The plan ends where the heap bound is reached: a shorter prefix, every
  // byte of it the byte appended, and no block past it read.
  EXPECT_EQ(Fetched(Big(), tokens), 2 * kBt);
  EXPECT_EQ(Tiers().lower[0].reads - reads_before, 2u);
  EXPECT_EQ(Tiers().heap_bounded_fetches, 1u);
  // max_blocks cuts the plan before anything is read back.
  auto one =
      cache_->PrepareFetch(Big().key, {.tokens = tokens, .accept_lossy = false, .max_blocks = 1});
  ASSERT_TRUE(one.ok()) << one.status();
  EXPECT_EQ(one->matched_tokens, kBt);
  EXPECT_TRUE(PlanHolds(*one, Big(), tokens));
  EXPECT_EQ(Tiers().lower[0].reads - reads_before, 3u);
}

TEST_P(TierTest, LookupSaysWhichTierHoldsEachBlock) {
  MakeTiered(4, 4 << 20);
  Register(Big());
  AppendSequences(12, 4);  // 48 blocks; the first sequences were demoted
  auto first = cache_->Lookup(Big().key, SequenceOf(0, 4));
  ASSERT_TRUE(first.ok());
  ASSERT_EQ(first->blocks.size(), 4u);
  for (const BlockInfo& b : first->blocks) EXPECT_EQ(b.tier, BlockTier::kLower);
  auto last = cache_->Lookup(Big().key, SequenceOf(11, 4));
  ASSERT_TRUE(last.ok());
  for (const BlockInfo& b : last->blocks) EXPECT_EQ(b.tier, BlockTier::kHost);
  // The descriptors are the same as when the block was in host memory.
  const std::vector<Token> tokens = SequenceOf(0, 4);
  EXPECT_EQ(first->blocks[2].checksum, Checksum(Pattern(Big(), tokens, 2)));
  EXPECT_EQ(first->blocks[2].key, PrefixKey(tokens, 2));
}

TEST_P(TierTest, FetchPromotesAndALaterDemotionIsAFreeDrop) {
  MakeTiered(4, 4 << 20);
  Register(Big());
  AppendSequences(12, 4);
  const std::vector<Token> tokens = SequenceOf(0, 4);
  // Make room so the fetch may promote.
  while (cache_->tiers().NeedsMigration()) cache_->tiers().Migrate();
  const uint64_t writes_before = lower_->GetStats().writes;
  const uint64_t demotions_before = Tiers().lower[0].demotions;
  EXPECT_EQ(Fetched(Big(), tokens), 4 * kBt);
  EXPECT_EQ(Tiers().lower[0].promotions, 4u);
  auto again = cache_->Lookup(Big().key, tokens);
  ASSERT_TRUE(again.ok());
  for (const BlockInfo& b : again->blocks) EXPECT_EQ(b.tier, BlockTier::kHost);
  // The migration log has every move so far: demotions and the promotions.
  std::vector<MoveRecord> moves = cache_->tiers().DrainMoves();
  EXPECT_EQ(std::count_if(moves.begin(), moves.end(),
                          [](const MoveRecord& m) {
                            return std::string_view(m.reason) == "fetch" &&
                                   std::string_view(m.to) == "host" && m.bytes == 8192;
                          }),
            4);
  EXPECT_EQ(std::count_if(moves.begin(), moves.end(),
                          [](const MoveRecord& m) { return std::string_view(m.to) == "memory"; }),
            static_cast<ptrdiff_t>(Tiers().lower[0].demotions));
  EXPECT_TRUE(cache_->tiers().DrainMoves().empty());
  // Push the promoted blocks out again: they are still below, so no write.
  AppendSequences(24, 4);
  EXPECT_GE(Tiers().lower[0].clean_drops, 4u);
  moves = cache_->tiers().DrainMoves();
  EXPECT_GE(
      std::count_if(moves.begin(), moves.end(),
                    [](const MoveRecord& m) { return std::string_view(m.reason) == "clean"; }),
      4);
  // Writes are demotions only: the clean drops wrote nothing.
  EXPECT_EQ(lower_->GetStats().writes - writes_before,
            Tiers().lower[0].demotions - demotions_before);
  EXPECT_EQ(Fetched(Big(), tokens), 4 * kBt);
}

TEST_P(TierTest, PrefetchWaitPromotesBeforeItReturns) {
  FillPastTheHost();
  const std::vector<Token> tokens = SequenceOf(0, 4);
  ASSERT_EQ(cache_->Lookup(Big().key, tokens)->blocks[0].tier, BlockTier::kLower);
  EXPECT_TRUE(cache_->tiers().Prefetch(Big().key, tokens, false, PrefetchMode::kWait,
                                       absl::ZeroDuration()));
  auto after = cache_->Lookup(Big().key, tokens);
  ASSERT_TRUE(after.ok());
  EXPECT_EQ(after->matched_tokens, 4 * kBt);
  for (const BlockInfo& b : after->blocks) EXPECT_EQ(b.tier, BlockTier::kHost);
  EXPECT_EQ(Tiers().lower[0].promotions, 4u);
  const WorkStats p = cache_->GetStats().prefetch;
  EXPECT_EQ(p.issued, 1u);
  EXPECT_EQ(p.completed, 1u);
  EXPECT_EQ(p.late, 0u);
  EXPECT_EQ(Fetched(Big(), tokens), 4 * kBt);
}

// What a PrepareFetchAsync call answered, and on which thread.
struct AsyncAnswer {
  absl::StatusOr<FetchPlan> plan;
  std::thread::id thread;
};
std::future<AsyncAnswer> PrepareAsync(Cache& cache, const ModelKey& model,
                                      std::span<const Token> tokens) {
  auto answer = std::make_shared<std::promise<AsyncAnswer>>();
  std::future<AsyncAnswer> future = answer->get_future();
  cache.PrepareFetchAsync(model, {.tokens = tokens}, [answer](absl::StatusOr<FetchPlan> plan) {
    answer->set_value({std::move(plan), std::this_thread::get_id()});
  });
  return future;
}

// The fetch-read counts once the workers have counted `completed` jobs: a
// fetch's answer is given inside its job, just before its worker counts it,
// so a caller woken by the answer may look before the count moves.
WorkStats SettledFetchReads(const Cache& cache, uint64_t completed) {
  WorkStats reads = cache.GetStats().fetch_reads;
  for (int i = 0; i < 10000 && reads.completed < completed; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
    reads = cache.GetStats().fetch_reads;
  }
  return reads;
}

TEST_P(TierTest, AnAsyncFetchReadsTheLowerTierOnAFetchReadThread) {
  FillPastTheHost();
  const std::vector<Token> tokens = SequenceOf(0, 4);
  ASSERT_EQ(cache_->Lookup(Big().key, tokens)->blocks[0].tier, BlockTier::kLower);
  const uint64_t reads_before = Tiers().lower[0].reads;
  std::future<AsyncAnswer> future = PrepareAsync(*cache_, Big().key, tokens);
  ASSERT_EQ(future.wait_for(std::chrono::seconds(10)), std::future_status::ready);
  AsyncAnswer answer = future.get();
  ASSERT_TRUE(answer.plan.ok()) << answer.plan.status();
  EXPECT_NE(answer.thread, std::this_thread::get_id());
  // The same plan the synchronous call makes: every block, the bytes appended.
  EXPECT_EQ(answer.plan->matched_tokens, 4 * kBt);
  EXPECT_TRUE(PlanHolds(*answer.plan, Big(), tokens));
  EXPECT_EQ(Tiers().lower[0].reads - reads_before, 4u);
  const WorkStats reads = SettledFetchReads(*cache_, 1);
  EXPECT_EQ(reads.issued, 1u);
  EXPECT_EQ(reads.completed, 1u);
  EXPECT_EQ(reads.dropped, 0u);
}

TEST_P(TierTest, AnAsyncFetchOfHostBlocksOrOfNothingAnswersInline) {
  FillPastTheHost();
  const std::vector<Token> hot = SequenceOf(11, 4);
  ASSERT_EQ(cache_->Lookup(Big().key, hot)->blocks[0].tier, BlockTier::kHost);
  AsyncAnswer answer = PrepareAsync(*cache_, Big().key, hot).get();
  ASSERT_TRUE(answer.plan.ok()) << answer.plan.status();
  EXPECT_EQ(answer.thread, std::this_thread::get_id());
  EXPECT_TRUE(PlanHolds(*answer.plan, Big(), hot));
  // An error (a model never registered) answers inline too.
  AsyncAnswer unknown = PrepareAsync(*cache_, Small().key, hot).get();
  EXPECT_EQ(unknown.plan.status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(unknown.thread, std::this_thread::get_id());
  EXPECT_EQ(cache_->GetStats().fetch_reads.issued, 0u);
}

TEST_P(TierTest, AnAsyncFetchReadsOnItsOwnThreadWhenTheReadQueueIsFull) {
  CacheOptions options = RoomyOptions();
  options.tiers.fetch_read_threads = 1;
  options.tiers.fetch_read_queue = 1;
  MakeTiered(4, 4 << 20, options, /*gated=*/true);
  Register(Big());
  AppendSequences(12, 4);
  while (cache_->tiers().NeedsMigration()) cache_->tiers().Migrate();
  for (uint32_t s = 0; s < 3; ++s) {
    ASSERT_EQ(cache_->Lookup(Big().key, SequenceOf(s, 4))->blocks[0].tier, BlockTier::kLower);
  }
  auto await_waiting = [&](int n) {
    for (int i = 0; i < 5000 && gated_->waiting() < n; ++i) {
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    return gated_->waiting();
  };
  gated_->Close();
  // Sequence 0 holds the one fetch-read thread at the gate; sequence 1 waits
  // in the queue, which is then full.
  std::future<AsyncAnswer> held = PrepareAsync(*cache_, Big().key, SequenceOf(0, 4));
  ASSERT_EQ(await_waiting(1), 1);
  std::future<AsyncAnswer> queued = PrepareAsync(*cache_, Big().key, SequenceOf(1, 4));
  ASSERT_EQ(cache_->GetStats().fetch_reads.issued, 2u);
  // A third is refused by the queue: its reads run on the thread that asked.
  std::thread::id asker;
  std::future<AsyncAnswer> third;
  std::thread asking([&] {
    asker = std::this_thread::get_id();
    third = PrepareAsync(*cache_, Big().key, SequenceOf(2, 4));
  });
  EXPECT_EQ(await_waiting(2), 2);
  gated_->Open();
  asking.join();
  const std::vector<std::pair<std::future<AsyncAnswer>*, uint32_t>> answers = {
      {&held, 0}, {&queued, 1}, {&third, 2}};
  for (auto [future, s] : answers) {
    ASSERT_EQ(future->wait_for(std::chrono::seconds(10)), std::future_status::ready) << s;
    AsyncAnswer answer = future->get();
    ASSERT_TRUE(answer.plan.ok()) << s << ": " << answer.plan.status();
    EXPECT_TRUE(PlanHolds(*answer.plan, Big(), SequenceOf(s, 4))) << s;
    if (s == 2) {
      EXPECT_EQ(answer.thread, asker);
    } else {
      EXPECT_NE(answer.thread, asker);
      EXPECT_NE(answer.thread, std::this_thread::get_id());
    }
  }
  const WorkStats reads = SettledFetchReads(*cache_, 2);
  EXPECT_EQ(reads.issued, 2u);
  EXPECT_EQ(reads.completed, 2u);
  EXPECT_EQ(reads.dropped, 1u);  // counted as outcome="inline"
}

TEST_P(TierTest, PrefetchBestEffortPromotesInTheBackground) {
  FillPastTheHost();
  const std::vector<Token> tokens = SequenceOf(1, 4);
  EXPECT_FALSE(cache_->tiers().Prefetch(Big().key, tokens, false, PrefetchMode::kBestEffort,
                                        absl::ZeroDuration()));
  // The worker thread finishes on its own; wait for it (bounded).
  for (int i = 0; i < 5000 && cache_->GetStats().prefetch.completed == 0; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  EXPECT_EQ(cache_->GetStats().prefetch.completed, 1u);
  auto after = cache_->Lookup(Big().key, tokens);
  ASSERT_TRUE(after.ok());
  for (const BlockInfo& b : after->blocks) EXPECT_EQ(b.tier, BlockTier::kHost);
}

TEST_P(TierTest, MigrateBringsTheHostBelowItsLowWatermark) {
  CacheOptions options = RoomyOptions();
  options.tiers.host_high_watermark = 0.5;
  options.tiers.host_low_watermark = 0.25;
  MakeTiered(8, 4 << 20, options);
  Register(Big());
  AppendSequences(10, 4);  // 40 of 64 host blocks: past the high watermark
  ASSERT_TRUE(cache_->tiers().NeedsMigration());
  MigrationResult r;
  while (cache_->tiers().NeedsMigration() || r.demoted_blocks == 0) {
    const MigrationResult pass = cache_->tiers().Migrate();
    r.demoted_blocks += pass.demoted_blocks;
    if (pass.demoted_blocks == 0) break;
  }
  EXPECT_FALSE(cache_->tiers().NeedsMigration());
  EXPECT_LE(Allocated(), 8 * kSlab / 4);
  EXPECT_GT(r.demoted_blocks, 0u);
  for (uint32_t s = 0; s < 10; ++s) EXPECT_EQ(Fetched(Big(), SequenceOf(s, 4)), 4 * kBt);
}

TEST_P(TierTest, ACorruptLowerCopyIsDroppedNeverServed) {
  MakeTiered(4, 4 << 20);
  Register(Big());
  AppendSequences(12, 4);
  const std::vector<Token> tokens = SequenceOf(0, 4);
  // A lease holds the same copies as the index.
  auto leased = cache_->Lookup(Big().key, tokens, {.acquire = true});
  ASSERT_TRUE(leased.ok());
  ASSERT_EQ(leased->blocks[2].tier, BlockTier::kLower);
  ASSERT_EQ(lower_->Corrupt(PrefixKey(tokens, 2), 100), 1);
  auto plan = cache_->PrepareFetch(Big().key, {.tokens = tokens});
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_EQ(plan->matched_tokens, 2 * kBt);  // ends before the corrupt block
  EXPECT_TRUE(PlanHolds(*plan, Big(), tokens));
  EXPECT_EQ(Tiers().lower[0].checksum_failures, 1u);
  EXPECT_EQ(StatsOf(Big()).corrupt_blocks, 1u);
  // The block (and the one below it) left the cache.
  EXPECT_EQ(Matched(Big(), tokens), 2 * kBt);
  // The lease's copy is the same corrupt one: its fetch stops there too.
  auto lease_plan = cache_->PrepareFetch(Big().key, {.lease_id = leased->lease_id});
  ASSERT_TRUE(lease_plan.ok());
  EXPECT_EQ(lease_plan->matched_tokens, 2 * kBt);
  EXPECT_TRUE(PlanHolds(*lease_plan, Big(), tokens));
}

TEST_P(TierTest, TheAdmissionGateEvictsBlocksUsedOnce) {
  CacheOptions options = RoomyOptions();
  options.tiers.lower_admit_min_references = 3;  // append + two uses
  MakeTiered(4, 4 << 20, options);
  Register(Big());
  const std::vector<Token> hot = SequenceOf(0, 4);
  ASSERT_TRUE(Append(*cache_, Big(), hot).ok());
  EXPECT_EQ(Matched(Big(), hot), 4 * kBt);
  AppendSequences(12, 4);  // sequences 1..11 are used once; 0 (in the list again) hot
  const LowerLevelCounters t = Tiers().lower[0];
  EXPECT_GT(t.admissions_refused, 0u);
  EXPECT_EQ(t.admissions_refused, t.not_admitted_evictions);
  // Only the hot sequence reached the lower tier; cold ones were evicted.
  EXPECT_EQ(Matched(Big(), hot), 4 * kBt);
  EXPECT_EQ(Matched(Big(), SequenceOf(1, 4)), 0u);
  EXPECT_EQ(t.demotions, 4u);
}

TEST_P(TierTest, TheWriteBudgetSparesTheDevice) {
  CacheOptions options = RoomyOptions();
  options.tiers.lower_write_bytes_per_second = 3 * 8192;  // three blocks a second
  MakeTiered(4, 4 << 20, options);
  Register(Big());
  AppendSequences(12, 4);
  LowerLevelCounters t = Tiers().lower[0];
  EXPECT_EQ(t.demotions, 3u);
  EXPECT_GT(t.admissions_refused, 0u);
  // A refused block makes room by evicting a host block, never what the SSD
  // holds (that frees no host memory).
  EXPECT_EQ(t.evictions, 0u);
  EXPECT_EQ(t.blocks, 3u);
  clock_.Advance(absl::Seconds(1));  // the bucket refills
  AppendSequences(14, 4);
  t = Tiers().lower[0];
  EXPECT_EQ(t.demotions, 6u);
}

TEST_P(TierTest, AFullLowerTierEvictsItsColdestLeaves) {
  MakeTiered(4, 128 << 10);  // lower: 16 blocks
  Register(Big());
  AppendSequences(20, 4);  // 80 blocks > 32 + 16
  const CacheStats stats = cache_->GetStats();
  EXPECT_GT(stats.tiers.lower[0].evictions, 0u);
  EXPECT_LE(stats.lower_stores[0].allocated_bytes, uint64_t{128} << 10);
  // The newest sequences are whole; every byte served is right.
  for (uint32_t s = 0; s < 20; ++s) {
    const std::vector<Token> tokens = SequenceOf(s, 4);
    const uint64_t got = Fetched(Big(), tokens);
    if (s >= 17) {
      EXPECT_EQ(got, 4 * kBt) << "sequence " << s;
    }
  }
}

TEST_P(TierTest, ALeaseKeepsALowerBlockReadableAfterItLeaves) {
  MakeTiered(4, 4 << 20);
  Register(Big());
  AppendSequences(12, 4);
  const std::vector<Token> tokens = SequenceOf(0, 4);
  auto leased = cache_->Lookup(Big().key, tokens, {.acquire = true});
  ASSERT_TRUE(leased.ok());
  ASSERT_TRUE(cache_->EvictPrefix(Big().key, std::span(tokens).first(kBt)).ok());
  EXPECT_EQ(Matched(Big(), tokens), 0u);
  auto plan = cache_->PrepareFetch(Big().key, {.lease_id = leased->lease_id});
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_EQ(plan->matched_tokens, 4 * kBt);
  EXPECT_TRUE(PlanHolds(*plan, Big(), tokens));
  EXPECT_EQ(Tiers().lower[0].promotions, 0u);  // nothing to promote into: the blocks left
}

TEST_P(TierTest, UnregisterAndEvictFreeTheLowerTier) {
  MakeTiered(4, 4 << 20);
  Register(Big());
  AppendSequences(12, 4);
  ASSERT_GT(lower_->GetStats().live_copies, 0u);
  ASSERT_TRUE(cache_->EvictModel(Big().key).ok());
  EXPECT_EQ(lower_->GetStats().live_copies, 0u);
  EXPECT_EQ(Tiers().lower[0].blocks, 0u);
  EXPECT_EQ(Tiers().lower_only_blocks(), 0u);
  EXPECT_EQ(cache_->GetStats().payload_bytes, 0u);
}

// Many workers over tiny tiers: constant demotion, promotion and lower-tier
// eviction; every byte any of them fetches must be the byte appended.
TEST_P(TierTest, ConstantMigrationUnderConcurrencyServesOnlyExactBytes) {
  CacheOptions options = RoomyOptions();
  options.tiers.host_high_watermark = 0.6;
  options.tiers.host_low_watermark = 0.3;
  MakeTiered(4, 256 << 10, options);
  Register(Big());
  std::atomic<bool> stop{false};
  std::atomic<uint64_t> fetched_blocks{0}, bad{0};
  std::thread migrator([&] {
    while (!stop.load()) {
      if (cache_->tiers().Migrate().demoted_blocks == 0) std::this_thread::yield();
    }
  });
  std::vector<std::thread> workers;
  for (int w = 0; w < 16; ++w) {
    workers.emplace_back([&, w] {
      std::mt19937 rng(w);
      for (int i = 0; i < 1500; ++i) {
        const std::vector<Token> tokens = SequenceOf(rng() % 40, 1 + rng() % 4);
        if (rng() % 3 == 0) {
          auto r = Append(*cache_, Big(), tokens);
          if (!r.ok() && !absl::IsResourceExhausted(r.status()) && !absl::IsAborted(r.status())) {
            ++bad;
          }
        } else {
          auto plan = cache_->PrepareFetch(Big().key, {.tokens = tokens});
          if (!plan.ok() || !PlanHolds(*plan, Big(), tokens)) ++bad;
          if (plan.ok()) fetched_blocks += plan->blocks.size();
        }
      }
    });
  }
  for (std::thread& t : workers) t.join();
  stop = true;
  migrator.join();
  EXPECT_EQ(bad.load(), 0u);
  EXPECT_GT(fetched_blocks.load(), 0u);
  const CacheStats stats = cache_->GetStats();
  EXPECT_GT(stats.tiers.lower[0].demotions, 0u);
  EXPECT_EQ(stats.tiers.lower[0].checksum_failures, 0u);
  EXPECT_EQ(stats.lower_stores[0].live_copies, stats.tiers.lower[0].blocks);
}

INSTANTIATE_TEST_SUITE_P(Policies, TierTest, ::testing::Values("lru", "lru_k"),
                         [](const auto& info) { return info.param; });

}  // namespace
}  // namespace cache_test
}  // namespace kvcache
