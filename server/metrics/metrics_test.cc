#include "server/metrics/metrics.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

namespace kvcache {
namespace {

using ::testing::HasSubstr;

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

TEST(MetricsTest, ExposerRefusesABadAddress) {
  auto metrics = Metrics::Start("256.0.0.1:1", SampleStats);
  EXPECT_EQ(metrics.status().code(), absl::StatusCode::kUnavailable);
}

}  // namespace
}  // namespace kvcache
