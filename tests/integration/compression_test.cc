// Compression (importance-aware retention) end to end against the real daemon: a model
// switched to quantize at runtime gets its cold blocks compressed by the
// daemon's compaction pass; fetches return dequantized KV within the INT8
// error bound (protected tokens bit-exact) or, on request, the compressed
// format; attention reports are accepted; kvcachectl shows and switches the
// mode; the metrics endpoint exports tokens per precision.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <array>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <random>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "server/importance/block_codec.h"
#include "tests/integration/daemon_process.h"
#include "tests/integration/kv_pattern.h"

namespace kvcache::testing {
namespace {

using ::testing::HasSubstr;

constexpr uint32_t kBt = 16;
constexpr uint32_t kBlocks = 4;
constexpr char kModel[] = "imp";

class ImportanceDaemonTest : public ::testing::Test {
 protected:
  void SetUp() override {
    config_path_ = absl::StrCat(::testing::TempDir(), "/importance_", ::getpid(), ".json");
    std::ofstream(config_path_) << R"({"importance": {"cold_after_seconds": 1,
        "compaction_interval_ms": 100, "sink_tokens": 4, "recent_window": 16}})";
    auto d = DaemonProcess::Start({.metrics = true, .extra_flags = {"--config", config_path_}});
    ASSERT_TRUE(d.ok()) << d.status();
    daemon_ = *std::move(d);
    client_ = daemon_->NewClient();
    auto r = client_->RegisterModel(kModel, MakeLayout(2, 2, 32, v1::DTYPE_FP32, kBt));
    ASSERT_TRUE(r.ok()) << r.status();
    block_bytes_ = r->block_bytes();
    tokens_ = MakeTokens(7, kBlocks * kBt);
    kv_.resize(kBlocks * block_bytes_ / sizeof(float));
    std::mt19937 rng(3);
    std::normal_distribution<float> normal(0.0f, 1.0f);
    for (float& x : kv_) x = normal(rng);
    ASSERT_TRUE(client_->Append(kModel, tokens_, std::as_bytes(std::span<const float>(kv_))).ok());
  }
  void TearDown() override {
    client_.reset();
    if (daemon_ != nullptr) {
      EXPECT_EQ(daemon_->Stop(), 0);
    }
    std::remove(config_path_.c_str());
  }
  v1::ModelStats Stats() {
    auto s = client_->GetStats();
    EXPECT_TRUE(s.ok());
    return s->models(0);
  }
  // Polls until the daemon's compaction compressed `blocks` blocks (or 15 s pass).
  bool WaitForCompressed(uint64_t blocks) {
    for (absl::Time deadline = absl::Now() + absl::Seconds(15); absl::Now() < deadline;) {
      if (Stats().compressed_blocks() >= blocks) return true;
      absl::SleepFor(absl::Milliseconds(100));
    }
    return false;
  }
  std::string Ctl(const std::string& args, int* exit_code) {
    CommandResult r = RunCommand(
        absl::StrCat(KVCACHECTL_BINARY, " --target ", daemon_->unix_target(), " ", args));
    *exit_code = r.exit_code;
    return r.output;
  }

  std::string config_path_;
  std::unique_ptr<DaemonProcess> daemon_;
  std::unique_ptr<Client> client_;
  uint64_t block_bytes_ = 0;
  std::vector<uint32_t> tokens_;
  std::vector<float> kv_;
};

TEST_F(ImportanceDaemonTest, QuantizeAtRuntimeServesDequantizedKvWithinBound) {
  // Off by default: nothing is compressed however cold.
  absl::SleepFor(absl::Milliseconds(1500));
  EXPECT_EQ(Stats().compressed_blocks(), 0u);
  EXPECT_EQ(Stats().policy().mode(), v1::COMPRESSION_MODE_OFF);

  int code = 0;
  const std::string set = Ctl(absl::StrCat("policy -m ", kModel, " --mode quantize"), &code);
  ASSERT_EQ(code, 0) << set;
  EXPECT_THAT(set, HasSubstr("mode:          quantize"));
  ASSERT_TRUE(WaitForCompressed(kBlocks - 1)) << "compaction did not run";

  // By default a worker gets only exact KV: the fetch ends before block 0,
  // which is now stored lossy, and says so.
  std::vector<float> got(kv_.size());
  absl::StatusOr<FetchResult> exact =
      client_->Fetch(kModel, tokens_, std::as_writable_bytes(std::span<float>(got)));
  ASSERT_TRUE(exact.ok()) << exact.status();
  EXPECT_EQ(exact->blocks, 0u);
  EXPECT_EQ(exact->matched_tokens, 0u);
  EXPECT_EQ(exact->withheld_tokens, kBlocks * kBt);
  absl::StatusOr<LookupResult> lookup = client_->Lookup(kModel, tokens_);
  ASSERT_TRUE(lookup.ok());
  EXPECT_EQ(lookup->matched_tokens, 0u);
  EXPECT_EQ(lookup->withheld_tokens, kBlocks * kBt);

  // Opting in: the lossy blocks, decoded.
  absl::StatusOr<FetchResult> f = client_->Fetch(
      kModel, tokens_, std::as_writable_bytes(std::span<float>(got)), {.accept_lossy = true});
  ASSERT_TRUE(f.ok()) << f.status();  // the client verified every checksum
  EXPECT_EQ(f->blocks, kBlocks);
  EXPECT_EQ(f->dequantized_blocks, kBlocks - 1);
  EXPECT_TRUE(f->kept_tokens.empty());
  // Protected tokens (4 sinks, the last block = recent window) are exact;
  // every other element is within half a step of its group's scale.
  const size_t token_floats = 32;  // head_dim
  double err2 = 0, ref2 = 0;
  float max_abs = 0;
  for (float x : kv_) max_abs = std::max(max_abs, std::abs(x));
  for (size_t i = 0; i < kv_.size(); ++i) {
    const size_t block = i / (block_bytes_ / sizeof(float));
    const size_t token = (i / token_floats) % kBt + block * kBt;
    if (token < 4 || block == kBlocks - 1) {
      ASSERT_EQ(got[i], kv_[i]) << "protected token " << token;
    } else {
      ASSERT_LE(std::abs(got[i] - kv_[i]), max_abs / 127 * 0.5001f);
      err2 += double(got[i] - kv_[i]) * (got[i] - kv_[i]);
      ref2 += double(kv_[i]) * kv_[i];
    }
  }
  EXPECT_LE(std::sqrt(err2 / ref2), 0.01);
  const v1::ModelStats s = Stats();
  EXPECT_EQ(s.int8_tokens(), (kBlocks - 1) * kBt - 4);
  EXPECT_GT(s.bytes_saved(), (kBlocks - 1) * block_bytes_ / 2);

  // The stored format, on request: about half the bytes, verified by its own
  // checksum, and decoding it here gives exactly what the daemon's decode sent.
  absl::StatusOr<std::vector<FetchedBlock>> packed =
      client_->FetchBlocks(kModel, tokens_, /*lossy_as_stored=*/true, {.accept_lossy = true});
  ASSERT_TRUE(packed.ok()) << packed.status();
  ASSERT_EQ(packed->size(), kBlocks);
  uint64_t wire = 0;
  for (const FetchedBlock& b : *packed) {
    wire += b.bytes.size();
    std::span<const std::byte> bytes = std::as_bytes(std::span(b.bytes.data(), b.bytes.size()));
    std::vector<std::byte> decoded(block_bytes_);
    if (b.index + 1 == kBlocks) {
      EXPECT_EQ(b.encoding, v1::BLOCK_ENCODING_RAW);
      std::memcpy(decoded.data(), b.bytes.data(), b.bytes.size());
    } else {
      EXPECT_EQ(b.encoding, v1::BLOCK_ENCODING_COMPRESSED);
      absl::StatusOr<importance::CompressedBlockView> view =
          importance::ParseCompressedBlock(bytes);
      ASSERT_TRUE(view.ok()) << view.status();
      ASSERT_TRUE(importance::DecodeBlock(*view, decoded).ok());
    }
    EXPECT_EQ(std::memcmp(decoded.data(), got.data() + b.index * block_bytes_ / sizeof(float),
                          block_bytes_),
              0)
        << "block " << b.index;
  }
  EXPECT_LT(wire, kBlocks * block_bytes_ * 2 / 3);

  // A worker that recomputed the prefix appends its exact bytes: they match
  // the blocks' original checksums, so the lossy copies are replaced.
  absl::StatusOr<AppendResult> again =
      client_->Append(kModel, tokens_, std::as_bytes(std::span<const float>(kv_)));
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_EQ(again->restored_blocks, kBlocks - 1);
  EXPECT_EQ(again->conflicting_blocks, 0u);
  absl::StatusOr<FetchResult> restored =
      client_->Fetch(kModel, tokens_, std::as_writable_bytes(std::span<float>(got)));
  ASSERT_TRUE(restored.ok()) << restored.status();
  // (Compaction may have compressed them again already: blocks go cold after 1 s here.)
  EXPECT_EQ(restored->blocks * kBt + restored->withheld_tokens, kBlocks * kBt);
  if (restored->blocks == kBlocks) {
    EXPECT_EQ(got, kv_);
  }
  EXPECT_GE(Stats().restored_blocks(), kBlocks - 1);
  ASSERT_TRUE(WaitForCompressed(kBlocks - 1)) << "compaction did not compress them again";

  // Switching off removes the compressed blocks: the model is lossless again.
  const std::string off = Ctl(absl::StrCat("policy -m ", kModel, " --mode off"), &code);
  ASSERT_EQ(code, 0) << off;
  EXPECT_THAT(off, HasSubstr("removed 4 compressed blocks"));
  EXPECT_EQ(Stats().blocks(), 0u);
}

TEST_F(ImportanceDaemonTest, ReportsPolicyChangesAndMetrics) {
  std::vector<float> attention(tokens_.size(), 0.01f);
  attention[9] = 1.0f;
  auto report = client_->ReportAttention(kModel, tokens_, attention);
  ASSERT_TRUE(report.ok()) << report.status();
  EXPECT_EQ(report->matched_tokens(), tokens_.size());
  std::vector<float> bad(tokens_.size() - 1, 0.1f);
  auto rejected = client_->ReportAttention(kModel, tokens_, bad);
  EXPECT_EQ(rejected.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(rejected.status().message()), HasSubstr("attention has"));

  int code = 0;
  const std::string prune = Ctl(
      absl::StrCat("policy -m ", kModel, " --mode prune --weights 0.5 0.4 0.1 --target-mass 0.9"),
      &code);
  ASSERT_EQ(code, 0) << prune;
  ASSERT_TRUE(WaitForCompressed(kBlocks - 1));
  const v1::ModelStats s = Stats();
  EXPECT_EQ(s.policy().mode(), v1::COMPRESSION_MODE_PRUNE);
  EXPECT_FLOAT_EQ(s.policy().weights().alpha(), 0.5f);
  EXPECT_EQ(s.attention_reports(), 1u);
  EXPECT_GT(s.pruned_tokens(), 0u);

  std::vector<float> got(kv_.size());
  auto f = client_->Fetch(kModel, tokens_, std::as_writable_bytes(std::span<float>(got)),
                          {.accept_lossy = true});
  ASSERT_TRUE(f.ok()) << f.status();
  ASSERT_EQ(f->kept_tokens.size(), kBlocks);
  EXPECT_THAT(f->kept_tokens[0], ::testing::Contains(9u));  // the heavy hitter stays
  EXPECT_TRUE(f->kept_tokens[kBlocks - 1].empty());         // the recent window is whole

  const std::string bad_mode = Ctl(absl::StrCat("policy -m ", kModel, " --mode fast"), &code);
  EXPECT_NE(code, 0);
  const std::string bad_mass = Ctl(absl::StrCat("policy -m ", kModel, " --weights 0 0 0"), &code);
  EXPECT_EQ(code, 1) << bad_mass;
  EXPECT_THAT(bad_mass, HasSubstr("INVALID_ARGUMENT"));
  const std::string show = Ctl(absl::StrCat("policy -m ", kModel), &code);
  EXPECT_EQ(code, 0);
  EXPECT_THAT(show, HasSubstr("prune"));
  const std::string stats = Ctl("stats", &code);
  EXPECT_THAT(stats, HasSubstr("PRUNED_TOKENS"));

  const CommandResult scraped =
      RunCommand(absl::StrCat("curl -sf http://127.0.0.1:", daemon_->metrics_port(), "/metrics"));
  ASSERT_EQ(scraped.exit_code, 0);
  const std::string& scrape = scraped.output;
  for (const char* name :
       {"kvcached_model_tokens{namespace=\"default\",model=\"imp\",precision=\"int8\"}",
        "kvcached_model_tokens{namespace=\"default\",model=\"imp\",precision=\"pruned\"}",
        "kvcached_compression_mode{namespace=\"default\",model=\"imp\",mode=\"prune\"} 1",
        "kvcached_importance_weight{namespace=\"default\",model=\"imp\",weight=\"alpha\"} 0.5",
        "kvcached_attention_reports_total{namespace=\"default\",model=\"imp\"} 1",
        "kvcached_importance_score_bucket", "kvcached_model_bytes_saved",
        "kvcached_compaction_passes_total"}) {
    EXPECT_THAT(scrape, HasSubstr(name));
  }
}

// Calibration refits the weights from attention reports, saves them to the
// calibration file, and a restarted daemon starts the model from them.
TEST(CalibrationPersistenceTest, CalibratedWeightsSurviveARestart) {
  const std::string dir = ::testing::TempDir();
  const std::string config = absl::StrCat(dir, "/calib_config_", ::getpid(), ".json");
  const std::string weights = absl::StrCat(dir, "/calib_weights_", ::getpid(), ".json");
  std::remove(weights.c_str());
  std::ofstream(config) << absl::StrCat(
      R"({"importance": {"calibration_interval_seconds": 1, "calibration_min_samples": 16,
          "calibration_max_step": 0.2, "calibration_file": ")",
      weights, R"("}})");
  const v1::ModelLayout layout = MakeLayout(1, 1, 16, v1::DTYPE_FP32, kBt);
  const std::vector<uint32_t> tokens = MakeTokens(11, 8 * kBt);
  v1::ImportanceWeights learned;
  {
    auto d = DaemonProcess::Start({.extra_flags = {"--config", config}});
    ASSERT_TRUE(d.ok()) << d.status();
    auto client = (*d)->NewClient();
    auto r = client->RegisterModel(kModel, layout);
    ASSERT_TRUE(r.ok());
    std::vector<float> kv(8 * r->block_bytes() / sizeof(float), 0.5f);
    ASSERT_TRUE(client->Append(kModel, tokens, std::as_bytes(std::span<const float>(kv))).ok());
    // Attention that falls with distance from the end, like the position factor.
    std::vector<float> attention(tokens.size());
    for (size_t t = 0; t < tokens.size(); ++t) attention[t] = std::exp(-(127.0f - t) / 16.0f);
    ASSERT_TRUE(client->ReportAttention(kModel, tokens, attention).ok());
    bool saved = false;
    for (absl::Time deadline = absl::Now() + absl::Seconds(10); absl::Now() < deadline;) {
      auto stats = client->GetStats();
      ASSERT_TRUE(stats.ok());
      if (stats->models(0).calibrations() > 0 && std::ifstream(weights).good()) {
        learned = stats->models(0).policy().weights();
        saved = true;
        break;
      }
      absl::SleepFor(absl::Milliseconds(100));
    }
    ASSERT_TRUE(saved) << "no calibration was applied and saved";
    EXPECT_GT(learned.beta(), 0.3f);  // moved toward the position factor
    client.reset();
    EXPECT_EQ((*d)->Stop(), 0);
  }
  auto d = DaemonProcess::Start({.extra_flags = {"--config", config}});
  ASSERT_TRUE(d.ok()) << d.status();
  auto client = (*d)->NewClient();
  ASSERT_TRUE(client->RegisterModel(kModel, layout).ok());
  auto models = client->ListModels();
  ASSERT_TRUE(models.ok());
  const v1::ImportanceWeights& w = models->models(0).policy().weights();
  EXPECT_FLOAT_EQ(w.alpha(), learned.alpha());
  EXPECT_FLOAT_EQ(w.beta(), learned.beta());
  EXPECT_FLOAT_EQ(w.gamma(), learned.gamma());
  client.reset();
  EXPECT_EQ((*d)->Stop(), 0);
  std::remove(config.c_str());
  std::remove(weights.c_str());
}

}  // namespace
}  // namespace kvcache::testing
