// Cache calls shared by the daemon's two front doors (the gRPC service and
// the shared-memory data plane): a request message in, the cache's answer as
// a response message out. No cache logic; the Cache decides.
#ifndef KVCACHE_SERVER_FRONTDOOR_CACHE_CALLS_H_
#define KVCACHE_SERVER_FRONTDOOR_CACHE_CALLS_H_

#include <memory>
#include <span>
#include <vector>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "kvcache/v1/kvcache.pb.h"
#include "server/core/cache.h"
#include "server/frontdoor/shared_tier.h"
#include "server/security/caller.h"

namespace kvcache {

// Most lookups in one BatchLookup; more is INVALID_ARGUMENT.
inline constexpr int kMaxBatchLookups = 4096;
// Longest LookupRequest.prefetch_timeout_ms.
inline constexpr uint32_t kMaxPrefetchTimeoutMs = 60000;

// Each call acts for `caller`, in the namespace its request names as the
// caller may use it (Caller::NamespaceOf): PERMISSION_DENIED otherwise.
// `shared`, when not null, is the tier shared with other daemons: a lookup
// whose match is short tells it (SharedTier::Missed), and a PREFETCH_WAIT
// lookup waits for what it finds before it answers.

// How a lookup's PREFETCH_WAIT is honoured.
enum class PrefetchWait : uint8_t {
  kBlock,    // wait here, on the calling thread (a shared-memory session's own)
  kStarted,  // the caller started the prefetches and waited without a thread
};

// Answers `request` as Lookup does.
absl::Status RunLookup(Cache& cache, SharedTier* shared, const Caller& caller,
                       const v1::LookupRequest& request, v1::LookupResponse* response,
                       PrefetchWait wait = PrefetchWait::kBlock);

// Answers every lookup of `request`, each with its own outcome.
// INVALID_ARGUMENT (and nothing looked up) past kMaxBatchLookups.
absl::Status RunBatchLookup(Cache& cache, SharedTier* shared, const Caller& caller,
                            const v1::BatchLookupRequest& request,
                            v1::BatchLookupResponse* response,
                            PrefetchWait wait = PrefetchWait::kBlock);

// Starts the read-back each PREFETCH_WAIT lookup of `lookups` asks for
// (those the caller may make and whose timeout is valid; the others are
// answered by RunLookup as usual), and the shared tier's search for it, and
// returns the tickets to wait on and
// the longest timeout they asked for (zero: one asked to wait without a
// deadline).
struct StartedPrefetches {
  std::vector<std::shared_ptr<WorkTicket>> tickets;
  absl::Duration timeout = absl::ZeroDuration();
};
StartedPrefetches StartWaitedPrefetches(Cache& cache, SharedTier* shared, const Caller& caller,
                                        std::span<const v1::LookupRequest* const> lookups);

// Answers `request` as PlaceOnDevice does.
absl::Status RunPlaceOnDevice(Cache& cache, const Caller& caller,
                              const v1::PlaceOnDeviceRequest& request,
                              v1::PlaceOnDeviceResponse* response);

v1::AppendResponse ToProto(const AppendResult& result);

}  // namespace kvcache

#endif  // KVCACHE_SERVER_FRONTDOOR_CACHE_CALLS_H_
