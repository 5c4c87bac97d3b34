// Many workers at once against one daemon, with a capacity small enough that
// eviction runs all the time. Every fetched byte is checked against the
// pattern its token prefix defines, so a block served for the wrong prefix,
// a torn write or a read of freed memory fails the test.
#include <gtest/gtest.h>

#include <atomic>
#include <cstdlib>
#include <random>
#include <thread>

#include "tests/integration/daemon_process.h"
#include "tests/integration/kv_pattern.h"

namespace kvcache::testing {
namespace {

constexpr uint32_t kBlockTokens = 16;

int StressSeconds() {
  const char* env = std::getenv("KVCACHE_STRESS_SECONDS");
  return env != nullptr ? std::atoi(env) : 20;
}

struct WorkerCounts {
  uint64_t appends = 0, fetches = 0, verified_bytes = 0, lookups = 0, evicts = 0, leases = 0;
  uint64_t raced = 0;  // appends that lost a race with eviction (allowed)
};

TEST(ConcurrencyTest, SixteenWorkersNeverSeeWrongBytes) {
  // 64 slabs of 64 KiB = 4 MiB; blocks of 8 KiB (2 layers x 2 heads x 32 dims x fp16 x 16).
  auto daemon = DaemonProcess::Start({.capacity_bytes = 64 * 65536, .slab_bytes = 65536});
  ASSERT_TRUE(daemon.ok()) << daemon.status();
  auto admin = (*daemon)->NewClient();
  const v1::ModelLayout layout = MakeLayout(2, 2, 32, v1::DTYPE_FP16, kBlockTokens);
  auto reg = admin->RegisterModel("m", layout);
  ASSERT_TRUE(reg.ok()) << reg.status();
  const uint64_t bb = reg->block_bytes();

  // Shared "system prompts" that many requests start with.
  std::vector<std::vector<uint32_t>> prompts;
  for (int i = 0; i < 6; ++i) prompts.push_back(MakeTokens(1000 + i, (2 + i % 3) * kBlockTokens));

  constexpr int kWorkers = 16;
  std::atomic<bool> stop{false};
  std::atomic<int> failures{0};
  std::vector<WorkerCounts> counts(kWorkers);
  std::vector<std::thread> workers;
  for (int w = 0; w < kWorkers; ++w) {
    workers.emplace_back([&, w] {
      auto client = (*daemon)->NewClient();
      std::mt19937_64 rng(w);
      WorkerCounts& c = counts[w];
      auto fail = [&](const std::string& what) {
        if (failures.fetch_add(1) < 10) ADD_FAILURE() << "worker " << w << ": " << what;
      };
      while (!stop.load() && failures.load() == 0) {
        // A request: a shared prompt plus one of a few tails.
        std::vector<uint32_t> seq = prompts[rng() % prompts.size()];
        const auto tail = MakeTokens(rng() % 40, (1 + rng() % 4) * kBlockTokens);
        seq.insert(seq.end(), tail.begin(), tail.end());
        const size_t blocks = seq.size() / kBlockTokens;

        const bool leased = rng() % 4 == 0;
        auto lookup = client->Lookup("m", seq, {.acquire_lease = leased});
        ++c.lookups;
        if (!lookup.ok()) return fail("lookup: " + lookup.status().ToString());
        const uint64_t matched_blocks = lookup->matched_tokens / kBlockTokens;
        if (matched_blocks < blocks) {
          AppendOptions options{.start_token = matched_blocks * kBlockTokens};
          auto kv = MakeKv(seq, kBlockTokens, bb, matched_blocks, blocks - matched_blocks);
          auto r = client->Append("m", seq, kv, options);
          if (r.ok()) {
            ++c.appends;
          } else if (r.status().code() == absl::StatusCode::kFailedPrecondition ||
                     r.status().code() == absl::StatusCode::kAborted ||
                     r.status().code() == absl::StatusCode::kResourceExhausted) {
            ++c.raced;  // the prefix was evicted meanwhile, or all memory is in use
          } else {
            return fail("append: " + r.status().ToString());
          }
        }
        std::vector<std::byte> out(blocks * bb);
        absl::StatusOr<FetchResult> fetched = leased && lookup->lease_id != 0
                                                  ? client->FetchLease("m", lookup->lease_id, out)
                                                  : client->Fetch("m", seq, out);
        if (!fetched.ok()) return fail("fetch: " + fetched.status().ToString());
        ++c.fetches;
        if (leased && lookup->lease_id != 0 && fetched->matched_tokens != lookup->matched_tokens) {
          return fail("a lease fetched another length than it leased");
        }
        const size_t got = fetched->matched_tokens / kBlockTokens;
        const auto expect = MakeKv(seq, kBlockTokens, bb, 0, got);
        if (!std::equal(expect.begin(), expect.end(), out.begin())) {
          return fail("fetched bytes differ from the pattern of their prefix");
        }
        c.verified_bytes += expect.size();
        if (leased && lookup->lease_id != 0) {
          ++c.leases;
          (void)client->ReleaseLease(lookup->lease_id);
        }
        if (rng() % 50 == 0) {
          ++c.evicts;
          auto e =
              client->EvictPrefix("m", std::span(seq).first(kBlockTokens * (1 + rng() % blocks)));
          if (!e.ok()) return fail("evict: " + e.status().ToString());
        }
      }
    });
  }
  absl::SleepFor(absl::Seconds(StressSeconds()));
  stop = true;
  for (auto& t : workers) t.join();

  WorkerCounts total;
  for (const auto& c : counts) {
    total.appends += c.appends;
    total.fetches += c.fetches;
    total.verified_bytes += c.verified_bytes;
    total.lookups += c.lookups;
    total.evicts += c.evicts;
    total.leases += c.leases;
    total.raced += c.raced;
  }
  auto stats = admin->GetStats();
  ASSERT_TRUE(stats.ok());
  std::printf(
      "workers=%d seconds=%d lookups=%lu appends=%lu raced=%lu fetches=%lu verified=%.1f MiB "
      "leases=%lu evicts=%lu capacity_evictions=%lu\n",
      kWorkers, StressSeconds(), total.lookups, total.appends, total.raced, total.fetches,
      total.verified_bytes / 1048576.0, total.leases, total.evicts, stats->capacity_evictions());
  EXPECT_EQ(failures.load(), 0);
  EXPECT_GT(total.appends, 100u);
  EXPECT_GT(stats->capacity_evictions(), 0u) << "capacity never forced an eviction";
  EXPECT_LE(stats->tiers(0).used_bytes(), stats->tiers(0).capacity_bytes());
  EXPECT_EQ(stats->active_leases(), 0u);
  admin.reset();
  EXPECT_EQ((*daemon)->Stop(), 0);
}

}  // namespace
}  // namespace kvcache::testing
