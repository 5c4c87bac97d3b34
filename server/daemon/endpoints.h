// What kvcached shows operators besides gRPC: the read-only HTTP endpoint
// (/metrics and the status pages, docs/metrics.md and docs/operations.md), the
// status page's event log and the checkpoint counters both report.
#ifndef KVCACHE_SERVER_DAEMON_ENDPOINTS_H_
#define KVCACHE_SERVER_DAEMON_ENDPOINTS_H_

#include <memory>

#include "absl/status/statusor.h"
#include "kvcache/v1/config.pb.h"
#include "server/checkpoint/checkpoint_service.h"
#include "server/core/cache_stats.h"
#include "server/http/http_server.h"
#include "server/metrics/metrics.h"
#include "server/security/access_control.h"
#include "server/status/event_log.h"
#include "server/status/status_page.h"

namespace kvcache {

// The checkpoint service's state as the cache's counters report it.
CheckpointCounters CheckpointCountersOf(const checkpoint::CheckpointServiceStatus& s);

// The status page's event log, fed the default logger's warnings and errors
// from now on (and the tier moves, by the migrator). Called before any thread
// that logs has started: a logger's sinks are not guarded.
std::shared_ptr<EventLog> AttachEventLog(const v1::StatusPageConfig& c);

// The read-only HTTP endpoint on listen.metrics_address: /metrics and, with
// status_page.enabled, the status pages (per-tenant detail only for admins of
// every namespace when `access` is on). Null when the address is "none".
absl::StatusOr<std::unique_ptr<HttpServer>> StartHttpEndpoint(
    const v1::ServerConfig& config, const Metrics& metrics, AccessControl* access,
    std::shared_ptr<const StatusSource> status);

}  // namespace kvcache

#endif  // KVCACHE_SERVER_DAEMON_ENDPOINTS_H_
