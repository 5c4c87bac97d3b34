// Metrics: the daemon's Prometheus endpoint. The only module that links
// prometheus-cpp.
//
// RPC counts, latency histograms and payload bytes arrive through the
// RpcObserver interface as calls finish; cache gauges and counters are read
// from a CacheStats snapshot at scrape time, so the core is never asked for
// numbers nobody reads. The snapshot reports them through a CounterVisitor
// (server/common/counter_visitor.h), which groups its samples into families by
// name: this module names no cache counter itself, only the importance score
// histogram. Names and labels are listed in docs/metrics.md.
//
// Served over HTTP by server/http: Start() runs a server of its own that
// serves /metrics alone; the daemon instead serves /metrics next to the status
// pages on one HttpServer (ServeOn).
//
// Thread-safe. The stats source must stay callable while a server serves it.
#ifndef KVCACHE_SERVER_METRICS_METRICS_H_
#define KVCACHE_SERVER_METRICS_METRICS_H_

#include <functional>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "server/common/counter_visitor.h"
#include "server/core/cache_stats.h"
#include "server/frontdoor/rpc_observer.h"
#include "server/http/http_server.h"

namespace kvcache {

class Metrics : public RpcObserver {
 public:
  using StatsSource = std::function<CacheStats()>;
  // Counters of a part of the daemon outside the cache (the shared-memory
  // plane's mappings), visited at scrape time like the cache's.
  using CounterSource = std::function<void(CounterVisitor&)>;

  // Serves /metrics on `address` ("host:port"; port 0 picks one, see port())
  // with an HttpServer of its own. UNAVAILABLE when it cannot bind.
  static absl::StatusOr<std::unique_ptr<Metrics>> Start(const std::string& address,
                                                        StatsSource stats);
  // Collects without serving (for tests and for a daemon with metrics off).
  static std::unique_ptr<Metrics> CreateUnexposed(StatsSource stats);
  ~Metrics() override;

  void OnRpcDone(std::string_view method, absl::StatusCode code, absl::Duration latency,
                 uint64_t bytes) override;
  void OnStreamTimeout(std::string_view method) override;
  void OnLimitReached(std::string_view method, std::string_view limit) override;

  // Adds `source` to every scrape from now on. REQUIRES: it stays callable
  // while this Metrics renders (capture what it reads by shared_ptr).
  void AddCounterSource(CounterSource source);

  // The exposition text a scrape would return now.
  std::string Render() const;
  // Serves Render() at /metrics on `server`, as Prometheus text (content type
  // "text/plain; version=0.0.4"). REQUIRES: this Metrics outlives the
  // server (or its Stop()).
  void ServeOn(HttpServer& server) const;
  // The port Start() bound (0 when unexposed or served by ServeOn alone).
  int port() const;

 private:
  struct Impl;
  explicit Metrics(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace kvcache

#endif  // KVCACHE_SERVER_METRICS_METRICS_H_
