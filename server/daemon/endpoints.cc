#include "server/daemon/endpoints.h"

#include <spdlog/spdlog.h>

#include <string>

#include "absl/strings/str_cat.h"
#include "server/daemon/config_translation.h"

namespace kvcache {

CheckpointCounters CheckpointCountersOf(const checkpoint::CheckpointServiceStatus& s) {
  CheckpointCounters c{.enabled = true,
                       .ok = s.ok,
                       .failed = s.failed,
                       .in_progress = s.in_progress,
                       .restore_state = std::string(checkpoint::RestoreStateName(s.restore.state)),
                       .restored_blocks = s.restore.restored_blocks,
                       .restore_skipped_blocks = s.restore.present_blocks +
                                                 s.restore.orphan_blocks + s.restore.lost_blocks +
                                                 s.restore.skipped_blocks,
                       .restore_failed_checkpoints = s.restore.failed_checkpoints,
                       .reattached_copies = s.restore.reattached_copies,
                       .reattach_failures = s.restore.reattach_failures};
  c.started_unix_seconds = absl::ToDoubleSeconds(s.started - absl::UnixEpoch());
  if (s.last.has_value()) {
    c.last_success_unix_seconds = absl::ToDoubleSeconds(s.last_time - absl::UnixEpoch());
    c.last_duration_seconds = absl::ToDoubleSeconds(s.last->duration);
    c.last_bytes = s.last->data_bytes;
  }
  return c;
}

std::shared_ptr<EventLog> AttachEventLog(const v1::StatusPageConfig& c) {
  auto events = std::make_shared<EventLog>(c.recent_events());
  spdlog::default_logger()->sinks().push_back(NewEventLogSink(events));
  return events;
}

absl::StatusOr<std::unique_ptr<HttpServer>> StartHttpEndpoint(
    const v1::ServerConfig& config, const Metrics& metrics, AccessControl* access,
    std::shared_ptr<const StatusSource> status) {
  const std::string address = Enabled(config.listen().metrics_address());
  if (address.empty()) return nullptr;
  absl::StatusOr<std::unique_ptr<HttpServer>> server = HttpServer::Start({.address = address});
  if (!server.ok()) {
    return absl::Status(server.status().code(),
                        absl::StrCat("listen.metrics_address: ", server.status().message()));
  }
  metrics.ServeOn(**server);
  spdlog::info("metrics on http://{}/metrics", address);
  if (config.status_page().enabled()) {
    StatusPageOptions options{.show_tokens = config.status_page().show_tokens()};
    if (access != nullptr && access->enabled()) {
      // Per-tenant detail for admins of every namespace only (docs/security.md).
      options.may_see_detail = [access](const HttpRequest& request) {
        return access->Admit(CredentialsOfAuthorization(request.authorization), "StatusPageDetail")
            .ok();
      };
    }
    ServeStatusPages(**server, std::move(status), std::move(options));
    spdlog::info("status page on http://{}/status{}{}", address,
                 config.status_page().show_tokens() ? " (showing token ids)" : "",
                 access != nullptr && access->enabled()
                     ? " (per-tenant detail for admins' bearer tokens only)"
                     : "");
  }
  return server;
}

}  // namespace kvcache
