#include "server/logging/logging.h"

#include <spdlog/spdlog.h>

#include "absl/strings/str_cat.h"
#include "server/common/mutex.h"
#include "server/logging/log_format.h"

namespace kvcache {
namespace {

// Serializes level changes, so previous_level is the level each call replaced.
// What it guards is spdlog's state, not a field of ours: nothing here is
// ABSL_GUARDED_BY it.
Mutex& LevelMutex() {
  static Mutex mu;
  return mu;
}

}  // namespace

std::string_view LogLevelName(spdlog::level::level_enum level) {
  switch (level) {
    case spdlog::level::trace:
      return "trace";
    case spdlog::level::debug:
      return "debug";
    case spdlog::level::info:
      return "info";
    case spdlog::level::warn:
      return "warn";
    case spdlog::level::err:
      return "error";
    case spdlog::level::critical:
      return "critical";
    default:
      return "off";
  }
}

std::optional<spdlog::level::level_enum> ParseLogLevel(std::string_view name) {
  for (int l = spdlog::level::trace; l <= spdlog::level::off; ++l) {
    const auto level = static_cast<spdlog::level::level_enum>(l);
    if (LogLevelName(level) == name) return level;
  }
  return std::nullopt;
}

absl::Status SetUpLogging(const v1::LoggingConfig& config) {
  const std::string& format_name = config.format().empty() ? "text" : config.format();
  const std::optional<LogFormat> format = ParseLogFormat(format_name);
  if (!format.has_value()) {
    return absl::InvalidArgumentError(
        absl::StrCat("logging.format is \"", format_name, "\"; it must be text, logfmt or json"));
  }
  const std::string& level_name = config.level().empty() ? "info" : config.level();
  const std::optional<spdlog::level::level_enum> level = ParseLogLevel(level_name);
  if (!level.has_value()) {
    return absl::InvalidArgumentError(
        absl::StrCat("logging.level is \"", level_name, "\"; it must be ", kLogLevelNames));
  }
  spdlog::set_formatter(NewLogFormatter(*format));
  spdlog::set_level(*level);
  return absl::OkStatus();
}

std::string CurrentLogLevel() {
  return std::string(LogLevelName(spdlog::default_logger()->level()));
}

absl::StatusOr<LogLevelChange> ChangeLogLevel(std::string_view name) {
  MutexLock lock(&LevelMutex());
  LogLevelChange change;
  change.previous_level = CurrentLogLevel();
  if (name.empty()) {
    change.level = change.previous_level;
    return change;
  }
  const std::optional<spdlog::level::level_enum> level = ParseLogLevel(name);
  if (!level.has_value()) {
    return absl::InvalidArgumentError(
        absl::StrCat("level is \"", std::string(name), "\"; it must be ", kLogLevelNames));
  }
  spdlog::apply_all([&](const std::shared_ptr<spdlog::logger>& logger) {
    if (logger->name() != kMigrationLoggerName) logger->set_level(*level);
  });
  spdlog::default_logger()->set_level(*level);  // also when it is not registered
  change.level = std::string(LogLevelName(*level));
  return change;
}

}  // namespace kvcache
