// The daemon's log line formats (logging.format): how spdlog writes a line.
//
//   text    [2026-12-03 18:52:11.123] [info] append refused request_id=5f3a... code=NOT_FOUND
//           (spdlog's default pattern, local time; an event's fields follow its
//           message as key=value)
//   logfmt  ts=2026-12-03T18:52:11.123Z level=info msg="append refused" request_id=5f3a...
//   json    {"ts":"2026-12-03T18:52:11.123Z","level":"info","msg":"append refused",...}
//
// logfmt and json write UTC time with milliseconds, one event per line: quotes,
// backslashes, newlines and other control characters in a message or value
// are escaped (\" \\ \n \r \t, \u00XX), and bytes that are not valid UTF-8
// become \ufffd, so every json line parses. Field keys keep [A-Za-z0-9_.-];
// any other character becomes '_', and a field named ts, level, msg or logger
// is written with a leading '_'. docs/logging.md shows each format.
//
// A formatter is used by one sink, which serializes its calls (spdlog's _mt
// sinks hold their mutex while formatting).
#ifndef KVCACHE_SERVER_LOGGING_LOG_FORMAT_H_
#define KVCACHE_SERVER_LOGGING_LOG_FORMAT_H_

#include <spdlog/formatter.h>

#include <memory>
#include <optional>
#include <string>
#include <string_view>

namespace kvcache {

enum class LogFormat { kText, kLogfmt, kJson };

// "text", "logfmt" or "json"; nullopt for anything else.
std::optional<LogFormat> ParseLogFormat(std::string_view name);
std::string_view LogFormatName(LogFormat format);

// A formatter writing `format`. The text format wraps spdlog's default
// pattern formatter.
std::unique_ptr<spdlog::formatter> NewLogFormatter(LogFormat format);

// A log_msg payload as the text format writes its message: an event as
// `msg key=value ...`, a plain message unchanged. For a sink that shows
// payloads without a formatter (the status page's recent events).
std::string LogPayloadAsText(std::string_view payload);

// The escaping above, appended to `out` (no surrounding quotes): for json
// strings, and for logfmt's quoted values.
void AppendEscaped(std::string_view text, std::string* out);
// A logfmt value: bare when it needs no quoting, else quoted and escaped.
void AppendLogfmtValue(std::string_view value, std::string* out);

}  // namespace kvcache

#endif  // KVCACHE_SERVER_LOGGING_LOG_FORMAT_H_
