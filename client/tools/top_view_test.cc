#include "top_view.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

namespace kvcache::ctl {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

v1::RpcCounters* AddRpc(v1::GetStatsResponse& s, const std::string& method, uint64_t calls,
                        uint64_t errors, uint64_t bytes, uint64_t latency_us) {
  v1::RpcCounters* r = s.add_rpcs();
  r->set_method(method);
  r->set_calls(calls);
  r->set_errors(errors);
  r->set_payload_bytes(bytes);
  r->set_latency_us_sum(latency_us);
  return r;
}

v1::ModelStats* AddModel(v1::GetStatsResponse& s, uint64_t hits, uint64_t misses) {
  v1::ModelStats* m = s.add_models();
  m->set_namespace_("default");
  m->set_model_id("llama");
  m->set_hit_tokens(hits);
  m->set_miss_tokens(misses);
  m->mutable_policy()->set_mode(v1::COMPRESSION_MODE_QUANTIZE);
  m->set_compressed_blocks(3);
  m->set_bytes_saved(4096);
  m->set_int8_entries(11);
  m->set_int4_entries(12);
  m->set_pruned_entries(13);
  return m;
}

v1::TierStats* AddTier(v1::GetStatsResponse& s, const std::string& name, uint64_t capacity,
                       uint64_t used, uint64_t demotions) {
  v1::TierStats* t = s.add_tiers();
  t->set_name(name);
  t->set_capacity_bytes(capacity);
  t->set_used_bytes(used);
  t->set_demotions(demotions);
  return t;
}

class TopViewTest : public ::testing::Test {
 protected:
  void SetUp() override {
    first_.time = absl::FromUnixSeconds(1000);
    AddRpc(first_.stats, "Lookup", 100, 1, 0, 10000);
    AddRpc(first_.stats, "Append", 10, 0, 1 << 20, 5000);
    AddRpc(first_.stats, "Fetch", 5, 0, 1 << 20, 500);
    AddModel(first_.stats, 300, 100);
    AddTier(first_.stats, "host", 1000, 250, 0);
    AddTier(first_.stats, "ssd", 4000, 0, 7);
    first_.stats.set_capacity_evictions(2);

    second_.time = first_.time + absl::Seconds(2);
    AddRpc(second_.stats, "Lookup", 300, 5, 0, 10000 + 200 * 50);
    AddRpc(second_.stats, "Append", 10, 0, 1 << 20, 5000);
    AddRpc(second_.stats, "Fetch", 25, 0, 5 << 20, 500 + 20 * 1000);
    AddRpc(second_.stats, "ShmFetchInto", 2, 0, 2 << 20, 300);  // new since the first poll
    AddModel(second_.stats, 600, 200);
    AddTier(second_.stats, "host", 1000, 500, 0);
    AddTier(second_.stats, "ssd", 4000, 100, 27);
    second_.stats.set_capacity_evictions(12);
    second_.stats.set_active_leases(4);
  }

  TopHeader Header() const {
    TopHeader h;
    h.target = "unix:///run/kvcached/kvcached.sock";
    h.info.set_version("0.1.0");
    h.interval = absl::Seconds(2);
    return h;
  }

  TopSample first_, second_;
};

TEST_F(TopViewTest, FirstFrameHasTotalsButNoRates) {
  const TopFrame f = BuildTopFrame(nullptr, first_);
  EXPECT_FALSE(f.interval_s.has_value());
  ASSERT_EQ(f.rpcs.size(), 3u);
  EXPECT_TRUE(f.rpcs_reported);
  EXPECT_EQ(f.rpcs[0].method, "Lookup");  // most calls first
  EXPECT_FALSE(f.rpcs[0].calls_per_s.has_value());
  EXPECT_FALSE(f.rpcs[0].mean_latency_us.has_value());
  EXPECT_FALSE(f.hit_ratio.has_value());
  ASSERT_EQ(f.models.size(), 1u);
  EXPECT_DOUBLE_EQ(*f.models[0].hit_ratio_total, 0.75);
  EXPECT_FALSE(f.bytes_in_per_s.has_value());

  const std::string text = RenderTopText(Header(), f);
  EXPECT_THAT(text, HasSubstr("first sample: totals only; rates from the next frame on"));
  for (const char* section :
       {"\nRPCs ", "\nHit ratio ", "\nBytes ", "\nTiers\n", "\nMigrations ", "\nCompression\n"}) {
    EXPECT_THAT(text, HasSubstr(section));
  }
  const auto j = nlohmann::json::parse(RenderTopJson(Header(), f));
  EXPECT_TRUE(j["interval_seconds"].is_null());
  EXPECT_TRUE(j["rpcs"][0]["calls_per_second"].is_null());
  EXPECT_EQ(j["rpcs"][0]["calls"], 100);
}

TEST_F(TopViewTest, RatesFromDeltas) {
  const TopFrame f = BuildTopFrame(&first_, second_);
  ASSERT_TRUE(f.interval_s.has_value());
  EXPECT_DOUBLE_EQ(*f.interval_s, 2);
  ASSERT_EQ(f.rpcs.size(), 4u);
  const RpcRate& lookup = f.rpcs[0];  // busiest over the interval
  EXPECT_EQ(lookup.method, "Lookup");
  EXPECT_DOUBLE_EQ(*lookup.calls_per_s, 100);
  EXPECT_DOUBLE_EQ(*lookup.errors_per_s, 2);
  EXPECT_DOUBLE_EQ(*lookup.mean_latency_us, 50);
  EXPECT_EQ(f.rpcs[1].method, "Fetch");
  EXPECT_DOUBLE_EQ(*f.rpcs[1].calls_per_s, 10);
  EXPECT_DOUBLE_EQ(*f.rpcs[1].mean_latency_us, 1000);
  EXPECT_EQ(f.rpcs[2].method, "ShmFetchInto");  // absent before: counted from zero
  EXPECT_DOUBLE_EQ(*f.rpcs[2].calls_per_s, 1);
  const RpcRate& append = f.rpcs[3];
  EXPECT_DOUBLE_EQ(*append.calls_per_s, 0);
  EXPECT_FALSE(append.mean_latency_us.has_value());  // no calls: no mean
  EXPECT_DOUBLE_EQ(*f.calls_per_s, 111);
  EXPECT_DOUBLE_EQ(*f.errors_per_s, 2);
  EXPECT_DOUBLE_EQ(*f.bytes_in_per_s, 0);
  EXPECT_DOUBLE_EQ(*f.bytes_out_per_s, (4 << 20) / 2.0 + (2 << 20) / 2.0);

  EXPECT_DOUBLE_EQ(*f.hit_ratio, 0.75);
  EXPECT_DOUBLE_EQ(*f.models[0].hit_tokens_per_s, 150);
  EXPECT_DOUBLE_EQ(*f.models[0].miss_tokens_per_s, 50);
  EXPECT_DOUBLE_EQ(*f.capacity_evictions_per_s, 5);
  ASSERT_EQ(f.tiers.size(), 2u);
  EXPECT_DOUBLE_EQ(*f.tiers[1].demotions_per_s, 10);

  const std::string text = RenderTopText(Header(), f);
  EXPECT_THAT(text, HasSubstr("rates over the last 2.00s"));
  EXPECT_THAT(text, HasSubstr("RPCs  111 calls/s, 2.0 errors/s"));
  EXPECT_THAT(text, HasSubstr("Hit ratio  75.0%"));
  EXPECT_THAT(text, HasSubstr("Bytes  in 0 B/s (Append)  out 3.0 MiB/s (Fetch)"));
  EXPECT_THAT(text, HasSubstr("50 us"));
  EXPECT_THAT(text, HasSubstr("1.00 ms"));
  EXPECT_THAT(text, HasSubstr("[##########..........]"));  // host: 500 of 1000
  EXPECT_THAT(text, HasSubstr("quantize"));
  EXPECT_THAT(text, Not(HasSubstr("q: quit")));

  const auto j = nlohmann::json::parse(RenderTopJson(Header(), f));
  EXPECT_EQ(j["rpcs"][0]["method"], "Lookup");
  EXPECT_DOUBLE_EQ(j["rpcs"][0]["calls_per_second"].get<double>(), 100);
  EXPECT_DOUBLE_EQ(j["hit_ratio"].get<double>(), 0.75);
  EXPECT_DOUBLE_EQ(j["tiers"][0]["used_ratio"].get<double>(), 0.5);
  EXPECT_EQ(j["models"][0]["int4_entries"], 12);
  EXPECT_EQ(j["models"][0]["mode"], "quantize");
  EXPECT_EQ(j["active_leases"], 4);
}

TEST_F(TopViewTest, ACounterThatWentDownCountsFromZero) {
  // The daemon restarted between the polls: its counters started over.
  TopSample restarted;
  restarted.time = second_.time + absl::Seconds(1);
  AddRpc(restarted.stats, "Lookup", 7, 0, 0, 70);
  AddModel(restarted.stats, 10, 0);
  const TopFrame f = BuildTopFrame(&second_, restarted);
  EXPECT_DOUBLE_EQ(*f.rpcs[0].calls_per_s, 7);
  EXPECT_DOUBLE_EQ(*f.rpcs[0].mean_latency_us, 10);
  EXPECT_DOUBLE_EQ(*f.models[0].hit_tokens_per_s, 10);
  EXPECT_DOUBLE_EQ(*f.hit_ratio, 1);
}

TEST_F(TopViewTest, DaemonWithoutRpcCountersShowsADash) {
  first_.stats.clear_rpcs();
  second_.stats.clear_rpcs();
  const TopFrame f = BuildTopFrame(&first_, second_);
  EXPECT_FALSE(f.rpcs_reported);
  EXPECT_FALSE(f.calls_per_s.has_value());
  EXPECT_FALSE(f.bytes_in_per_s.has_value());
  EXPECT_TRUE(f.hit_ratio.has_value());  // from the models, not the RPCs
  const std::string text = RenderTopText(Header(), f);
  EXPECT_THAT(text, HasSubstr("RPCs  - calls/s, - errors/s\n-  (this kvcached reports no "
                              "per-method counters)"));
  EXPECT_THAT(text, HasSubstr("Bytes  in - (Append)  out - (Fetch)"));
  const auto j = nlohmann::json::parse(RenderTopJson(Header(), f));
  EXPECT_FALSE(j["rpcs_reported"].get<bool>());
  EXPECT_TRUE(j["bytes_in_per_second"].is_null());
}

TEST_F(TopViewTest, NoLookupsInTheIntervalLeavesTheRatioUnset) {
  TopSample later = first_;
  later.time += absl::Seconds(1);
  const TopFrame f = BuildTopFrame(&first_, later);
  EXPECT_FALSE(f.hit_ratio.has_value());
  EXPECT_FALSE(f.models[0].hit_ratio.has_value());
  EXPECT_DOUBLE_EQ(*f.models[0].hit_tokens_per_s, 0);
}

TEST(TopMethodsTest, InboundAndOutbound) {
  EXPECT_TRUE(IsInboundMethod("Append"));
  EXPECT_TRUE(IsInboundMethod("ShmAppendFrom"));
  EXPECT_FALSE(IsInboundMethod("Lookup"));
  EXPECT_TRUE(IsOutboundMethod("Fetch"));
  EXPECT_TRUE(IsOutboundMethod("FetchLease"));
  EXPECT_TRUE(IsOutboundMethod("ShmFetchInto"));
  EXPECT_FALSE(IsOutboundMethod("GetStats"));
}

}  // namespace
}  // namespace kvcache::ctl
