// The daemon's logging: its format and level at start-up (logging.format,
// logging.level) and the level at runtime (Admin SetLogLevel).
//
// Every logger the daemon registers with spdlog follows the runtime level,
// except the migration log (kMigrationLoggerName), a record of tier moves in
// its own file that keeps its format and level.
//
// Thread-safe, except SetUpLogging, which runs once at start-up before other
// threads log.
#ifndef KVCACHE_SERVER_LOGGING_LOGGING_H_
#define KVCACHE_SERVER_LOGGING_LOGGING_H_

#include <spdlog/common.h>

#include <optional>
#include <string>
#include <string_view>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "kvcache/v1/config.pb.h"

namespace kvcache {

inline constexpr char kMigrationLoggerName[] = "migration";
// The levels ChangeLogLevel accepts, as an error message names them.
inline constexpr char kLogLevelNames[] = "trace, debug, info, warn, error, critical or off";

// "trace", "debug", "info", "warn", "error", "critical", "off".
std::string_view LogLevelName(spdlog::level::level_enum level);
// The inverse of LogLevelName; nullopt for any other name.
std::optional<spdlog::level::level_enum> ParseLogLevel(std::string_view name);

// Installs config.format's formatter on every logger (and those created
// later) and sets config.level. INVALID_ARGUMENT for an unknown format or
// level (ValidateConfig refuses them first).
absl::Status SetUpLogging(const v1::LoggingConfig& config);

struct LogLevelChange {
  std::string level;           // in effect now
  std::string previous_level;  // before the call
};
// The daemon's level now (the default logger's).
std::string CurrentLogLevel();
// Sets the level of every daemon logger but the migration log; empty `level`
// only reads it. INVALID_ARGUMENT naming the accepted levels for another name.
absl::StatusOr<LogLevelChange> ChangeLogLevel(std::string_view level);

}  // namespace kvcache

#endif  // KVCACHE_SERVER_LOGGING_LOGGING_H_
