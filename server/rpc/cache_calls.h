// Cache calls shared by the daemon's two front doors (the gRPC service and
// the shared-memory data plane): a request message in, the cache's answer as
// a response message out. No cache logic; the Cache decides.
#ifndef KVCACHE_SERVER_RPC_CACHE_CALLS_H_
#define KVCACHE_SERVER_RPC_CACHE_CALLS_H_

#include "absl/status/status.h"
#include "kvcache/v1/kvcache.pb.h"
#include "server/core/cache.h"
#include "server/security/caller.h"

namespace kvcache {

// Most lookups in one BatchLookup; more is INVALID_ARGUMENT.
inline constexpr int kMaxBatchLookups = 4096;
// Longest LookupRequest.prefetch_timeout_ms.
inline constexpr uint32_t kMaxPrefetchTimeoutMs = 60000;

// Each call acts for `caller`, in the namespace its request names as the
// caller may use it (Caller::NamespaceOf): PERMISSION_DENIED otherwise.

// Answers `request` as Lookup does.
absl::Status RunLookup(Cache& cache, const Caller& caller, const v1::LookupRequest& request,
                       v1::LookupResponse* response);

// Answers every lookup of `request`, each with its own outcome.
// INVALID_ARGUMENT (and nothing looked up) past kMaxBatchLookups.
absl::Status RunBatchLookup(Cache& cache, const Caller& caller,
                            const v1::BatchLookupRequest& request,
                            v1::BatchLookupResponse* response);

// Answers `request` as PlaceOnDevice does.
absl::Status RunPlaceOnDevice(Cache& cache, const Caller& caller,
                              const v1::PlaceOnDeviceRequest& request,
                              v1::PlaceOnDeviceResponse* response);

v1::AppendResponse ToProto(const AppendResult& result);

}  // namespace kvcache

#endif  // KVCACHE_SERVER_RPC_CACHE_CALLS_H_
