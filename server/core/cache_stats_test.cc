#include "server/core/cache_stats.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <map>
#include <regex>
#include <set>
#include <string>
#include <utility>
#include <vector>

namespace kvcache {
namespace {

using ::testing::ElementsAre;
using ::testing::IsEmpty;
using ::testing::Pair;

// Records what a snapshot visits.
class RecordingVisitor final : public CounterVisitor {
 public:
  struct Sample {
    std::vector<std::pair<std::string, std::string>> labels;
    double value = 0;
  };
  struct Family {
    std::string help;
    CounterType type = CounterType::kCounter;
    std::vector<Sample> samples;
  };

  std::map<std::string, Family> families;
  std::vector<std::string> declared;
  int mismatches = 0;  // samples whose help or type differed from the first

  const Sample* Find(const std::string& name,
                     const std::vector<std::pair<std::string, std::string>>& labels) const {
    auto it = families.find(name);
    if (it == families.end()) return nullptr;
    for (const Sample& s : it->second.samples) {
      if (s.labels == labels) return &s;
    }
    return nullptr;
  }

 private:
  void OnSample(const CounterFamily& family, std::span<const CounterLabel> labels,
                double value) override {
    auto [it, added] = families.try_emplace(std::string(family.name));
    if (added) {
      it->second.help = family.help;
      it->second.type = family.type;
    } else if (it->second.help != family.help || it->second.type != family.type) {
      ++mismatches;
    }
    Sample s{.value = value};
    for (const CounterLabel& l : labels) s.labels.emplace_back(l.name, l.value);
    it->second.samples.push_back(std::move(s));
  }
  void OnDeclare(const CounterFamily& family) override { declared.emplace_back(family.name); }
};

CacheStats Everything() {
  CacheStats s;
  ModelStats a;
  a.model = {.ns = "default", .model_id = "llama"};
  a.blocks = 3;
  a.policy.mode = CompressionMode::kPrune;
  ModelStats b = a;
  b.model.model_id = "mistral";
  b.blocks = 4;
  s.models = {a, b};
  s.blocks = 10;
  s.tiers.lower[0].only_blocks = 4;
  s.tiers.lower[0].blocks = 6;
  s.lower_stores.push_back({.kind = "ssd"});
  s.has_device = true;
  s.checkpoint.enabled = true;
  s.checkpoint.last_success_unix_seconds = 900;
  s.checkpoint.restore_state = "done";
  return s;
}

// The contract metrics relies on: one help and type per name, the same label
// names on every sample of a family, no two samples with the same labels,
// Prometheus-valid names with "_total" on counters only.
TEST(CacheStatsTest, EveryFamilyKeepsOneHelpTypeAndLabelNames) {
  RecordingVisitor v;
  Everything().VisitCounters(absl::UnixEpoch(), v);
  EXPECT_EQ(v.mismatches, 0);
  EXPECT_GE(v.families.size(), 55u);
  const std::regex valid("kvcached_[a-z0-9_]+");
  for (const auto& [name, family] : v.families) {
    SCOPED_TRACE(name);
    EXPECT_TRUE(std::regex_match(name, valid));
    EXPECT_FALSE(family.help.empty());
    EXPECT_EQ(name.ends_with("_total"), family.type == CounterType::kCounter);
    std::set<std::vector<std::pair<std::string, std::string>>> seen;
    for (const RecordingVisitor::Sample& s : family.samples) {
      ASSERT_EQ(s.labels.size(), family.samples.front().labels.size());
      for (size_t i = 0; i < s.labels.size(); ++i) {
        EXPECT_EQ(s.labels[i].first, family.samples.front().labels[i].first);
      }
      EXPECT_TRUE(seen.insert(s.labels).second) << "two samples with the same labels";
    }
  }
  EXPECT_THAT(v.declared, IsEmpty());
}

TEST(CacheStatsTest, ReportsEachGroupWithItsLabels) {
  RecordingVisitor v;
  Everything().VisitCounters(absl::UnixEpoch(), v);
  const auto* mistral =
      v.Find("kvcached_model_blocks", {{"namespace", "default"}, {"model", "mistral"}});
  ASSERT_NE(mistral, nullptr);
  EXPECT_EQ(mistral->value, 4);
  const auto* prune = v.Find("kvcached_compression_mode",
                             {{"namespace", "default"}, {"model", "llama"}, {"mode", "prune"}});
  ASSERT_NE(prune, nullptr);
  EXPECT_EQ(prune->value, 1);
  const auto* host = v.Find("kvcached_tier_blocks", {{"tier", "host"}});
  ASSERT_NE(host, nullptr);
  EXPECT_EQ(host->value, 6);  // blocks without a host copy are the ssd's
  EXPECT_NE(v.Find("kvcached_tier_blocks", {{"tier", "ssd"}}), nullptr);
  EXPECT_NE(v.Find("kvcached_tier_blocks", {{"tier", "gpu"}}), nullptr);
  EXPECT_NE(v.Find("kvcached_tier_prefetches_total", {{"tier", "ssd"}, {"outcome", "late"}}),
            nullptr);
  EXPECT_NE(v.Find("kvcached_gpu_drops_total", {{"reason", "room"}}), nullptr);
  EXPECT_NE(v.Find("kvcached_pool_drained_spans_total", {}), nullptr);
  const auto* done = v.Find("kvcached_checkpoint_restore_state", {{"state", "done"}});
  ASSERT_NE(done, nullptr);
  EXPECT_EQ(done->value, 1);
}

// The lower tier's, the GPU tier's and the checkpoints' families appear only
// with them; the per-model families are declared while there is no model.
TEST(CacheStatsTest, ReportsOptionalGroupsOnlyWhenPresent) {
  RecordingVisitor v;
  CacheStats().VisitCounters(absl::UnixEpoch(), v);
  for (const auto& [name, family] : v.families) {
    SCOPED_TRACE(name);
    EXPECT_FALSE(name.starts_with("kvcached_gpu_") || name.starts_with("kvcached_checkpoint"));
    EXPECT_NE(name, "kvcached_tier_migrations_total");
    EXPECT_NE(name, "kvcached_tier_prefetches_total");
    for (const auto& s : family.samples) {
      EXPECT_THAT(s.labels, ::testing::Not(::testing::Contains(Pair("tier", "ssd"))));
    }
  }
  EXPECT_THAT(v.families["kvcached_tier_capacity_bytes"].samples.front().labels,
              ElementsAre(Pair("tier", "host")));

  RecordingVisitor one_model;
  CacheStats s;
  s.models.emplace_back();
  s.models.back().VisitCounters(one_model);
  std::set<std::string> per_model;
  for (const auto& [name, family] : one_model.families) per_model.insert(name);
  EXPECT_EQ(std::set<std::string>(v.declared.begin(), v.declared.end()), per_model);
  for (const std::string& name : per_model) EXPECT_EQ(v.families.count(name), 0u) << name;
}

TEST(CacheStatsTest, CheckpointAgeIsMeasuredAtTheGivenTime) {
  CheckpointCounters c;
  c.enabled = true;
  c.started_unix_seconds = 500;
  RecordingVisitor before;
  c.VisitCounters(absl::FromUnixSeconds(800), before);
  EXPECT_EQ(before.Find("kvcached_checkpoint_age_seconds", {})->value, 300);
  EXPECT_EQ(before.Find("kvcached_checkpoint_last_success_timestamp_seconds", {}), nullptr);
  c.last_success_unix_seconds = 750;
  RecordingVisitor after;
  c.VisitCounters(absl::FromUnixSeconds(800), after);
  EXPECT_EQ(after.Find("kvcached_checkpoint_age_seconds", {})->value, 50);
  EXPECT_EQ(after.Find("kvcached_checkpoint_last_success_timestamp_seconds", {})->value, 750);
}

}  // namespace
}  // namespace kvcache
