// LogEvent: one daemon log line that carries fields (request_id, model,
// code, ...) besides its message.
//
//   LogEvent(spdlog::level::info, "call failed",
//            {{"request_id", id}, {"method", "Lookup"}, {"code", "NOT_FOUND"}});
//
// The formatter the daemon installs (log_format.h) writes the fields as
// key=value pairs in "logfmt", as members of the line's object in "json", and
// after the message as `msg key=value ...` in "text". An event below the
// logger's level costs one comparison: nothing is encoded.
//
// How an event travels through spdlog: its payload is the message followed by
// each field as kFieldMark key (kStringMark | kLiteralMark) value. Those three
// marks are ASCII control characters that LogEvent replaces by '?' wherever
// they occur in a message, key or value, so a payload always splits the same
// way. A plain spdlog::info("...") line carries no mark and is a bare message.
//
// Thread-safe (spdlog's loggers are).
#ifndef KVCACHE_SERVER_LOGGING_LOG_EVENT_H_
#define KVCACHE_SERVER_LOGGING_LOG_EVENT_H_

#include <spdlog/spdlog.h>

#include <cstdint>
#include <initializer_list>
#include <string>
#include <string_view>
#include <type_traits>
#include <vector>

namespace kvcache {

// One key and its value. Strings are written quoted where a format needs it;
// numbers and booleans are literals (unquoted in JSON). A field only views
// its key and string value: they must outlive the LogEvent call (temporaries
// of the calling expression do). Numbers are rendered only when the event is
// logged.
class LogField {
 public:
  enum class Kind { kString, kSigned, kUnsigned, kDouble, kBool };

  LogField(std::string_view key, std::string_view value) : key_(key), text_(value) {}
  LogField(std::string_view key, const std::string& value) : key_(key), text_(value) {}
  LogField(std::string_view key, const char* value) : key_(key), text_(value) {}
  LogField(std::string_view key, bool value) : key_(key), kind_(Kind::kBool), u_(value) {}
  LogField(std::string_view key, double value) : key_(key), kind_(Kind::kDouble), d_(value) {}
  template <typename T,
            typename = std::enable_if_t<std::is_integral_v<T> && !std::is_same_v<T, bool>>>
  LogField(std::string_view key, T value) : key_(key) {
    if constexpr (std::is_signed_v<T>) {
      kind_ = Kind::kSigned;
      i_ = value;
    } else {
      kind_ = Kind::kUnsigned;
      u_ = value;
    }
  }

  std::string_view key() const { return key_; }
  // Appends the value as text; true when it is a literal (number, boolean).
  bool AppendValue(std::string* out) const;

 private:
  std::string_view key_;
  std::string_view text_;
  Kind kind_ = Kind::kString;
  union {
    int64_t i_;
    uint64_t u_ = 0;
    double d_;
  };
};

// Logs `message` with `fields` at `level` on `logger`.
void LogEvent(spdlog::logger& logger, spdlog::level::level_enum level, std::string_view message,
              std::initializer_list<LogField> fields);
void LogEvent(spdlog::logger& logger, spdlog::level::level_enum level, std::string_view message,
              const std::vector<LogField>& fields);
// The same on the daemon's default logger.
void LogEvent(spdlog::level::level_enum level, std::string_view message,
              std::initializer_list<LogField> fields);
void LogEvent(spdlog::level::level_enum level, std::string_view message,
              const std::vector<LogField>& fields);

// --- The payload encoding, shared with the formatter ---------------------------

// Until some formatter of log_format.h exists in the process (a program that
// links the RPC layer without setting up the daemon's logging: a benchmark, a
// test), LogEvent writes its fields as text, `msg key=value ...`, so spdlog's
// stock formatter shows them readably. NewLogFormatter calls this.
void UseEncodedLogEvents();

inline constexpr char kFieldMark = '\x1f';    // starts a field: key follows
inline constexpr char kStringMark = '\x1e';   // between key and a string value
inline constexpr char kLiteralMark = '\x1d';  // between key and a literal value

// The payload of an event: the message and its fields, marks replaced.
std::string EncodeLogEvent(std::string_view message, std::initializer_list<LogField> fields);
std::string EncodeLogEvent(std::string_view message, const std::vector<LogField>& fields);

// An event taken apart again; views into the payload.
struct DecodedField {
  std::string_view key;
  std::string_view value;
  bool literal = false;
};
struct DecodedLogEvent {
  std::string_view message;
  std::vector<DecodedField> fields;
};
// Any payload decodes: one without marks is a bare message.
DecodedLogEvent DecodeLogEvent(std::string_view payload);

}  // namespace kvcache

#endif  // KVCACHE_SERVER_LOGGING_LOG_EVENT_H_
