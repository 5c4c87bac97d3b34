#include "server/logging/log_event.h"

#include <atomic>
#include <cstdio>

#include "server/logging/log_format.h"

namespace kvcache {
namespace {

bool IsMark(char c) { return c == kFieldMark || c == kStringMark || c == kLiteralMark; }

void AppendClean(std::string_view text, std::string* out) {
  for (char c : text) out->push_back(IsMark(c) ? '?' : c);
}

template <typename Fields>
std::string Encode(std::string_view message, const Fields& fields) {
  std::string out;
  out.reserve(message.size() + 32 * fields.size());
  AppendClean(message, &out);
  for (const LogField& f : fields) {
    out.push_back(kFieldMark);
    AppendClean(f.key(), &out);
    const size_t mark = out.size();
    out.push_back(kStringMark);
    if (f.AppendValue(&out)) out[mark] = kLiteralMark;
  }
  return out;
}

std::atomic<bool> encoded_events{false};

// The event as plain text: the message, then key=value with logfmt quoting.
template <typename Fields>
std::string AsText(std::string_view message, const Fields& fields) {
  std::string out(message);
  std::string value;
  for (const LogField& f : fields) {
    out.push_back(' ');
    out.append(f.key());
    out.push_back('=');
    value.clear();
    f.AppendValue(&value);
    AppendLogfmtValue(value, &out);
  }
  return out;
}

template <typename Fields>
void Log(spdlog::logger& logger, spdlog::level::level_enum level, std::string_view message,
         const Fields& fields) {
  if (!logger.should_log(level)) return;
  const std::string payload = encoded_events.load(std::memory_order_relaxed)
                                  ? Encode(message, fields)
                                  : AsText(message, fields);
  logger.log(level, spdlog::string_view_t(payload.data(), payload.size()));
}

}  // namespace

void UseEncodedLogEvents() { encoded_events.store(true, std::memory_order_relaxed); }

bool LogField::AppendValue(std::string* out) const {
  char buf[32];
  int n = 0;
  switch (kind_) {
    case Kind::kString:
      AppendClean(text_, out);
      return false;
    case Kind::kBool:
      out->append(u_ != 0 ? "true" : "false");
      return true;
    case Kind::kSigned:
      n = std::snprintf(buf, sizeof(buf), "%lld", static_cast<long long>(i_));
      break;
    case Kind::kUnsigned:
      n = std::snprintf(buf, sizeof(buf), "%llu", static_cast<unsigned long long>(u_));
      break;
    case Kind::kDouble:
      n = std::snprintf(buf, sizeof(buf), "%.6g", d_);
      break;
  }
  const std::string_view text(buf, n > 0 ? static_cast<size_t>(n) : 0);
  out->append(text);
  // JSON has no NaN or infinity: those go out as strings.
  return text.find_first_not_of("0123456789.-+e") == std::string_view::npos;
}

std::string EncodeLogEvent(std::string_view message, std::initializer_list<LogField> fields) {
  return Encode(message, fields);
}

std::string EncodeLogEvent(std::string_view message, const std::vector<LogField>& fields) {
  return Encode(message, fields);
}

DecodedLogEvent DecodeLogEvent(std::string_view payload) {
  DecodedLogEvent event;
  size_t at = payload.find(kFieldMark);
  event.message = payload.substr(0, at);
  while (at != std::string_view::npos) {
    const size_t start = at + 1;
    at = payload.find(kFieldMark, start);
    const std::string_view field =
        payload.substr(start, at == std::string_view::npos ? std::string_view::npos : at - start);
    const size_t mark = field.find_first_of(std::string_view("\x1e\x1d", 2));
    DecodedField f;
    if (mark == std::string_view::npos) {
      f.key = field;  // not written by LogEvent; keep what there is
    } else {
      f.key = field.substr(0, mark);
      f.value = field.substr(mark + 1);
      f.literal = field[mark] == kLiteralMark;
    }
    event.fields.push_back(f);
  }
  return event;
}

void LogEvent(spdlog::logger& logger, spdlog::level::level_enum level, std::string_view message,
              std::initializer_list<LogField> fields) {
  Log(logger, level, message, fields);
}

void LogEvent(spdlog::logger& logger, spdlog::level::level_enum level, std::string_view message,
              const std::vector<LogField>& fields) {
  Log(logger, level, message, fields);
}

void LogEvent(spdlog::level::level_enum level, std::string_view message,
              std::initializer_list<LogField> fields) {
  Log(*spdlog::default_logger_raw(), level, message, fields);
}

void LogEvent(spdlog::level::level_enum level, std::string_view message,
              const std::vector<LogField>& fields) {
  Log(*spdlog::default_logger_raw(), level, message, fields);
}

}  // namespace kvcache
