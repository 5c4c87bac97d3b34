// RpcObserver: how the RPC layer reports each finished call, so the metrics
// module can count it without the RPC layer linking a metrics library.
#ifndef KVCACHE_SERVER_FRONTDOOR_RPC_OBSERVER_H_
#define KVCACHE_SERVER_FRONTDOOR_RPC_OBSERVER_H_

#include <string_view>

#include "absl/status/status.h"
#include "absl/time/time.h"

namespace kvcache {

// Thread-safe: called concurrently from gRPC threads.
class RpcObserver {
 public:
  virtual ~RpcObserver() = default;
  // `method` is e.g. "Lookup"; `bytes` the payload bytes moved (Append, Fetch).
  virtual void OnRpcDone(std::string_view method, absl::StatusCode code, absl::Duration latency,
                         uint64_t bytes) = 0;
  // A stream of `method` ("Append", "Fetch") was cancelled for making no
  // progress for stream_idle_timeout_ms.
  virtual void OnStreamTimeout(std::string_view method) = 0;
  // A call of `method` was refused because `limit` (the setting's name, e.g.
  // "max_streams_per_client") was reached.
  virtual void OnLimitReached(std::string_view method, std::string_view limit) = 0;
};

// Ignores everything.
class NullRpcObserver final : public RpcObserver {
 public:
  void OnRpcDone(std::string_view, absl::StatusCode, absl::Duration, uint64_t) override {}
  void OnStreamTimeout(std::string_view) override {}
  void OnLimitReached(std::string_view, std::string_view) override {}
};

}  // namespace kvcache

#endif  // KVCACHE_SERVER_FRONTDOOR_RPC_OBSERVER_H_
