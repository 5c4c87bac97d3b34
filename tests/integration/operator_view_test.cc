// The operator's view against the real daemon (docs/operations.md):
// kvcachectl verify, dump and attention, and the Admin calls behind them
// (VerifyBlocks, DumpMemory, InspectSequence, GetStats' per-method counts).
#include <fcntl.h>
#include <gmock/gmock.h>
#include <google/protobuf/util/json_util.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <fstream>
#include <random>
#include <sstream>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "tests/integration/daemon_process.h"
#include "tests/integration/kv_pattern.h"

namespace kvcache::testing {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

constexpr uint32_t kBlockTokens = 16;
constexpr int kBlocksPerSequence = 8;

std::string ReadFile(const std::string& path) {
  std::ifstream in(path);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

int Count(const std::string& text, const std::string& what) {
  int n = 0;
  for (size_t at = text.find(what); at != std::string::npos; at = text.find(what, at + 1)) ++n;
  return n;
}

// A host tier of 8 MiB over an SSD tier of 64 MiB, 64 KiB blocks: 24
// sequences of 8 blocks (12 MiB) put the first ones on SSD.
class VerifyAndDumpTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto d = DaemonProcess::Start(
        {.capacity_bytes = 8 << 20, .slab_bytes = 1 << 20, .ssd_bytes = 64 << 20});
    ASSERT_TRUE(d.ok()) << d.status();
    daemon_ = *std::move(d);
    client_ = daemon_->NewClient();
    auto r = client_->RegisterModel("m", MakeLayout(2, 8, 64, v1::DTYPE_FP16, kBlockTokens));
    ASSERT_TRUE(r.ok()) << r.status();
    block_bytes_ = r->block_bytes();
    for (int s = 0; s < kSequences; ++s) {
      const std::vector<uint32_t> tokens = Sequence(s);
      ASSERT_TRUE(client_
                      ->Append("m", tokens,
                               MakeKv(tokens, kBlockTokens, block_bytes_, 0, kBlocksPerSequence))
                      .ok());
    }
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
  CommandResult Ctl(const std::string& args) {
    return RunCommand(
        absl::StrCat(KVCACHECTL_BINARY, " --target ", daemon_->unix_target(), " ", args));
  }
  static constexpr int kSequences = 24;
  std::unique_ptr<DaemonProcess> daemon_;
  std::unique_ptr<Client> client_;
  uint64_t block_bytes_ = 0;
};

TEST_F(VerifyAndDumpTest, VerifyFindsBytesCorruptedOnDiskAndDropsThem) {
  auto first = client_->Lookup("m", Sequence(0));
  ASSERT_TRUE(first.ok());
  ASSERT_EQ(first->blocks.front().tier(), "ssd");

  CommandResult clean = Ctl("verify --ssd");
  EXPECT_EQ(clean.exit_code, 0) << clean.output;
  EXPECT_THAT(clean.output, HasSubstr("no bad blocks"));

  ASSERT_TRUE(daemon_->CorruptSsdFile()) << daemon_->ssd_path();
  CommandResult host_only = Ctl("verify");  // host copies are intact
  EXPECT_EQ(host_only.exit_code, 0) << host_only.output;

  CommandResult found = Ctl("verify --ssd");
  EXPECT_EQ(found.exit_code, 4) << found.output;
  EXPECT_THAT(found.output, HasSubstr("ssd"));
  EXPECT_THAT(found.output, HasSubstr("run again with --drop"));
  // Only reported: the SSD blocks are still indexed.
  EXPECT_EQ(client_->Lookup("m", Sequence(0))->matched_tokens,
            uint64_t{kBlocksPerSequence} * kBlockTokens);

  CommandResult dropped = Ctl("--json verify --ssd --drop");
  EXPECT_EQ(dropped.exit_code, 4) << dropped.output;
  v1::VerifyBlocksProgress parsed;
  ASSERT_TRUE(google::protobuf::util::JsonStringToMessage(dropped.output, &parsed).ok())
      << dropped.output;
  EXPECT_TRUE(parsed.done());
  ASSERT_GT(parsed.bad_blocks_size(), 0);
  for (const v1::BadBlock& b : parsed.bad_blocks()) {
    EXPECT_EQ(b.model_id(), "m");
    EXPECT_EQ(b.tier(), "ssd");
    EXPECT_TRUE(b.dropped()) << b.problem();
  }
  EXPECT_GE(parsed.dropped_blocks(), static_cast<uint64_t>(parsed.bad_blocks_size()));

  CommandResult after = Ctl("verify --ssd");
  EXPECT_EQ(after.exit_code, 0) << after.output;
  // Whatever is still cached is served exactly.
  for (int s = 0; s < kSequences; ++s) {
    FetchVerified(*client_, "m", Sequence(s), kBlockTokens, block_bytes_, kBlocksPerSequence,
                  absl::StrCat("sequence ", s));
  }
  auto stats = client_->GetStats();
  ASSERT_TRUE(stats.ok());
  EXPECT_GT(stats->models(0).corrupt_blocks(), 0u);
}

TEST_F(VerifyAndDumpTest, VerificationsStreamProgressAreBoundedAndStopWithTheirCaller) {
  // 1 MiB/s over 8 MiB of host copies: long enough to overlap.
  v1::VerifyBlocksRequest slow;
  slow.set_max_bytes_per_second(1 << 20);
  absl::Notification started[2];
  absl::Notification stop;
  std::vector<std::thread> running;
  absl::Status ended[2];
  for (int i = 0; i < 2; ++i) {
    running.emplace_back([&, i] {
      std::unique_ptr<Client> c = daemon_->NewClient();
      auto r = c->VerifyBlocks(slow, [&](const v1::VerifyBlocksProgress& p) {
        EXPECT_FALSE(p.done());
        EXPECT_GT(p.blocks_total(), 0u);
        if (!started[i].HasBeenNotified()) started[i].Notify();
        return !stop.HasBeenNotified();
      });
      ended[i] = r.status();
    });
  }
  for (auto& s : started) {
    ASSERT_TRUE(s.WaitForNotificationWithTimeout(absl::Seconds(10)));
  }
  auto third = client_->VerifyBlocks(slow);
  EXPECT_EQ(third.status().code(), absl::StatusCode::kResourceExhausted) << third.status();
  // Serving goes on meanwhile.
  EXPECT_EQ(client_->Lookup("m", Sequence(kSequences - 1))->matched_tokens,
            uint64_t{kBlocksPerSequence} * kBlockTokens);
  const absl::Time stopping = absl::Now();
  stop.Notify();
  for (std::thread& t : running) t.join();
  EXPECT_LT(absl::Now() - stopping, absl::Seconds(5));
  for (const absl::Status& s : ended) EXPECT_EQ(s.code(), absl::StatusCode::kCancelled) << s;
  // The slots are free again once the walks noticed.
  absl::StatusOr<v1::VerifyBlocksProgress> again;
  for (int i = 0; i < 50; ++i) {
    v1::VerifyBlocksRequest one;
    one.set_model_id("m");
    one.add_prefix_tokens(0);  // a prefix with nothing cached: nothing to read
    again = client_->VerifyBlocks(one);
    if (again.ok()) break;
    absl::SleepFor(absl::Milliseconds(100));
  }
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_TRUE(again->done());
  EXPECT_EQ(again->blocks_total(), 0u);
  // Bad requests change nothing and say why.
  v1::VerifyBlocksRequest bad;
  bad.add_prefix_tokens(1);
  EXPECT_EQ(client_->VerifyBlocks(bad).status().code(), absl::StatusCode::kInvalidArgument);
  bad.set_model_id("no-such-model");
  EXPECT_EQ(client_->VerifyBlocks(bad).status().code(), absl::StatusCode::kNotFound);
}

TEST_F(VerifyAndDumpTest, DumpWritesASnapshotAndSummarisesIt) {
  auto leased = client_->Lookup("m", Sequence(kSequences - 1), {.acquire_lease = true});
  ASSERT_TRUE(leased.ok()) << leased.status();
  ASSERT_NE(leased->lease_id, 0u);
  const std::string path = absl::StrCat(daemon_->dir(), "/dump.json");
  CommandResult dump = Ctl(absl::StrCat("dump --out ", path));
  ASSERT_EQ(dump.exit_code, 0) << dump.output;
  for (const char* expected : {"TIER", "host", "ssd", "CHUNK", "OCCUPANCY", "MODEL", "LEASE",
                               "EXPIRES IN", "calls in flight", "daemon RSS", "fragmentation"}) {
    EXPECT_THAT(dump.output, HasSubstr(expected));
  }
  v1::DumpMemoryResponse parsed;
  ASSERT_TRUE(google::protobuf::util::JsonStringToMessage(ReadFile(path), &parsed).ok());
  ASSERT_EQ(parsed.models_size(), 1);
  const v1::ModelMemory& m = parsed.models(0);
  EXPECT_EQ(m.model_id(), "m");
  EXPECT_GT(m.host_blocks(), 0u);
  EXPECT_GT(m.lower_blocks(), 0u);
  EXPECT_EQ(m.raw_blocks(), parsed.stats().models(0).blocks());
  EXPECT_EQ(m.leased_blocks(), static_cast<uint64_t>(kBlocksPerSequence));
  EXPECT_EQ(parsed.leases_total(), 1u);
  ASSERT_EQ(parsed.leases_size(), 1);
  EXPECT_EQ(parsed.leases(0).lease_id(), leased->lease_id);
  EXPECT_GT(parsed.leases(0).expires_in_ms(), 0u);
  EXPECT_GT(parsed.process_rss_bytes(), 8u << 20);  // at least the host tier it touched
  EXPECT_GT(parsed.pool_allocated_bytes(), 0u);
  EXPECT_GE(parsed.pool_fragmentation(), 0.0);
  EXPECT_LT(parsed.pool_fragmentation(), 1.0);

  CommandResult json = Ctl("--json dump");
  ASSERT_EQ(json.exit_code, 0) << json.output;
  EXPECT_TRUE(google::protobuf::util::JsonStringToMessage(json.output, &parsed).ok());
  CommandResult unwritable = Ctl("dump --out /nonexistent-dir/dump.json");
  EXPECT_EQ(unwritable.exit_code, 1) << unwritable.output;
}

TEST_F(VerifyAndDumpTest, GetStatsCountsCallsPerMethod) {
  for (int i = 0; i < 5; ++i) ASSERT_TRUE(client_->Lookup("m", Sequence(i)).ok());
  auto stats = client_->GetStats();
  ASSERT_TRUE(stats.ok());
  bool lookup = false;
  bool append = false;
  for (const v1::RpcCounters& c : stats->rpcs()) {
    if (c.method() == "Lookup" || c.method() == "ShmLookup") {
      lookup = lookup || c.calls() >= 5;
    }
    if (c.method() == "Append" || c.method() == "ShmAppendFrom") {
      append = c.calls() >= static_cast<uint64_t>(kSequences) && c.payload_bytes() > 0;
    }
  }
  EXPECT_TRUE(lookup) << stats->DebugString();
  EXPECT_TRUE(append) << stats->DebugString();
}

// A model whose blocks compress (finite Gaussian floats) in budget mode,
// compacted a second after they go cold.
class AttentionTest : public ::testing::Test {
 protected:
  static constexpr uint32_t kBlocks = 4;
  void SetUp() override {
    config_path_ = absl::StrCat(::testing::TempDir(), "/operator_view_", ::getpid(), ".json");
    std::ofstream(config_path_) << R"({"importance": {"cold_after_seconds": 1,
        "compaction_interval_ms": 100, "sink_tokens": 4, "recent_window": 16,
        "default_mode": "budget", "target_bytes": 0.3}})";
    auto d = DaemonProcess::Start({.extra_flags = {"--config", config_path_}});
    ASSERT_TRUE(d.ok()) << d.status();
    daemon_ = *std::move(d);
    client_ = daemon_->NewClient();
    auto r = client_->RegisterModel("q", MakeLayout(2, 2, 32, v1::DTYPE_FP32, kBlockTokens));
    ASSERT_TRUE(r.ok()) << r.status();
    tokens_ = MakeTokens(9, kBlocks * kBlockTokens);
    std::vector<float> kv(kBlocks * r->block_bytes() / sizeof(float));
    std::mt19937 rng(5);
    std::normal_distribution<float> normal;
    for (float& x : kv) x = normal(rng);
    ASSERT_TRUE(client_->Append("q", tokens_, std::as_bytes(std::span<const float>(kv))).ok());
    // Attention per (layer, KV head): layer 0 head 0 looks at block 1.
    auto leased = client_->Lookup("q", tokens_, {.acquire_lease = true});
    ASSERT_TRUE(leased.ok());
    std::vector<float> attention(2 * 2 * tokens_.size(), 0.0f);
    for (size_t t = kBlockTokens; t < 2 * kBlockTokens; ++t) attention[t] = 1.0f;
    ASSERT_TRUE(client_->ReportAttention("q", tokens_, attention, 2).ok());
    ASSERT_TRUE(client_->ReleaseLease(leased->lease_id).ok());
    for (absl::Time deadline = absl::Now() + absl::Seconds(15); absl::Now() < deadline;) {
      if (client_->GetStats()->models(0).compressed_blocks() >= kBlocks) break;
      absl::SleepFor(absl::Milliseconds(100));
    }
  }
  void TearDown() override {
    client_.reset();
    if (daemon_ != nullptr) {
      EXPECT_EQ(daemon_->Stop(), 0);
    }
    std::remove(config_path_.c_str());
  }
  CommandResult Ctl(const std::string& args, const std::string& stdin_text = "") {
    return RunCommand(
        absl::StrCat(KVCACHECTL_BINARY, " --target ", daemon_->unix_target(), " ", args),
        stdin_text);
  }

  std::string config_path_;
  std::unique_ptr<DaemonProcess> daemon_;
  std::unique_ptr<Client> client_;
  std::vector<uint32_t> tokens_;
};

TEST_F(AttentionTest, TheMapShowsImportanceProtectionAndPrecision) {
  ASSERT_EQ(client_->GetStats()->models(0).compressed_blocks(), kBlocks);
  v1::InspectSequenceRequest req;
  req.set_model_id("q");
  req.mutable_tokens()->Add(tokens_.begin(), tokens_.end());
  req.set_include_heads(true);
  auto r = client_->InspectSequence(req);
  ASSERT_TRUE(r.ok()) << r.status();
  ASSERT_EQ(r->matched_tokens(), tokens_.size());
  EXPECT_EQ(r->blocks(1).format_version(), 2u);
  EXPECT_TRUE(r->is_protected(0));  // an attention sink
  EXPECT_FALSE(r->is_protected(kBlockTokens));
  EXPECT_EQ(r->head_activity().size(), 2 * 2 * tokens_.size() * sizeof(float));
  EXPECT_EQ(r->head_precision().size(), 2 * 2 * tokens_.size());
  EXPECT_GT(r->activity(kBlockTokens), r->activity(2 * kBlockTokens));

  const std::string svg = absl::StrCat(daemon_->dir(), "/map.svg");
  const std::string png = absl::StrCat(daemon_->dir(), "/map.png");
  CommandResult text =
      Ctl(absl::StrCat("attention --model q --tokens-file - --svg ", svg, " --png ", png), [&] {
        std::string ids;
        for (uint32_t t : tokens_) absl::StrAppend(&ids, t, " ");
        return ids;
      }());
  ASSERT_EQ(text.exit_code, 0) << text.output;
  for (const char* expected : {"64 cached tokens in 4 blocks", "most important spans",
                               "least important spans", "v2", "protected (kept exact)"}) {
    EXPECT_THAT(text.output, HasSubstr(expected));
  }
  // The most important span is block 1's, the one layer 0 attended to.
  const size_t most = text.output.find("most important spans");
  EXPECT_THAT(text.output.substr(most, 300), HasSubstr("16-31"));
  const std::string map = ReadFile(svg);
  EXPECT_EQ(map.rfind("<svg", 0), 0u);
  EXPECT_EQ(Count(map, "class=\"token\""), static_cast<int>(tokens_.size()));
  EXPECT_EQ(Count(map, "class=\"precision\""), static_cast<int>(tokens_.size()));
  EXPECT_THAT(map, HasSubstr(">L1<"));  // one activity row per layer
  EXPECT_THAT(map, HasSubstr("protected"));
  // The PNG, read by Python's zlib: its size, and more colours than the ramp's ends.
  CommandResult read_png = RunCommand(
      absl::StrCat("/usr/bin/python3 -c \"import struct,sys,zlib; d=open(sys.argv[1],'rb').read(); "
                   "assert d[:8]==b'\\x89PNG\\r\\n\\x1a\\n'; w,h=struct.unpack('>II',d[16:24]); "
                   "i=d.index(b'IDAT'); n=struct.unpack('>I',d[i-4:i])[0]; "
                   "p=zlib.decompress(d[i+4:i+4+n]); assert len(p)==h*(3*w+1); "
                   "c={p[j:j+3] for r in range(h) for j in range(r*(3*w+1)+1,(r+1)*(3*w+1),3)}; "
                   "print(w,h,len(c))\" ",
                   png));
  ASSERT_EQ(read_png.exit_code, 0) << read_png.output;
  EXPECT_THAT(read_png.output, HasSubstr("514 "));  // 64 tokens a row, 8 px each, and a border
  EXPECT_GE(std::stoi(read_png.output.substr(read_png.output.rfind(' ') + 1)), 6)
      << read_png.output;

  // By the first block's key, as the status page links it.
  auto lookup = client_->Lookup("q", tokens_, {.accept_lossy = true});
  ASSERT_TRUE(lookup.ok());
  ASSERT_FALSE(lookup->blocks.empty());
  CommandResult by_key =
      Ctl(absl::StrCat("--json attention --model q --key ", absl::Hex(lookup->blocks[0].key())));
  ASSERT_EQ(by_key.exit_code, 0) << by_key.output;
  v1::InspectSequenceResponse parsed;
  ASSERT_TRUE(google::protobuf::util::JsonStringToMessage(by_key.output, &parsed).ok());
  EXPECT_EQ(parsed.matched_tokens(), tokens_.size());

  CommandResult missing = Ctl("attention --model q --tokens 1-64");
  EXPECT_EQ(missing.exit_code, 1) << missing.output;
  EXPECT_THAT(missing.output, HasSubstr("nothing of that sequence is cached"));
  CommandResult unknown = Ctl("attention --model nope --tokens 1-64");
  EXPECT_EQ(unknown.exit_code, 1) << unknown.output;
  EXPECT_THAT(unknown.output, HasSubstr("NOT_FOUND"));
  CommandResult usage = Ctl("attention --model q");
  EXPECT_EQ(usage.exit_code, 2) << usage.output;
  CommandResult bad_key = Ctl("attention --model q --key 0xnothex");
  EXPECT_EQ(bad_key.exit_code, 2) << bad_key.output;
  EXPECT_THAT(bad_key.output, HasSubstr("not a block key"));
}

}  // namespace
}  // namespace kvcache::testing
