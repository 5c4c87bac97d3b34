// The SSD tier through the real daemon: a host tier far smaller than what is
// appended, a real file for the SSD, every byte fetched back verified, and a
// file corrupted on disk that is detected and never served.
#include <fcntl.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <array>
#include <cstdio>
#include <thread>

#include "absl/strings/str_cat.h"
#include "tests/integration/daemon_process.h"
#include "tests/integration/kv_pattern.h"

namespace kvcache::testing {
namespace {

constexpr uint32_t kBlockTokens = 16;

constexpr uint32_t kBlocksPerSequence = 8;

class TierDaemonTest : public ::testing::Test {
 protected:
  // A host tier of 8 MiB (1 MiB slabs) over an SSD tier of 64 MiB.
  void SetUp() override {
    migration_log_ = ::testing::TempDir() + "/ssd_tier_test_migration.log";
    std::remove(migration_log_.c_str());
    const std::string config = ::testing::TempDir() + "/ssd_tier_test.json";
    std::FILE* f = std::fopen(config.c_str(), "w");
    ASSERT_NE(f, nullptr);
    // Watermarks that leave a fifth of the host free after a migration (the
    // defaults keep 0.96 of it full), so that fetches have room to promote.
    std::fprintf(f,
                 R"({"logging": {"migration_log": "%s"},
                     "host_tier": {"high_watermark": 0.9, "low_watermark": 0.8}})",
                 migration_log_.c_str());
    std::fclose(f);
    auto d = DaemonProcess::Start({.capacity_bytes = 8 << 20,
                                   .slab_bytes = 1 << 20,
                                   .metrics = true,
                                   .ssd_bytes = 64 << 20,
                                   .extra_flags = {"--log-level", "debug", "--config", config}});
    ASSERT_TRUE(d.ok()) << d.status();
    daemon_ = *std::move(d);
    client_ = daemon_->NewClient();
    // 64 KiB blocks: 2 layers x 8 heads x 64 dims x fp16 x 2 (K and V) x 16 tokens.
    auto r = client_->RegisterModel("m", MakeLayout(2, 8, 64, v1::DTYPE_FP16, kBlockTokens));
    ASSERT_TRUE(r.ok()) << r.status();
    block_bytes_ = r->block_bytes();
    ASSERT_EQ(block_bytes_, 64u << 10);
  }
  void TearDown() override {
    client_.reset();
    if (daemon_ != nullptr) {
      EXPECT_EQ(daemon_->Stop(), 0) << "log " << daemon_->log_path();
    }
  }

  std::vector<uint32_t> Sequence(int s) const {
    return MakeTokens(1000 + s, kBlocksPerSequence * kBlockTokens);
  }
  void AppendAll(int sequences) {
    for (int s = 0; s < sequences; ++s) {
      const std::vector<uint32_t> tokens = Sequence(s);
      auto r = client_->Append("m", tokens,
                               MakeKv(tokens, kBlockTokens, block_bytes_, 0, kBlocksPerSequence));
      ASSERT_TRUE(r.ok()) << "sequence " << s << ": " << r.status();
    }
  }
  // Fetches sequence `s`; EXPECTs every fetched byte to be the appended one
  // and returns the matched tokens.
  uint64_t FetchVerified(int s) {
    return testing::FetchVerified(*client_, "m", Sequence(s), kBlockTokens, block_bytes_,
                                  kBlocksPerSequence, absl::StrCat("sequence ", s)) *
           kBlockTokens;
  }
  // A promotion needs room in the pool: waits (bounded) for the migrator to
  // bring the host below its high watermark after appends filled it.
  void WaitForRoomInHostMemory() {
    for (int i = 0; i < 500; ++i) {
      auto stats = client_->GetStats();
      ASSERT_TRUE(stats.ok());
      const v1::TierStats* host = FindTier(*stats, "host");
      if (host->payload_bytes() <= host->capacity_bytes() * 9 / 10) return;
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    FAIL() << "the host tier stayed above its high watermark for 5 s";
  }

  std::unique_ptr<DaemonProcess> daemon_;
  std::unique_ptr<Client> client_;
  uint64_t block_bytes_ = 0;
  std::string migration_log_;
};

TEST_F(TierDaemonTest, HoldsFarMoreThanHostMemoryAndServesItExactly) {
  constexpr int kSequences = 40;  // 320 blocks, 20 MiB: 2.5x the host tier
  AppendAll(kSequences);
  auto stats = client_->GetStats();
  ASSERT_TRUE(stats.ok()) << stats.status();
  const v1::TierStats* ssd = FindTier(*stats, "ssd");
  ASSERT_NE(ssd, nullptr) << "no ssd tier in GetStats";
  EXPECT_GT(ssd->demotions(), 0u);
  EXPECT_EQ(stats->capacity_evictions(), 0u);
  // The first sequences live on SSD only now.
  auto first = client_->Lookup("m", Sequence(0));
  ASSERT_TRUE(first.ok());
  EXPECT_EQ(first->matched_tokens, kBlocksPerSequence * kBlockTokens);
  EXPECT_EQ(first->blocks.front().tier(), "ssd");
  for (int s = 0; s < kSequences; ++s) {
    EXPECT_EQ(FetchVerified(s), kBlocksPerSequence * kBlockTokens) << "sequence " << s;
  }
  stats = client_->GetStats();
  ASSERT_TRUE(stats.ok());
  ssd = FindTier(*stats, "ssd");
  EXPECT_GT(ssd->reads(), 0u);
  EXPECT_EQ(ssd->checksum_failures(), 0u);
}

TEST_F(TierDaemonTest, OperatorsSeeTheTiersAndTheMovesBetweenThem) {
  AppendAll(24);
  WaitForRoomInHostMemory();
  ASSERT_EQ(FetchVerified(0), kBlocksPerSequence * kBlockTokens);  // a read-back, promoted
  auto [code, tiers] =
      RunShell(absl::StrCat(KVCACHECTL_BINARY, " --target ", daemon_->unix_target(), " tiers"));
  ASSERT_EQ(code, 0) << tiers;
  EXPECT_THAT(tiers, ::testing::HasSubstr("host"));
  EXPECT_THAT(tiers, ::testing::HasSubstr("ssd"));
  EXPECT_THAT(tiers, ::testing::HasSubstr("DEMOTED"));
  const std::string url = absl::StrCat("http://127.0.0.1:", daemon_->metrics_port(), "/metrics");
  auto [scraped, text] = RunShell("curl -sf " + url);
  ASSERT_EQ(scraped, 0) << text;
  EXPECT_THAT(text, ::testing::HasSubstr("kvcached_tier_capacity_bytes{tier=\"ssd\"} 67108864"));
  EXPECT_THAT(text,
              ::testing::ContainsRegex("kvcached_tier_migrations_total\\{from=\"host\",to=\"ssd\","
                                       "reason=\"demote\"\\} [1-9]"));
  EXPECT_THAT(text, ::testing::ContainsRegex("kvcached_tier_reads_total\\{tier=\"ssd\"\\} [1-9]"));
  auto [lint, lint_output] = RunShell("curl -sf " + url + " | promtool check metrics");
  EXPECT_EQ(lint, 0) << lint_output;
  // The migration log has a line per move (written by the migrator thread).
  std::string log;
  for (int i = 0; i < 200 && log.find("reason=fetch") == std::string::npos; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
    log = RunShell("cat " + migration_log_).second;
  }
  EXPECT_THAT(log, ::testing::ContainsRegex("key=[0-9a-f]{16} from=host to=ssd reason=(append|"
                                            "pressure) bytes=65536 us=[0-9]+"));
  EXPECT_THAT(log, ::testing::ContainsRegex("from=ssd to=host reason=fetch bytes=65536"));
}

TEST_F(TierDaemonTest, PrefetchWaitAnswersWithTheBlocksInHostMemory) {
  AppendAll(24);
  const std::vector<uint32_t> tokens = Sequence(0);
  auto before = client_->Lookup("m", tokens);
  ASSERT_TRUE(before.ok());
  ASSERT_EQ(before->blocks.front().tier(), "ssd");
  WaitForRoomInHostMemory();
  LookupOptions options;
  options.prefetch = v1::PREFETCH_WAIT;
  auto after = client_->Lookup("m", tokens, options);
  ASSERT_TRUE(after.ok()) << after.status();
  EXPECT_EQ(after->matched_tokens, kBlocksPerSequence * kBlockTokens);
  for (const v1::BlockDescriptor& b : after->blocks) {
    EXPECT_EQ(b.tier(), "");
  }
  auto stats = client_->GetStats();
  ASSERT_TRUE(stats.ok());
  const v1::TierStats* ssd = FindTier(*stats, "ssd");
  ASSERT_NE(ssd, nullptr);
  EXPECT_EQ(ssd->prefetches_completed(), 1u);
  EXPECT_EQ(ssd->promotions(), kBlocksPerSequence);
  EXPECT_EQ(FetchVerified(0), kBlocksPerSequence * kBlockTokens);
}

TEST_F(TierDaemonTest, BytesCorruptedOnDiskAreDetectedAndNeverServed) {
  constexpr int kSequences = 24;
  AppendAll(kSequences);
  auto first = client_->Lookup("m", Sequence(0));
  ASSERT_TRUE(first.ok());
  ASSERT_EQ(first->blocks.front().tier(), "ssd");
  // Every header and every payload on the tier's file is damaged now.
  ASSERT_TRUE(daemon_->CorruptSsdFile()) << daemon_->ssd_path();
  // Blocks on SSD are dropped when read; whatever is served is exact.
  uint64_t short_fetches = 0;
  for (int s = 0; s < kSequences; ++s) {
    if (FetchVerified(s) < kBlocksPerSequence * kBlockTokens) ++short_fetches;
  }
  EXPECT_GT(short_fetches, 0u);
  auto stats = client_->GetStats();
  ASSERT_TRUE(stats.ok());
  const v1::TierStats* ssd = FindTier(*stats, "ssd");
  ASSERT_NE(ssd, nullptr);
  EXPECT_GT(ssd->checksum_failures(), 0u);
  auto again = client_->Lookup("m", Sequence(0));
  ASSERT_TRUE(again.ok());
  EXPECT_LT(again->matched_tokens, kBlocksPerSequence * kBlockTokens);
}

TEST_F(TierDaemonTest, ManyWorkersOverTinyTiersOnlyEverSeeExactBytes) {
  // 16 workers append and fetch 40 sequences at random for 20 seconds:
  // constant demotion, promotion and SSD eviction underneath.
  std::atomic<uint64_t> fetched{0}, failures{0};
  std::vector<std::thread> workers;
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(20);
  for (int w = 0; w < 16; ++w) {
    workers.emplace_back([&, w] {
      auto client = daemon_->NewClient();
      uint64_t rng = 0x9E3779B97F4A7C15ull * (w + 1);
      while (std::chrono::steady_clock::now() < until) {
        rng ^= rng << 13, rng ^= rng >> 7, rng ^= rng << 17;
        const int s = static_cast<int>(rng % 40);
        const std::vector<uint32_t> tokens = Sequence(s);
        const std::vector<std::byte> kv =
            MakeKv(tokens, kBlockTokens, block_bytes_, 0, kBlocksPerSequence);
        if (rng % 3 == 0) {
          auto r = client->Append("m", tokens, kv);
          if (!r.ok() && r.status().code() != absl::StatusCode::kResourceExhausted &&
              r.status().code() != absl::StatusCode::kAborted) {
            ++failures;
          }
          continue;
        }
        std::vector<std::byte> out(kv.size());
        auto f = client->Fetch("m", tokens, out);
        if (!f.ok()) {
          ++failures;
          continue;
        }
        const size_t n = f->matched_tokens / kBlockTokens * block_bytes_;
        if (!std::equal(out.begin(), out.begin() + n, kv.begin())) ++failures;
        fetched += f->matched_tokens / kBlockTokens;
      }
    });
  }
  for (std::thread& t : workers) t.join();
  EXPECT_EQ(failures.load(), 0u);
  EXPECT_GT(fetched.load(), 0u);
  auto stats = client_->GetStats();
  ASSERT_TRUE(stats.ok());
  const v1::TierStats* ssd = FindTier(*stats, "ssd");
  ASSERT_NE(ssd, nullptr);
  EXPECT_GT(ssd->demotions(), 0u);
  EXPECT_EQ(ssd->checksum_failures(), 0u);
}

}  // namespace
}  // namespace kvcache::testing
