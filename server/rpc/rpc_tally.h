// RpcTally: counts of the calls served, per method, for the Admin API
// (GetStatsResponse.rpcs, which kvcachectl top turns into rates). An
// RpcObserver that counts each finished call and passes every report on to
// the observer it wraps (the metrics), so the two never disagree.
//
// Thread-safe (a std::mutex wrapper TSan can see); cheap enough for every call
// (one short lock per report).
#ifndef KVCACHE_SERVER_RPC_RPC_TALLY_H_
#define KVCACHE_SERVER_RPC_RPC_TALLY_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/btree_map.h"
#include "server/common/mutex.h"
#include "server/frontdoor/rpc_observer.h"

namespace kvcache {

struct RpcCount {
  std::string method;
  uint64_t calls = 0;
  uint64_t errors = 0;  // finished with another code than OK
  uint64_t payload_bytes = 0;
  uint64_t latency_us_sum = 0;
};

class RpcTally final : public RpcObserver {
 public:
  // `next` (not owned, may be null) receives every report too; it must
  // outlive the tally.
  explicit RpcTally(RpcObserver* next) : next_(next) {}

  void OnRpcDone(std::string_view method, absl::StatusCode code, absl::Duration latency,
                 uint64_t bytes) override;
  void OnStreamTimeout(std::string_view method) override;
  void OnLimitReached(std::string_view method, std::string_view limit) override;

  // Every method reported so far, by name.
  std::vector<RpcCount> Counts() const;

 private:
  RpcObserver* const next_;
  mutable Mutex mu_;
  absl::btree_map<std::string, RpcCount, std::less<>> counts_ ABSL_GUARDED_BY(mu_);
};

}  // namespace kvcache

#endif  // KVCACHE_SERVER_RPC_RPC_TALLY_H_
