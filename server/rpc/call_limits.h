// Admission limits of the RPC layer: how many streams in all and per client,
// and how many large unary calls, the daemon serves at once.
//
// StreamLimiter admits an Append or Fetch stream when fewer than
// max_concurrent_streams streams are in flight and fewer than
// max_streams_per_client of them come from the same peer. The peer is the
// string gRPC reports (ServerContext::peer()): "ipv4:10.0.0.7:41234" for a
// TCP connection, and "fd:N" for a Unix-socket connection kvcached accepted
// itself (UnixAcceptor), so on either a client is one connection (one
// kvcache::Client).
//
// UnaryLimiter admits a unary call when fewer than max_concurrent_unary are
// in flight.
//
// Refusals are RESOURCE_EXHAUSTED naming the setting. Both are thread-safe.
#ifndef KVCACHE_SERVER_RPC_CALL_LIMITS_H_
#define KVCACHE_SERVER_RPC_CALL_LIMITS_H_

#include <atomic>
#include <cstdint>
#include <string>
#include <string_view>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "server/common/mutex.h"

namespace kvcache {

class StreamLimiter {
 public:
  // REQUIRES: max_total >= 1, max_per_client >= 1.
  StreamLimiter(uint32_t max_total, uint32_t max_per_client);

  // Takes a slot for a stream of `peer`; RESOURCE_EXHAUSTED (nothing taken)
  // naming max_concurrent_streams or max_streams_per_client, which is also
  // stored in `*limit` when `limit` is not null.
  absl::Status Acquire(std::string_view peer, std::string_view* limit = nullptr);
  // Gives back a slot Acquire(peer) took.
  void Release(std::string_view peer);

  int active() const;
  int active(std::string_view peer) const;

 private:
  const uint32_t max_total_;
  const uint32_t max_per_client_;
  mutable Mutex mu_;
  uint32_t total_ ABSL_GUARDED_BY(mu_) = 0;
  // Only peers with streams.
  absl::flat_hash_map<std::string, uint32_t> per_peer_ ABSL_GUARDED_BY(mu_);
};

class UnaryLimiter {
 public:
  // REQUIRES: max_in_flight >= 1.
  explicit UnaryLimiter(uint32_t max_in_flight) : max_(max_in_flight) {}

  // Takes a slot; RESOURCE_EXHAUSTED naming max_concurrent_unary when none is free.
  absl::Status Acquire();
  void Release() { in_flight_.fetch_sub(1); }

  int in_flight() const { return in_flight_.load(); }

 private:
  const uint32_t max_;
  std::atomic<int> in_flight_{0};
};

}  // namespace kvcache

#endif  // KVCACHE_SERVER_RPC_CALL_LIMITS_H_
