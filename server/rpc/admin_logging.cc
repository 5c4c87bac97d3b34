// AdminService: the log level at runtime (SetLogLevel; docs/logging.md).
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "server/frontdoor/call_log.h"
#include "server/logging/log_event.h"
#include "server/logging/logging.h"
#include "server/rpc/admin_service.h"
#include "server/rpc/grpc_call.h"

namespace kvcache {

grpc::ServerUnaryReactor* AdminService::SetLogLevel(grpc::CallbackServerContext* ctx,
                                                    const v1::SetLogLevelRequest* request,
                                                    v1::SetLogLevelResponse* response) {
  const absl::Time start = absl::Now();
  absl::StatusOr<Caller> caller = AdmitCall(access_, *ctx, "SetLogLevel");
  if (!caller.ok()) return FinishWith(ctx, "SetLogLevel", start, caller.status());
  const std::string& wanted = request->level();
  absl::Status status = [&]() -> absl::Status {
    if (!wanted.empty() && !ParseLogLevel(wanted).has_value()) {
      return absl::InvalidArgumentError(
          absl::StrCat("level is \"", wanted, "\"; it must be ", kLogLevelNames));
    }
    // The change is logged at warn: before it when the new level would hide
    // that line, after it otherwise, so it is always written.
    // The client's id; one the daemon makes up for a call without one would
    // differ from the one FinishWith echoes, so such a change names none.
    const bool has_id = ctx->client_metadata().count(kRequestIdHeader) != 0;
    const std::string request_id = has_id ? RequestIdOf(*ctx) : "";
    const std::string peer = ctx->peer();
    const std::string before = CurrentLogLevel();
    const auto log_change = [&] {
      if (wanted.empty() || wanted == before) return;
      LogEvent(spdlog::level::warn, "log level changed",
               {{"level", wanted},
                {"previous_level", before},
                {"request_id", request_id},
                {"peer", peer}});
    };
    const bool hides_warn = !wanted.empty() && *ParseLogLevel(wanted) > spdlog::level::warn;
    if (hides_warn) log_change();
    absl::StatusOr<LogLevelChange> change = ChangeLogLevel(wanted);
    if (!change.ok()) return change.status();
    if (!hides_warn) log_change();
    response->set_level(change->level);
    response->set_previous_level(change->previous_level);
    return absl::OkStatus();
  }();
  return FinishWith(ctx, "SetLogLevel", start, status);
}

}  // namespace kvcache
