// Randomized and concurrent tests of the Cache: thousands of operations
// checked against a reference model, and threads racing on shared prefixes
// with every fetched byte verified.
#include "server/core/cache_inspector.h"
#include "server/core/cache_test_util.h"

namespace kvcache {
namespace cache_test {
namespace {

// ---- Randomized against a reference ---------------------------------------------------

Ids Prefix(const Ids& ids, size_t k) { return Ids(ids.begin(), ids.begin() + k); }
bool StartsWith(const Ids& ids, const Ids& prefix) {
  return ids.size() >= prefix.size() && std::equal(prefix.begin(), prefix.end(), ids.begin());
}

// What one model should hold: every cached prefix (as block ids) and its
// expiry. Every prefix of a member is a member.
struct RefModel {
  bool registered = false;
  std::map<Ids, absl::Time> blocks;

  // Removes `prefix` and everything below it; returns how many blocks.
  uint64_t Erase(const Ids& prefix) {
    auto first = blocks.lower_bound(prefix), last = first;
    while (last != blocks.end() && StartsWith(last->first, prefix)) ++last;
    const auto n = static_cast<uint64_t>(std::distance(first, last));
    blocks.erase(first, last);
    return n;
  }
  // Cached blocks of `ids`; like any lookup, drops the first expired block's subtree.
  size_t Match(const Ids& ids, absl::Time now) {
    for (size_t k = 0; k < ids.size(); ++k) {
      auto it = blocks.find(Prefix(ids, k + 1));
      if (it == blocks.end()) return k;
      if (it->second <= now) {
        Erase(Prefix(ids, k + 1));
        return k;
      }
    }
    return ids.size();
  }
};

struct RefLease {
  size_t model;
  Ids ids;  // the leased blocks
  std::vector<Token> tokens;
  uint64_t id;
  absl::Time expires;
  bool released = false, broken = false;  // broken: a leased block was explicitly evicted
};

class RandomizedCacheTest : public CacheTest {
 protected:
  // exact: capacity is large enough that nothing is evicted for space, so the
  // cache agrees with the reference exactly. Otherwise the reference is an
  // upper bound, hints carry no TTL, and live leases keep their blocks.
  void Run(bool exact, uint64_t seed, int ops);
};

void RandomizedCacheTest::Run(bool exact, uint64_t seed, int ops) {
  MakeCache(exact ? 128 : 2);  // 2 slabs: one for each block size
  const TestModel models[] = {Small(), Mid(), {{"tenant-b", "small"}, Small().layout, 55}};
  RefModel ref[3];
  std::vector<RefLease> leases;
  std::mt19937_64 rng(seed);
  auto random_ids = [&](size_t lo, size_t hi) {
    Ids ids(lo + rng() % (hi - lo + 1));
    for (auto& id : ids) id = 1 + rng() % 3;
    return ids;
  };
  auto expect_at_most = [&](uint64_t got, uint64_t reference) {
    if (exact) {
      EXPECT_EQ(got, reference);
    } else {
      EXPECT_LE(got, reference);
    }
  };
  for (int op = 0; op < ops && !HasFatalFailure(); ++op) {
    SCOPED_TRACE(::testing::Message() << "op " << op);
    const size_t mi = rng() % 3;
    const TestModel& m = models[mi];
    RefModel& r = ref[mi];
    const Ids ids = random_ids(1, 6);
    const std::vector<Token> tokens = Seq(ids, rng() % kBt);
    const absl::Time now = clock_.Now();
    const int kind = rng() % 100;
    if (kind < 4) {
      auto result = cache_->RegisterModel(m.key, m.layout);
      ASSERT_TRUE(result.ok()) << result.status();
      EXPECT_EQ(result->created, !r.registered);
      r.registered = true;
    } else if (!r.registered) {
      EXPECT_EQ(CodeOf(cache_->Lookup(m.key, tokens)), kNotFound);
      EXPECT_EQ(CodeOf(cache_->PrepareFetch(m.key, {.tokens = tokens})), kNotFound);
    } else if (kind < 40) {  // append from a random point of the cached prefix
      auto lookup = cache_->Lookup(m.key, tokens);
      ASSERT_TRUE(lookup.ok());
      expect_at_most(lookup->matched_tokens, r.Match(ids, now) * kBt);
      const size_t have = lookup->matched_tokens / kBt;
      if (have < ids.size() && rng() % 10 == 0) {
        EXPECT_EQ(CodeOf(Append(*cache_, m, tokens, (have + 1) * kBt)), kFailedPrecondition);
        continue;
      }
      const size_t start = rng() % (have + 1);
      AppendHints hints{.priority = static_cast<int32_t>(rng() % 3)};
      if (exact && rng() % 3 == 0) hints.ttl = absl::Seconds(1 + rng() % 20);
      if (rng() % 20 == 0) {  // abandoned halfway
        const uint64_t before = Allocated();
        auto s = cache_->BeginAppend(m.key, tokens, start * kBt, hints, {});
        ASSERT_TRUE(s.ok()) << s.status();
        const std::vector<std::byte> kv = Kv(m, tokens, start, ids.size() - start);
        (void)WriteInChunks(**s, std::span(kv).first(kv.size() / 2));
        s->reset();
        expect_at_most(Allocated(), before);
        continue;
      }
      auto result = Append(*cache_, m, tokens, start * kBt, hints, rng() % 2 == 0);
      if (!exact && CodeOf(result) == kResourceExhausted) continue;
      ASSERT_TRUE(result.ok()) << result.status();
      EXPECT_EQ(result->cached_tokens, ids.size() * kBt);
      const absl::Time expires =
          hints.ttl == absl::ZeroDuration() ? absl::InfiniteFuture() : now + hints.ttl;
      uint32_t stored = 0;
      for (size_t k = 1; k <= ids.size(); ++k)
        stored += r.blocks.emplace(Prefix(ids, k), expires).second;
      if (exact) {
        EXPECT_THAT(CountsOf(*result), FieldsAre(stored, ids.size() - start - stored,
                                                 stored * m.layout.BlockBytes(), ids.size() * kBt));
      }
    } else if (kind < 55) {  // lookup, perhaps leased
      auto lookup = cache_->Lookup(
          m.key, tokens, {.acquire = rng() % 3 == 0, .ttl = absl::Seconds(1 + rng() % 300)});
      ASSERT_TRUE(lookup.ok());
      expect_at_most(lookup->matched_tokens, r.Match(ids, now) * kBt);
      for (const BlockInfo& b : lookup->blocks) {
        EXPECT_EQ(b.key, PrefixKey(tokens, b.index));
        EXPECT_EQ(b.checksum, Checksum(Pattern(m, tokens, b.index)));
      }
      if (lookup->lease_id != 0) {
        leases.push_back({mi, Prefix(ids, lookup->matched_tokens / kBt), tokens, lookup->lease_id,
                          lookup->lease_expires});
      }
    } else if (kind < 75) {  // fetch and verify
      auto plan = cache_->PrepareFetch(m.key, {.tokens = tokens});
      ASSERT_TRUE(plan.ok());
      expect_at_most(plan->matched_tokens, r.Match(ids, now) * kBt);
      EXPECT_TRUE(PlanHolds(*plan, m, tokens));
    } else if (kind < 83 && !leases.empty()) {  // fetch or release a lease
      RefLease& l = leases[rng() % leases.size()];
      const bool live = !l.released && now < l.expires;
      if (rng() % 2 == 0) {
        EXPECT_EQ(cache_->ReleaseLease(l.id), live);
        l.released = true;
        continue;
      }
      auto plan = cache_->PrepareFetch(models[l.model].key, {.lease_id = l.id});
      EXPECT_EQ(plan.ok(), live) << plan.status();
      if (!plan.ok()) continue;
      EXPECT_EQ(plan->matched_tokens, l.ids.size() * kBt);
      EXPECT_TRUE(PlanHolds(*plan, models[l.model], l.tokens));  // even if evicted since
    } else if (kind < 92) {  // explicit eviction of a prefix, rarely of the model
      const Ids prefix = kind == 91 ? Ids{} : random_ids(1, 3);
      auto evicted =
          prefix.empty() ? cache_->EvictModel(m.key) : cache_->EvictPrefix(m.key, Seq(prefix));
      ASSERT_TRUE(evicted.ok()) << evicted.status();
      EXPECT_EQ(evicted->evicted_bytes, evicted->evicted_blocks * m.layout.BlockBytes());
      expect_at_most(evicted->evicted_blocks, r.Erase(prefix));
      for (RefLease& l : leases) l.broken |= l.model == mi && StartsWith(l.ids, prefix);
    } else {
      clock_.Advance(absl::Seconds(1 + rng() % 5));
    }
    if (exact && r.registered) {
      ASSERT_EQ(StatsOf(m).blocks, r.blocks.size());
    } else if (!exact && op % 10 == 0) {  // capacity eviction never takes a leased block
      for (const RefLease& l : leases) {
        if (l.released || l.broken || clock_.Now() >= l.expires) continue;
        auto plan = cache_->PrepareFetch(models[l.model].key, {.tokens = l.tokens});
        ASSERT_TRUE(plan.ok());
        EXPECT_GE(plan->matched_tokens, l.ids.size() * kBt) << "lease " << l.id;
        EXPECT_TRUE(PlanHolds(*plan, models[l.model], l.tokens));
      }
    }
  }
  const CacheStats stats = cache_->GetStats();
  // The exact run never evicted for space; the other one did.
  EXPECT_EQ(stats.capacity_evictions == 0, exact) << stats.capacity_evictions;
  EXPECT_LE(stats.host_pool.reserved_bytes, stats.host_pool.capacity_bytes);
}

TEST_F(RandomizedCacheTest, AgreesExactlyWhenNothingIsEvictedForSpace) { Run(true, 1, 4000); }
TEST_F(RandomizedCacheTest, StaysWithinReferenceUnderCapacityEviction) { Run(false, 2, 4000); }

// ---- Concurrency ------------------------------------------------------------------------

TEST_F(CacheTest, ConcurrentClientsOnlyEverSeeCorrectBytes) {
  MakeCache(2);  // 64 blocks of 2 KiB: far fewer than the sequences below need
  const TestModel m = Mid();
  Register(m);
  std::atomic<uint64_t> stored{0}, fetched{0}, failures{0};
  auto fail = [&](const std::string& what) {
    if (failures++ < 10) ADD_FAILURE() << what;
  };
  auto worker = [&](uint64_t seed) {
    std::mt19937_64 rng(seed);
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(2);
    while (std::chrono::steady_clock::now() < deadline) {
      Ids ids(1 + rng() % 8);
      for (auto& id : ids) id = 1 + rng() % 4;
      const std::vector<Token> tokens = Seq(ids, rng() % kBt);
      const int kind = rng() % 100;
      if (kind < 40) {  // append; the prefix may vanish between Lookup and Commit
        auto lookup = cache_->Lookup(m.key, tokens);
        if (!lookup.ok()) return fail(lookup.status().ToString());
        const uint64_t start = rng() % (lookup->matched_tokens / kBt + 1) * kBt;
        auto r = Append(*cache_, m, tokens, start, {}, rng() % 2 == 0);
        if (r.ok()) {
          stored += r->stored_blocks;
          // Blocks another append was storing at the same time are pending, not stored twice.
          if (r->cached_tokens + r->pending_blocks * kBt != ids.size() * kBt) {
            fail("append cached_tokens");
          }
          if (r->conflicting_blocks != 0) fail("conflict between appends of the same bytes");
        } else if (!absl::IsResourceExhausted(r.status()) && !absl::IsAborted(r.status()) &&
                   !absl::IsFailedPrecondition(r.status())) {
          fail(r.status().ToString());
        }
      } else if (kind < 60) {  // lease, fetch by lease, release
        auto lookup = cache_->Lookup(m.key, tokens, {.acquire = true});
        if (!lookup.ok()) return fail(lookup.status().ToString());
        if (lookup->lease_id == 0) continue;
        auto plan = cache_->PrepareFetch(m.key, {.lease_id = lookup->lease_id});
        if (!plan.ok() || plan->matched_tokens != lookup->matched_tokens) fail("lease fetch");
        if (plan.ok() && !PlanHolds(*plan, m, tokens)) fail("lease bytes");
        if (!cache_->ReleaseLease(lookup->lease_id)) fail("release");
      } else if (kind < 95) {
        auto plan = cache_->PrepareFetch(m.key, {.tokens = tokens});
        if (!plan.ok()) return fail(plan.status().ToString());
        if (auto held = PlanHolds(*plan, m, tokens); !held) fail(held.message());
        fetched += plan->blocks.size();
      } else {
        auto evicted = kind == 99
                           ? cache_->EvictModel(m.key)
                           : cache_->EvictPrefix(m.key, Seq(Prefix(ids, 1 + rng() % ids.size())));
        if (!evicted.ok()) fail(evicted.status().ToString());
      }
    }
  };
  std::vector<std::thread> threads;
  for (uint64_t t = 0; t < 8; ++t) threads.emplace_back(worker, 1000 + t);
  for (auto& t : threads) t.join();

  EXPECT_EQ(failures.load(), 0u);
  EXPECT_GT(stored.load(), 0u);
  EXPECT_GT(fetched.load(), 0u);
  const CacheStats stats = cache_->GetStats();
  EXPECT_GT(stats.capacity_evictions, 0u);
  EXPECT_EQ(stats.active_leases, 0u);
  // Nothing leaked: what the pool holds is exactly what the index holds.
  EXPECT_EQ(stats.payload_bytes, stats.blocks * m.layout.BlockBytes());
  EXPECT_EQ(stats.host_pool.allocated_bytes, stats.payload_bytes);
  EXPECT_EQ(stats.host_pool.live_allocations, stats.blocks);
  EXPECT_LE(stats.host_pool.reserved_bytes, stats.host_pool.capacity_bytes);
}

// Hits from many threads share the lock; each thread records far more
// touches than its stripe holds, so readers apply their own stripes (in
// turn, under the shared lock) while the others match and pin. Every hit is
// counted exactly once in its blocks' uses; under TSan (the core suites'
// pass) this is also the race check of that path.
TEST_F(CacheTest, ConcurrentHitsCountEveryUseOnce) {
  const TestModel m = Small();
  Register(m);
  constexpr int kThreads = 4;
  constexpr int kHits = 3000;  // x 2 calls x 8 blocks: 48,000 touches a thread
  std::vector<std::vector<Token>> seqs;
  for (uint32_t t = 0; t < kThreads; ++t) {
    Ids ids;
    for (uint32_t b = 0; b < 8; ++b) ids.push_back(100 * (t + 1) + b);
    seqs.push_back(Seq(ids));
    ASSERT_TRUE(Append(*cache_, m, seqs.back()).ok());
  }
  auto uses = [&](const std::vector<Token>& seq) -> uint64_t {
    for (const PrefixSummary& p : CacheInspector(cache_.get()).TopPrefixes(10)) {
      if (p.key == PrefixKey(seq, 0)) return p.references;
    }
    return 0;
  };
  std::vector<uint64_t> before;
  for (const auto& seq : seqs) before.push_back(uses(seq));
  std::atomic<int> failures{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < kHits; ++i) {
        auto found = cache_->Lookup(m.key, seqs[t]);
        auto plan = cache_->PrepareFetch(m.key, {.tokens = seqs[t]});
        if (!found.ok() || found->matched_tokens != seqs[t].size() || !plan.ok() ||
            !PlanHolds(*plan, m, seqs[t])) {
          ++failures;
        }
      }
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(failures.load(), 0);
  for (int t = 0; t < kThreads; ++t) EXPECT_EQ(uses(seqs[t]), before[t] + 2 * kHits);
}

// Appends from many threads of the same prompts: most begin and commit
// with the lock shared (every block cached or claimed by another append),
// the rest store. Each block is stored exactly once, every deduplicated
// block is counted once in the model's totals, and every answer accounts
// for all its blocks; under TSan (the core suites' pass) this is also the
// race check of the shared append path.
TEST_F(CacheTest, ConcurrentAppendsStoreEachBlockOnceAndCountEveryBlock) {
  MakeCache(64);
  const TestModel m = Small();
  Register(m);
  constexpr int kThreads = 4;
  constexpr int kAppends = 400;
  constexpr uint32_t kPrompts = 16, kBlocks = 6;
  std::vector<std::vector<Token>> prompts;
  for (uint32_t p = 0; p < kPrompts; ++p) {
    Ids ids;
    for (uint32_t b = 0; b < kBlocks; ++b) ids.push_back(1000 + 10 * p + b);
    prompts.push_back(Seq(ids));
  }
  std::atomic<uint64_t> stored{0}, deduplicated{0}, pending{0};
  std::atomic<int> failures{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < kAppends; ++i) {
        const std::vector<Token>& seq = prompts[(7 * t + i) % kPrompts];
        auto r = Append(*cache_, m, seq);
        if (!r.ok() || r->conflicting_blocks != 0 ||
            r->cached_tokens + r->pending_blocks * kBt != seq.size() ||
            r->stored_blocks + r->deduplicated_blocks + r->pending_blocks != kBlocks) {
          ++failures;
          continue;
        }
        stored += r->stored_blocks;
        deduplicated += r->deduplicated_blocks;
        pending += r->pending_blocks;
      }
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(failures.load(), 0);
  EXPECT_EQ(stored.load(), kPrompts * kBlocks);
  EXPECT_EQ(stored + deduplicated + pending, uint64_t{kThreads} * kAppends * kBlocks);
  const CacheStats stats = cache_->GetStats();
  ASSERT_EQ(stats.models.size(), 1u);
  EXPECT_EQ(stats.models[0].appended_blocks, kPrompts * kBlocks);
  EXPECT_EQ(stats.models[0].deduplicated_blocks, deduplicated.load());
  EXPECT_EQ(stats.conflicting_appends, 0u);
  for (const auto& seq : prompts) {
    auto plan = cache_->PrepareFetch(m.key, {.tokens = seq});
    ASSERT_TRUE(plan.ok());
    EXPECT_TRUE(PlanHolds(*plan, m, seq));
    EXPECT_EQ(plan->matched_tokens, seq.size());
  }
}

// Appends of new turns from one thread per model, in a cache so small that
// commits evict all along: they store with the cache's lock shared and
// their models' locks exclusive, evict in batches, and (with append
// staging) enforce the budget only when a commit passes it. Each thread
// also fetches another model's prompt and checks its bytes. Every stored
// block is counted once in its model's totals, and the pool holds exactly
// what the indexes hold; under TSan (the core suites' pass) this is also
// the race check of the shared storing commit and of the models' policies
// (LRU and LRU-K, whose siblings share order numbers and retained
// histories: evicted blocks come back as turns repeat their prefixes).
TEST_F(CacheTest, AppendsOfManyModelsStoreSideBySideAndCountEveryByte) {
  for (const bool lru_k : {false, true})
    for (const uint64_t staging : {uint64_t{0}, kSlab}) {
      SCOPED_TRACE(absl::StrCat(lru_k ? "lru_k" : "lru", ", staging ", staging));
      MakeCache(4, {.append_staging_bytes = staging},  // 512 blocks of 512 B
                lru_k ? NewLruKPolicy({}, &clock_) : NewLruPolicy());
      constexpr int kModels = 4;
      constexpr uint32_t kTurns = 400;
      std::vector<TestModel> models;
      for (int i = 0; i < kModels; ++i) {
        models.push_back(
            {{"default", absl::StrCat("model-", i)}, Layout(8, DType::kFp16), uint64_t{100} + i});
        Register(models.back());
      }
      auto turn = [](int model, uint32_t i) {
        const uint32_t base = 10'000 * (model + 1);
        return Seq({base, base + 1, base + 2, base + 3 + i});
      };
      std::atomic<uint64_t> stored{0};
      std::atomic<int> failures{0};
      std::vector<std::thread> threads;
      for (int t = 0; t < kModels; ++t) {
        threads.emplace_back([&, t] {
          for (uint32_t i = 0; i < kTurns; ++i) {
            const std::vector<Token> mine = turn(t, i);
            auto r = Append(*cache_, models[t], mine);
            if (r.ok()) {
              stored += r->stored_blocks;
              if (r->cached_tokens != mine.size() || r->pending_blocks != 0) ++failures;
            } else if (!absl::IsAborted(r.status())) {  // the prefix evicted mid-stream
              ++failures;
            }
            const int other = (t + 1) % kModels;
            const std::vector<Token> seq = turn(other, i);
            auto plan = cache_->PrepareFetch(models[other].key, {.tokens = seq});
            if (!plan.ok() || !PlanHolds(*plan, models[other], seq)) ++failures;
          }
        });
      }
      for (auto& t : threads) t.join();
      EXPECT_EQ(failures.load(), 0);
      const CacheStats stats = cache_->GetStats();
      uint64_t appended = 0;
      for (const ModelStats& m : stats.models) appended += m.appended_blocks;
      EXPECT_EQ(appended, stored.load());
      EXPECT_GT(stats.capacity_evictions, 0u);
      EXPECT_EQ(stats.payload_bytes, stats.blocks * models[0].layout.BlockBytes());
      EXPECT_EQ(stats.host_pool.allocated_bytes, stats.payload_bytes);
      EXPECT_EQ(stats.host_pool.live_allocations, stats.blocks);
      // The staging stays free (within the last commit's batch) when it is set.
      if (staging != 0) {
        EXPECT_LE(stats.host_pool.allocated_bytes, stats.host_pool.capacity_bytes - staging);
      }
    }
}

}  // namespace
}  // namespace cache_test
}  // namespace kvcache
