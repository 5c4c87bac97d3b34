#include "server/metrics/metrics.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstdlib>
#include <fstream>
#include <map>
#include <set>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "server/core/memory_breakdown.h"
#include "server/frontdoor/fair_scheduler.h"
#include "server/remote/remote_sharing.h"
#include "server/shm/mapping_budget.h"

namespace kvcache {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

CacheStats SampleStats() {
  CacheStats s;
  ModelStats m;
  m.model = {.ns = "default", .model_id = "llama"};
  m.blocks = 3;
  m.bytes = 3000;
  m.hit_tokens = 128;
  m.miss_tokens = 64;
  s.models.push_back(m);
  s.host_pool.capacity_bytes = 1 << 20;
  s.host_pool.reserved_bytes = 4096;
  s.capacity_evictions = 7;
  s.active_leases = 2;
  s.pool_compaction = {.passes = 9, .moved_blocks = 5, .moved_bytes = 5120, .changed_blocks = 1};
  s.host_pool.drained_spans = 2;
  return s;
}

// A model whose every counter holds a distinct value drawn from `n`.
ModelStats RichModel(std::string ns, std::string id, CompressionMode mode, uint64_t& n) {
  ModelStats m;
  m.model = {.ns = std::move(ns), .model_id = std::move(id)};
  for (uint64_t* f : {&m.blocks,
                      &m.tokens,
                      &m.bytes,
                      &m.hit_tokens,
                      &m.miss_tokens,
                      &m.appended_blocks,
                      &m.deduplicated_blocks,
                      &m.evicted_blocks,
                      &m.compressed_blocks,
                      &m.full_tokens,
                      &m.int8_tokens,
                      &m.pruned_tokens,
                      &m.bytes_saved,
                      &m.attention_reports,
                      &m.calibrations,
                      &m.conflicting_blocks,
                      &m.restored_blocks,
                      &m.corrupt_blocks,
                      &m.int8_entries,
                      &m.int4_entries,
                      &m.pruned_entries,
                      &m.budget_overruns}) {
    *f = n++;
  }
  m.policy.mode = mode;
  m.policy.params.alpha = 0.5f;
  m.policy.params.beta = 0.25f;
  m.policy.params.gamma = 0.125f + static_cast<float>(n++) / 1024;
  return m;
}

// A snapshot with every family's inputs set, each to a distinct value:
// three models, a lower tier of `lower_kind` when not empty, a GPU tier when
// `device`, checkpoints when `checkpoint` (one committed when `committed`).
CacheStats RichStats(std::string lower_kind, bool device, bool checkpoint, bool committed) {
  uint64_t n = 1;
  CacheStats s;
  s.models.push_back(RichModel("default", "llama", CompressionMode::kOff, n));
  s.models.push_back(RichModel("default", "mistral", CompressionMode::kQuantize, n));
  s.models.push_back(RichModel("tenant-b", "llama", CompressionMode::kPrune, n));
  s.host_pool.capacity_bytes = uint64_t{1} << 30;
  s.host_pool.reserved_bytes = (uint64_t{1} << 20) + n++;
  s.host_pool.drained_spans = n++;
  for (uint64_t* f : {&s.blocks, &s.payload_bytes, &s.active_leases, &s.capacity_evictions,
                      &s.rejected_appends, &s.compaction_passes, &s.conflicting_appends,
                      &s.metadata_evictions, &s.metadata_bytes, &s.staged_bytes, &s.lease_tokens}) {
    *f = 1000 + n++;
  }
  for (uint64_t* f :
       {&s.pool_compaction.passes, &s.pool_compaction.moved_blocks, &s.pool_compaction.moved_bytes,
        &s.pool_compaction.changed_blocks, &s.pool_compaction.mismatched_blocks}) {
    *f = n++;
  }
  for (int b = 0; b < ScoreHistogram::kBuckets; ++b) s.scores.Add(b / 10.0f + 0.05f);
  s.scores.Add(0.3f);
  TierCounters& t = s.tiers;
  LowerLevelCounters& l = t.lower[0];
  for (uint64_t* f : {&l.blocks,
                      &l.payload_bytes,
                      &l.only_blocks,
                      &l.demotions,
                      &l.demoted_bytes,
                      &l.clean_drops,
                      &l.promotions,
                      &l.promoted_bytes,
                      &l.reads,
                      &l.read_bytes,
                      &l.evictions,
                      &l.admissions_refused,
                      &l.not_admitted_evictions,
                      &l.write_failures,
                      &l.checksum_failures,
                      &t.heap_bounded_fetches,
                      &t.migrate_passes,
                      &t.moves_unlogged,
                      &t.device_blocks,
                      &t.device_payload_bytes,
                      &t.device_placements,
                      &t.device_placed_bytes,
                      &t.device_hits,
                      &t.device_drops_room,
                      &t.device_drops_pressure,
                      &t.device_drops_invalidated,
                      &t.device_write_failures}) {
    *f = n++;
  }
  if (!lower_kind.empty()) {
    TierStats& store = s.lower_stores.emplace_back();
    store.kind = lower_kind;
    store.capacity_bytes = uint64_t{8} << 30;
    store.allocated_bytes = 4096 + n++;
    store.payload_bytes = 2048 + n++;
    s.prefetch = {.issued = n++, .completed = n++, .dropped = n++, .late = n++};
  }
  if (device) {
    s.has_device = true;
    s.device_store.kind = "memory";
    s.device_store.capacity_bytes = uint64_t{2} << 30;
    s.device_store.allocated_bytes = 8192 + n++;
    s.device_store.payload_bytes = 6144 + n++;
  }
  if (checkpoint) {
    CheckpointCounters& c = s.checkpoint;
    c.enabled = true;
    c.ok = n++;
    c.failed = n++;
    c.started_unix_seconds = 1.7e9;
    if (committed) {
      c.last_success_unix_seconds = 1.7e9 + 60;
      c.last_duration_seconds = 2.5;
      c.last_bytes = n++;
    }
    c.in_progress = true;
    c.restore_state = "restoring";
    for (uint64_t* f :
         {&c.restored_blocks, &c.restore_skipped_blocks, &c.restore_failed_checkpoints,
          &c.reattached_copies, &c.reattach_failures}) {
      *f = n++;
    }
  }
  return s;
}

// The snapshots the exposition is pinned on.
std::vector<std::pair<std::string, CacheStats>> SampleSnapshots() {
  CacheStats no_models = RichStats("ssd", true, true, true);
  no_models.models.clear();
  return {
      {"empty", CacheStats{}},
      {"no_models", no_models},
      {"host_only", RichStats("", false, false, false)},
      {"ssd", RichStats("ssd", false, false, false)},
      {"gpu", RichStats("", true, false, false)},
      {"ssd_gpu", RichStats("ssd", true, false, false)},
      {"checkpoint_first", RichStats("ssd", false, true, false)},
      {"checkpoint", RichStats("ssd", true, true, true)},
  };
}

// Renders every snapshot of SampleSnapshots() into $KVCACHE_METRICS_DUMP_DIR,
// one file each, for comparing the exposition before and after a change to
// the metrics code. Skipped without the variable.
TEST(MetricsTest, DumpsSampleExpositions) {
  const char* dir = std::getenv("KVCACHE_METRICS_DUMP_DIR");
  if (dir == nullptr) GTEST_SKIP() << "set KVCACHE_METRICS_DUMP_DIR to write the renderings";
  for (const auto& [name, stats] : SampleSnapshots()) {
    auto metrics = Metrics::CreateUnexposed([s = stats] { return s; });
    metrics->OnRpcDone("Lookup", absl::StatusCode::kOk, absl::Microseconds(300), 0);
    std::ofstream(std::string(dir) + "/" + name + ".prom") << metrics->Render();
  }
}

TEST(MetricsTest, RendersCacheStatsWithLabels) {
  auto metrics = Metrics::CreateUnexposed(SampleStats);
  const std::string text = metrics->Render();
  EXPECT_THAT(text, HasSubstr(R"(kvcached_model_blocks{namespace="default",model="llama"} 3)"));
  EXPECT_THAT(
      text,
      HasSubstr(R"(kvcached_lookup_hit_tokens_total{namespace="default",model="llama"} 128)"));
  EXPECT_THAT(text, HasSubstr(R"(kvcached_tier_capacity_bytes{tier="host"} 1048576)"));
  EXPECT_THAT(text, HasSubstr("kvcached_capacity_evictions_total 7"));
  EXPECT_THAT(text, HasSubstr("kvcached_pool_compaction_passes_total 9"));
  EXPECT_THAT(text, HasSubstr("kvcached_pool_compaction_moves_total 5"));
  EXPECT_THAT(text, HasSubstr("kvcached_pool_compaction_moved_bytes_total 5120"));
  EXPECT_THAT(text, HasSubstr(R"(kvcached_pool_compaction_skipped_total{reason="changed"} 1)"));
  EXPECT_THAT(text, HasSubstr("kvcached_pool_drained_spans_total 2"));
  EXPECT_THAT(text, HasSubstr("kvcached_active_leases 2"));
}

TEST(MetricsTest, CountsRpcsByMethodAndCode) {
  auto metrics = Metrics::CreateUnexposed(SampleStats);
  metrics->OnRpcDone("Lookup", absl::StatusCode::kOk, absl::Microseconds(300), 0);
  metrics->OnRpcDone("Lookup", absl::StatusCode::kOk, absl::Microseconds(300), 0);
  metrics->OnRpcDone("Append", absl::StatusCode::kInvalidArgument, absl::Milliseconds(2), 4096);
  const std::string text = metrics->Render();
  EXPECT_THAT(text, HasSubstr(R"(kvcached_rpcs_total{code="OK",method="Lookup"} 2)"));
  EXPECT_THAT(text, HasSubstr(R"(kvcached_rpcs_total{code="INVALID_ARGUMENT",method="Append"} 1)"));
  EXPECT_THAT(text, HasSubstr(R"(kvcached_rpc_latency_seconds_count{method="Lookup"} 2)"));
  EXPECT_THAT(text, HasSubstr(R"(kvcached_rpc_payload_bytes_total{method="Append"} 4096)"));
}

TEST(MetricsTest, CountsStreamTimeoutsAndLimitRejections) {
  auto metrics = Metrics::CreateUnexposed(SampleStats);
  metrics->OnStreamTimeout("Append");
  metrics->OnStreamTimeout("Append");
  metrics->OnStreamTimeout("Fetch");
  metrics->OnLimitReached("Fetch", "max_streams_per_client");
  metrics->OnLimitReached("Lookup", "max_concurrent_unary");
  const std::string text = metrics->Render();
  EXPECT_THAT(text, HasSubstr(R"(kvcached_stream_timeouts_total{method="Append"} 2)"));
  EXPECT_THAT(text, HasSubstr(R"(kvcached_stream_timeouts_total{method="Fetch"} 1)"));
  EXPECT_THAT(
      text,
      HasSubstr(
          R"(kvcached_limit_rejections_total{limit="max_streams_per_client",method="Fetch"} 1)"));
  EXPECT_THAT(
      text,
      HasSubstr(
          R"(kvcached_limit_rejections_total{limit="max_concurrent_unary",method="Lookup"} 1)"));
}

// One sample line of an exposition: its series name and label names.
struct Sample {
  std::string name;
  std::set<std::string> labels;
};

// The samples of `text`, in order. Label values here hold no quotes.
std::vector<Sample> ParseSamples(const std::string& text) {
  std::vector<Sample> out;
  for (absl::string_view line : absl::StrSplit(text, '\n', absl::SkipEmpty())) {
    if (absl::StartsWith(line, "#")) continue;
    Sample sample;
    const size_t brace = line.find('{');
    const size_t end = brace == absl::string_view::npos ? line.find(' ') : brace;
    sample.name = std::string(line.substr(0, end));
    if (brace != absl::string_view::npos) {
      absl::string_view labels = line.substr(brace + 1, line.find('}') - brace - 1);
      for (absl::string_view pair : absl::StrSplit(labels, ',', absl::SkipEmpty())) {
        sample.labels.insert(std::string(pair.substr(0, pair.find('='))));
      }
    }
    out.push_back(std::move(sample));
  }
  return out;
}

// A family docs/metrics.md lists: its type and label names.
struct DocumentedFamily {
  std::string type;
  std::set<std::string> labels;
};

// The table of docs/metrics.md: rows "| `name`[, `name`] | type | labels | meaning |".
std::map<std::string, DocumentedFamily> DocumentedFamilies() {
  std::ifstream in(std::string(KVCACHE_SOURCE_DIR) + "/docs/metrics.md");
  std::map<std::string, DocumentedFamily> out;
  std::string line;
  while (std::getline(in, line)) {
    if (!absl::StartsWith(line, "| `kvcached_")) continue;
    std::vector<std::string> cells = absl::StrSplit(line, '|');
    if (cells.size() < 5) continue;
    DocumentedFamily family;
    family.type = std::string(absl::StripAsciiWhitespace(cells[2]));
    for (absl::string_view label : absl::StrSplit(cells[3], ',')) {
      label = absl::StripAsciiWhitespace(label);
      if (!label.empty()) family.labels.insert(std::string(label));
    }
    for (absl::string_view name : absl::StrSplit(cells[1], ',')) {
      name = absl::StripAsciiWhitespace(name);
      out[std::string(absl::StripSuffix(absl::StripPrefix(name, "`"), "`"))] = family;
    }
  }
  return out;
}

// Every family docs/metrics.md lists appears, with its documented type and
// exactly its documented labels, when every part of the cache is on; and
// every family rendered is documented.
TEST(MetricsTest, ExposesEveryDocumentedFamilyWithItsLabels) {
  const std::map<std::string, DocumentedFamily> documented = DocumentedFamilies();
  ASSERT_GE(documented.size(), 60u) << "docs/metrics.md not found or its table changed shape";
  auto metrics =
      Metrics::CreateUnexposed([] { return RichStats("ssd", true, true, /*committed=*/true); });
  metrics->OnRpcDone("Fetch", absl::StatusCode::kOk, absl::Milliseconds(1), 4096);
  metrics->OnStreamTimeout("Append");
  metrics->OnLimitReached("Fetch", "max_streams_per_client");
  auto budget = std::make_shared<MappingBudget>(MappingLimits{});
  absl::StatusOr<MappingBudget::Grant> grant = budget->Reserve("uid 1", 1 << 20);
  ASSERT_TRUE(grant.ok());
  metrics->AddCounterSource([budget](CounterVisitor& v) { budget->VisitCounters(v); });
  metrics->AddCounterSource([](CounterVisitor& v) {
    BreakDownMemory(
        {.process = {.vm_rss_bytes = 300 << 20, .threads = 40}, .capacity_bytes = 256 << 20})
        .VisitCounters(v);
  });
  auto fair = std::make_shared<FairScheduler>(FairSchedulerOptions{.slots = 3});
  metrics->AddCounterSource([fair](CounterVisitor& v) { fair->VisitCounters(v); });
  metrics->AddCounterSource([](CounterVisitor& v) {
    RemoteSharing::VisitCounters({.blocks_adopted = 7}, {.hits = 5, .breaker_open = true}, v);
  });
  const std::string text = metrics->Render();
  EXPECT_THAT(text, HasSubstr("kvcached_remote_adopted_blocks_total{outcome=\"adopted\"} 7\n"));
  EXPECT_THAT(text, HasSubstr("kvcached_remote_reads_total{outcome=\"hit\"} 5\n"));
  EXPECT_THAT(text, HasSubstr("kvcached_remote_breaker_open 1\n"));
  EXPECT_THAT(text, HasSubstr("kvcached_data_path_slots 3\n"));
  EXPECT_THAT(text,
              HasSubstr("kvcached_data_path_waits_total{path=\"grpc\",max_seconds=\"+Inf\"} 0\n"));
  EXPECT_THAT(text, HasSubstr("kvcached_shm_mapped_bytes 1048576\n"));
  EXPECT_THAT(text, HasSubstr("kvcached_shm_mappings 1\n"));
  const std::vector<Sample> samples = ParseSamples(text);
  for (const auto& [name, family] : documented) {
    SCOPED_TRACE(name);
    EXPECT_THAT(text, HasSubstr("# TYPE " + name + " " + family.type + "\n"));
    int found = 0;
    for (const Sample& sample : samples) {
      std::set<std::string> want = family.labels;
      if (family.type == "histogram") {
        if (sample.name == name + "_bucket") {
          want.insert("le");
        } else if (sample.name != name + "_sum" && sample.name != name + "_count") {
          continue;
        }
      } else if (sample.name != name) {
        continue;
      }
      ++found;
      EXPECT_EQ(sample.labels, want) << sample.name;
    }
    EXPECT_GT(found, 0) << "no sample";
  }
  for (absl::string_view line : absl::StrSplit(text, '\n')) {
    if (!absl::ConsumePrefix(&line, "# TYPE ")) continue;
    const std::string name(line.substr(0, line.find(' ')));
    EXPECT_TRUE(documented.contains(name)) << name << " is not in docs/metrics.md";
  }
}

// How many times `text` holds `needle`.
int Count(const std::string& text, const std::string& needle) {
  int n = 0;
  for (size_t at = text.find(needle); at != std::string::npos; at = text.find(needle, at + 1)) ++n;
  return n;
}

// A family reported with different labels, from several models and tiers,
// is one family whose samples follow its header, in the order reported.
TEST(MetricsTest, SamplesWithDifferentLabelsShareOneFamily) {
  auto metrics = Metrics::CreateUnexposed([] { return RichStats("ssd", true, false, false); });
  const std::string text = metrics->Render();
  EXPECT_EQ(Count(text, "# TYPE kvcached_tier_capacity_bytes gauge\n"), 1);
  EXPECT_THAT(text, HasSubstr("# TYPE kvcached_tier_capacity_bytes gauge\n"
                              "kvcached_tier_capacity_bytes{tier=\"host\"} 1073741824\n"
                              "kvcached_tier_capacity_bytes{tier=\"ssd\"} 8589934592\n"
                              "kvcached_tier_capacity_bytes{tier=\"gpu\"} 2147483648\n"));
  EXPECT_EQ(Count(text, "# TYPE kvcached_model_blocks gauge\n"), 1);
  EXPECT_THAT(text, HasSubstr("# TYPE kvcached_model_blocks gauge\n"
                              "kvcached_model_blocks{namespace=\"default\",model=\"llama\"} 1\n"
                              "kvcached_model_blocks{namespace=\"default\",model=\"mistral\"} "
                              "24\n"
                              "kvcached_model_blocks{namespace=\"tenant-b\",model=\"llama\"} "
                              "47\n"));
  EXPECT_EQ(Count(text, "# TYPE kvcached_tier_evictions_total counter\n"), 1);
  EXPECT_EQ(Count(text, "kvcached_tier_evictions_total{"), 2);
}

// Without a registered model the per-model families are still listed, with
// no samples; the tier families appear only with their tiers.
TEST(MetricsTest, ListsPerModelFamiliesWithoutModels) {
  auto metrics = Metrics::CreateUnexposed([] { return CacheStats{}; });
  const std::string text = metrics->Render();
  EXPECT_THAT(text, HasSubstr("# TYPE kvcached_model_blocks gauge\n"));
  EXPECT_THAT(text, HasSubstr("# TYPE kvcached_model_tokens gauge\n"));
  EXPECT_EQ(Count(text, "kvcached_model_blocks{"), 0);
  EXPECT_THAT(text, Not(HasSubstr("kvcached_tier_migrations_total")));
  EXPECT_THAT(text, Not(HasSubstr("kvcached_gpu_placements_total")));
  EXPECT_THAT(text, Not(HasSubstr("kvcached_checkpoints_total")));
  EXPECT_EQ(Count(text, "kvcached_tier_capacity_bytes{"), 1);
}

TEST(MetricsTest, ExposerRefusesABadAddress) {
  auto metrics = Metrics::Start("256.0.0.1:1", SampleStats);
  EXPECT_EQ(metrics.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(std::string(metrics.status().message()), HasSubstr("256.0.0.1:1"));
}

TEST(MetricsTest, StartReportsThePortItPicked) {
  auto metrics = Metrics::Start("127.0.0.1:0", SampleStats);
  ASSERT_TRUE(metrics.ok()) << metrics.status();
  EXPECT_GT((*metrics)->port(), 0);
  EXPECT_EQ(Metrics::CreateUnexposed(SampleStats)->port(), 0);
}

}  // namespace
}  // namespace kvcache
