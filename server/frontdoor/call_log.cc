#include "server/frontdoor/call_log.h"

#include <spdlog/spdlog.h>

#include "absl/strings/str_cat.h"
#include "server/logging/log_event.h"

namespace kvcache {
namespace {

spdlog::level::level_enum LevelOf(absl::StatusCode code) {
  switch (code) {
    case absl::StatusCode::kOk:
      return spdlog::level::debug;
    case absl::StatusCode::kResourceExhausted:
    case absl::StatusCode::kDeadlineExceeded:
    case absl::StatusCode::kAborted:
    case absl::StatusCode::kUnavailable:
      return spdlog::level::warn;
    case absl::StatusCode::kInternal:
    case absl::StatusCode::kDataLoss:
    case absl::StatusCode::kUnknown:
    case absl::StatusCode::kUnimplemented:
      return spdlog::level::err;
    default:
      return spdlog::level::info;
  }
}

}  // namespace

std::string ModelField(const ModelRef& model) {
  if (model.model_id.empty()) return "";
  return absl::StrCat(model.ns.empty() ? "default" : std::string(model.ns), "/",
                      std::string(model.model_id));
}

bool ShouldLogCall(absl::StatusCode code) {
  return spdlog::default_logger_raw()->should_log(LevelOf(code));
}

void LogCallDone(const CallOutcome& call) {
  const spdlog::level::level_enum level = LevelOf(call.status.code());
  if (!spdlog::default_logger_raw()->should_log(level)) return;
  const std::string code = absl::StatusCodeToString(call.status.code());
  const double latency_ms = absl::ToDoubleMilliseconds(call.latency);
  std::vector<LogField> fields = {{"request_id", call.request_id},
                                  {"method", call.method},
                                  {"code", code},
                                  {"peer", call.peer}};
  if (!call.model.empty()) fields.emplace_back("model", call.model);
  fields.emplace_back("latency_ms", latency_ms);
  if (call.bytes != 0) fields.emplace_back("bytes", call.bytes);
  if (call.status.ok()) {
    LogEvent(level, "call done", fields);
  } else {
    const std::string message(call.status.message());
    fields.emplace_back("message", message);
    LogEvent(level, "call failed", fields);
  }
}

void ReportCallDone(RpcObserver* observer, const CallOutcome& call) {
  observer->OnRpcDone(call.method, call.status.code(), call.latency, call.bytes);
  LogCallDone(call);
}

}  // namespace kvcache
