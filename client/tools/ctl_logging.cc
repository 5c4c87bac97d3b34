// kvcachectl log-level: reads or sets the daemon's log level at runtime.
#include <iostream>

#include "ctl_commands.h"

namespace kvcache::ctl {

int RunLogLevel(const Context& ctx, std::string_view level) {
  absl::StatusOr<v1::SetLogLevelResponse> resp = ctx.client->SetLogLevel(std::string(level));
  if (!resp.ok()) {
    *ctx.err << "kvcachectl: log-level: " << absl::StatusCodeToString(resp.status().code()) << ": "
             << resp.status().message() << '\n';
    return kExitError;
  }
  if (ctx.json) {
    *ctx.out << ToJson(*resp) << '\n';
    return kExitOk;
  }
  *ctx.out << "log level: " << resp->level();
  if (!level.empty() && resp->previous_level() != resp->level()) {
    *ctx.out << " (was " << resp->previous_level() << ")";
  }
  *ctx.out << '\n';
  return kExitOk;
}

}  // namespace kvcache::ctl
