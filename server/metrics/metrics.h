// Metrics: the daemon's Prometheus endpoint. The only module that links
// prometheus-cpp.
//
// RPC counts, latency histograms and payload bytes arrive through the
// RpcObserver interface as calls finish; cache gauges and counters are read
// from a CacheStats snapshot at scrape time, so the core is never asked for
// numbers nobody reads. The snapshot reports them through a CounterVisitor
// (server/core/counter_visitor.h), which groups its samples into families by
// name: this module names no cache counter itself, only the importance score
// histogram. Names and labels are listed in docs/metrics.md.
//
// Thread-safe. The stats source must stay callable while the exposer runs.
#ifndef KVCACHE_SERVER_METRICS_METRICS_H_
#define KVCACHE_SERVER_METRICS_METRICS_H_

#include <functional>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "server/core/cache_stats.h"
#include "server/rpc/rpc_observer.h"

namespace kvcache {

class Metrics : public RpcObserver {
 public:
  using StatsSource = std::function<CacheStats()>;

  // Serves /metrics on `address` ("host:port"). UNAVAILABLE when it cannot bind.
  static absl::StatusOr<std::unique_ptr<Metrics>> Start(const std::string& address,
                                                        StatsSource stats);
  // Collects without serving (for tests and for a daemon with metrics off).
  static std::unique_ptr<Metrics> CreateUnexposed(StatsSource stats);
  ~Metrics() override;

  void OnRpcDone(std::string_view method, absl::StatusCode code, absl::Duration latency,
                 uint64_t bytes) override;
  void OnStreamTimeout(std::string_view method) override;
  void OnLimitReached(std::string_view method, std::string_view limit) override;

  // The exposition text a scrape would return now.
  std::string Render() const;
  // The port the exposer bound (0 when unexposed).
  int port() const;

 private:
  struct Impl;
  explicit Metrics(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace kvcache

#endif  // KVCACHE_SERVER_METRICS_METRICS_H_
