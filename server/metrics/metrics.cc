#include "server/metrics/metrics.h"

#include <prometheus/collectable.h>
#include <prometheus/counter.h>
#include <prometheus/histogram.h>
#include <prometheus/registry.h>
#include <prometheus/text_serializer.h>

#include <limits>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "server/common/mutex.h"

namespace kvcache {
namespace {

using prometheus::ClientMetric;
using prometheus::MetricFamily;
using prometheus::MetricType;

std::string CodeName(absl::StatusCode code) {
  std::string name = absl::StatusCodeToString(code);
  return name.empty() ? absl::StrCat(static_cast<int>(code)) : name;
}

MetricFamily Family(std::string name, std::string help, MetricType type) {
  return MetricFamily{.name = std::move(name), .help = std::move(help), .type = type, .metric = {}};
}

// Turns visited samples into Prometheus families: one per name, in the order
// the names were first visited, its samples in the order they came.
class FamilyCollector final : public CounterVisitor {
 public:
  std::vector<MetricFamily> Take() && { return std::move(families_); }

 private:
  void OnSample(const CounterFamily& family, std::span<const CounterLabel> labels,
                double value) override {
    MetricFamily& f = FamilyFor(family);
    ClientMetric m;
    m.label.reserve(labels.size());
    for (const CounterLabel& l : labels) {
      m.label.push_back({.name = std::string(l.name), .value = std::string(l.value)});
    }
    if (f.type == MetricType::Counter) {
      m.counter.value = value;
    } else {
      m.gauge.value = value;
    }
    f.metric.push_back(std::move(m));
  }
  void OnDeclare(const CounterFamily& family) override { FamilyFor(family); }

  MetricFamily& FamilyFor(const CounterFamily& family) {
    // Debian's Abseil has its own string_view.
    const absl::string_view name(family.name.data(), family.name.size());
    auto it = index_.find(name);
    if (it == index_.end()) {
      it = index_.emplace(std::string(name), families_.size()).first;
      families_.push_back(
          Family(std::string(family.name), std::string(family.help),
                 family.type == CounterType::kCounter ? MetricType::Counter : MetricType::Gauge));
    }
    return families_[it->second];
  }

  std::vector<MetricFamily> families_;
  absl::flat_hash_map<std::string, size_t> index_;  // name -> families_ index
};

// The scores compaction computed, as a histogram with buckets 0.1 .. 1.0.
MetricFamily ScoreFamily(const ScoreHistogram& scores) {
  auto family =
      Family("kvcached_importance_score", "Importance scores of the tokens compaction decided on",
             MetricType::Histogram);
  ClientMetric h;
  uint64_t cumulative = 0;
  for (int b = 0; b < ScoreHistogram::kBuckets; ++b) {
    cumulative += scores.counts[b];
    ClientMetric::Bucket bucket;
    bucket.cumulative_count = cumulative;
    bucket.upper_bound =
        b + 1 < ScoreHistogram::kBuckets ? (b + 1) / 10.0 : std::numeric_limits<double>::infinity();
    h.histogram.bucket.push_back(bucket);
  }
  h.histogram.sample_count = scores.total;
  h.histogram.sample_sum = scores.sum;
  family.metric.push_back(std::move(h));
  return family;
}

// Reads a CacheStats snapshot at scrape time: every counter it visits, the
// score histogram, and the counters of the added sources.
class CacheCollector final : public prometheus::Collectable {
 public:
  explicit CacheCollector(Metrics::StatsSource source) : source_(std::move(source)) {}

  void AddSource(Metrics::CounterSource source) {
    MutexLock lock(&mu_);
    sources_.push_back(std::move(source));
  }

  std::vector<MetricFamily> Collect() const override {
    const CacheStats s = source_();
    FamilyCollector families;
    s.VisitCounters(absl::Now(), families);
    {
      MutexLock lock(&mu_);
      for (const Metrics::CounterSource& source : sources_) source(families);
    }
    std::vector<MetricFamily> out = std::move(families).Take();
    out.push_back(ScoreFamily(s.scores));
    return out;
  }

 private:
  Metrics::StatsSource source_;
  mutable Mutex mu_;
  std::vector<Metrics::CounterSource> sources_ ABSL_GUARDED_BY(mu_);
};

}  // namespace

struct Metrics::Impl {
  std::shared_ptr<prometheus::Registry> registry = std::make_shared<prometheus::Registry>();
  std::shared_ptr<CacheCollector> collector;
  std::unique_ptr<HttpServer> server;  // Start()'s own
  prometheus::Family<prometheus::Counter>* rpcs = nullptr;
  prometheus::Family<prometheus::Histogram>* latency = nullptr;
  prometheus::Family<prometheus::Counter>* payload = nullptr;
  prometheus::Family<prometheus::Counter>* timeouts = nullptr;
  prometheus::Family<prometheus::Counter>* limited = nullptr;
};

Metrics::Metrics(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Metrics::~Metrics() {
  // Start()'s server first: its requests render from the rest of Impl.
  if (impl_->server != nullptr) impl_->server->Stop();
}

std::unique_ptr<Metrics> Metrics::CreateUnexposed(StatsSource stats) {
  auto impl = std::make_unique<Impl>();
  impl->collector = std::make_shared<CacheCollector>(std::move(stats));
  impl->rpcs = &prometheus::BuildCounter()
                    .Name("kvcached_rpcs_total")
                    .Help("Finished RPCs by method and status code")
                    .Register(*impl->registry);
  impl->latency = &prometheus::BuildHistogram()
                       .Name("kvcached_rpc_latency_seconds")
                       .Help("RPC latency by method, from the first byte to the status")
                       .Register(*impl->registry);
  impl->payload = &prometheus::BuildCounter()
                       .Name("kvcached_rpc_payload_bytes_total")
                       .Help("KV payload bytes moved by Append and Fetch")
                       .Register(*impl->registry);
  impl->timeouts = &prometheus::BuildCounter()
                        .Name("kvcached_stream_timeouts_total")
                        .Help("Streams cancelled after stream_idle_timeout_ms without progress")
                        .Register(*impl->registry);
  impl->limited = &prometheus::BuildCounter()
                       .Name("kvcached_limit_rejections_total")
                       .Help("Calls refused with RESOURCE_EXHAUSTED by a concurrency limit")
                       .Register(*impl->registry);
  return std::unique_ptr<Metrics>(new Metrics(std::move(impl)));
}

absl::StatusOr<std::unique_ptr<Metrics>> Metrics::Start(const std::string& address,
                                                        StatsSource stats) {
  std::unique_ptr<Metrics> metrics = CreateUnexposed(std::move(stats));
  absl::StatusOr<std::unique_ptr<HttpServer>> server = HttpServer::Start({.address = address});
  if (!server.ok()) {
    return absl::Status(server.status().code(),
                        absl::StrCat("metrics endpoint: ", server.status().message()));
  }
  metrics->impl_->server = *std::move(server);
  metrics->ServeOn(*metrics->impl_->server);
  return metrics;
}

void Metrics::OnRpcDone(std::string_view method, absl::StatusCode code, absl::Duration latency,
                        uint64_t bytes) {
  const std::string m(method);
  impl_->rpcs->Add({{"method", m}, {"code", CodeName(code)}}).Increment();
  static const prometheus::Histogram::BucketBoundaries kBuckets = {
      0.00005, 0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01,
      0.025,   0.05,   0.1,     0.25,   0.5,   1,      2.5,   10};
  impl_->latency->Add({{"method", m}}, kBuckets).Observe(absl::ToDoubleSeconds(latency));
  if (bytes > 0) impl_->payload->Add({{"method", m}}).Increment(static_cast<double>(bytes));
}

void Metrics::OnStreamTimeout(std::string_view method) {
  impl_->timeouts->Add({{"method", std::string(method)}}).Increment();
}

void Metrics::AddCounterSource(CounterSource source) {
  impl_->collector->AddSource(std::move(source));
}

void Metrics::OnLimitReached(std::string_view method, std::string_view limit) {
  impl_->limited->Add({{"method", std::string(method)}, {"limit", std::string(limit)}}).Increment();
}

std::string Metrics::Render() const {
  std::vector<MetricFamily> families = impl_->registry->Collect();
  std::vector<MetricFamily> cache = impl_->collector->Collect();
  families.insert(families.end(), cache.begin(), cache.end());
  return prometheus::TextSerializer().Serialize(families);
}

void Metrics::ServeOn(HttpServer& server) const {
  server.Handle("/metrics", [this](const HttpRequest&) {
    return HttpResponse{.content_type = "text/plain; version=0.0.4", .body = Render()};
  });
}

int Metrics::port() const { return impl_->server == nullptr ? 0 : impl_->server->port(); }

}  // namespace kvcache
