// Request ids and the log line of each finished call.
//
// Every call has a request id: over gRPC the client's `x-request-id` metadata
// (the C++ client sends one on every call; server/rpc/grpc_call.h reads it), or
// one the daemon makes up when it sent none. The daemon echoes it in the
// trailing metadata `x-request-id` and writes it in the call's log line, so a
// client's error names the line that explains it. The shared-memory data
// plane carries no metadata: its calls get an id from the daemon, which their
// error messages name.
//
// One event per finished call (LogCallDone): a failed call at info (the
// caller's mistake: INVALID_ARGUMENT, NOT_FOUND, CANCELLED, ...), warn
// (RESOURCE_EXHAUSTED, DEADLINE_EXCEEDED, ABORTED, UNAVAILABLE) or error
// (INTERNAL, DATA_LOSS, UNKNOWN, UNIMPLEMENTED); a call that succeeded at
// debug. docs/logging.md lists the fields.
//
// Thread-safe.
#ifndef KVCACHE_SERVER_FRONTDOOR_CALL_LOG_H_
#define KVCACHE_SERVER_FRONTDOOR_CALL_LOG_H_

#include <cstdint>
#include <string>
#include <string_view>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "kvcache/request_id.h"  // kRequestIdHeader, NewRequestId
#include "server/frontdoor/rpc_observer.h"

namespace kvcache {

// The longest client id kept; a longer one is cut to this.
inline constexpr size_t kMaxRequestIdBytes = 128;

// A model as a request names it.
struct ModelRef {
  std::string_view ns;
  std::string_view model_id;
};
// "ns/model_id" as the cache names a model ("default" for an empty
// namespace); empty when model_id is.
std::string ModelField(const ModelRef& model);

struct CallOutcome {
  std::string_view method;  // "Lookup", "Fetch", "ShmFetchInto", ...
  std::string_view request_id;
  std::string_view peer;
  std::string_view model;  // empty: not known (not parsed, or no model)
  absl::Status status;
  absl::Duration latency;
  uint64_t bytes = 0;  // payload bytes moved
};

// Whether a call ending with `code` is logged at the level in effect: the
// caller may skip computing the peer when not.
bool ShouldLogCall(absl::StatusCode code);
// Logs the call's event (see above).
void LogCallDone(const CallOutcome& call);
// Reports the call to `observer` (metrics, per-method counts) and logs it: how
// a streaming call ends.
void ReportCallDone(RpcObserver* observer, const CallOutcome& call);

}  // namespace kvcache

#endif  // KVCACHE_SERVER_FRONTDOOR_CALL_LOG_H_
