#include "server/logging/log_format.h"

#include <spdlog/pattern_formatter.h>
#include <time.h>

#include <chrono>
#include <cstdio>

#include "server/logging/log_event.h"
#include "server/logging/logging.h"

namespace kvcache {
namespace {

constexpr char kHex[] = "0123456789abcdef";

// The length of the valid UTF-8 sequence starting at text[i], or 0.
size_t Utf8Length(std::string_view text, size_t i) {
  const auto byte = [&](size_t k) { return static_cast<unsigned char>(text[k]); };
  const unsigned char lead = byte(i);
  size_t n = 0;
  unsigned char low = 0x80, high = 0xBF;  // the second byte's range
  if (lead >= 0xC2 && lead <= 0xDF) {
    n = 2;
  } else if (lead >= 0xE0 && lead <= 0xEF) {
    n = 3;
    if (lead == 0xE0) low = 0xA0;   // no overlong forms
    if (lead == 0xED) high = 0x9F;  // no surrogates
  } else if (lead >= 0xF0 && lead <= 0xF4) {
    n = 4;
    if (lead == 0xF0) low = 0x90;
    if (lead == 0xF4) high = 0x8F;  // at most U+10FFFF
  } else {
    return 0;
  }
  if (i + n > text.size()) return 0;
  if (byte(i + 1) < low || byte(i + 1) > high) return 0;
  for (size_t k = 2; k < n; ++k) {
    if (byte(i + k) < 0x80 || byte(i + k) > 0xBF) return 0;
  }
  return n;
}

bool NeedsLogfmtQuotes(std::string_view value) {
  if (value.empty()) return true;
  for (char ch : value) {
    const auto c = static_cast<unsigned char>(ch);
    if (c <= ' ' || c == '=' || c == '"' || c == '\\' || c >= 0x7f) return true;
  }
  return false;
}

// A field key as written: [A-Za-z0-9_.-], reserved names prefixed.
void AppendKey(std::string_view key, std::string* out) {
  if (key.empty() || key == "ts" || key == "level" || key == "msg" || key == "logger") {
    out->push_back('_');
  }
  for (char c : key) {
    const bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
                    c == '_' || c == '.' || c == '-';
    out->push_back(ok ? c : '_');
  }
}

class StructuredFormatter final : public spdlog::formatter {
 public:
  explicit StructuredFormatter(LogFormat format)
      : format_(format), text_(std::make_unique<spdlog::pattern_formatter>()) {}

  void format(const spdlog::details::log_msg& msg, spdlog::memory_buf_t& dest) override {
    const std::string_view payload(msg.payload.data(), msg.payload.size());
    if (format_ == LogFormat::kText) return FormatText(msg, payload, dest);
    const DecodedLogEvent event = DecodeLogEvent(payload);
    line_.clear();
    const bool json = format_ == LogFormat::kJson;
    line_.append(json ? "{\"ts\":\"" : "ts=");
    AppendTime(msg.time);
    line_.append(json ? "\",\"level\":\"" : " level=");
    line_.append(LogLevelName(msg.level));
    line_.append(json ? "\",\"msg\":\"" : " msg=\"");
    AppendEscaped(event.message, &line_);
    line_.push_back('"');
    const std::string_view logger(msg.logger_name.data(), msg.logger_name.size());
    if (!logger.empty()) {
      line_.append(json ? ",\"logger\":" : " logger=");
      if (json) {
        line_.push_back('"');
        AppendEscaped(logger, &line_);
        line_.push_back('"');
      } else {
        AppendLogfmtValue(logger, &line_);
      }
    }
    for (const DecodedField& f : event.fields) {
      if (json) {
        line_.append(",\"");
        AppendKey(f.key, &line_);
        line_.append("\":");
        if (f.literal) {
          line_.append(f.value);
        } else {
          line_.push_back('"');
          AppendEscaped(f.value, &line_);
          line_.push_back('"');
        }
      } else {
        line_.push_back(' ');
        AppendKey(f.key, &line_);
        line_.push_back('=');
        AppendLogfmtValue(f.value, &line_);
      }
    }
    if (json) line_.push_back('}');
    line_.push_back('\n');
    dest.append(line_.data(), line_.data() + line_.size());
  }

  std::unique_ptr<spdlog::formatter> clone() const override {
    return std::make_unique<StructuredFormatter>(format_);
  }

 private:
  // spdlog's line, with an event's fields written after its message.
  void FormatText(const spdlog::details::log_msg& msg, std::string_view payload,
                  spdlog::memory_buf_t& dest) {
    if (payload.find(kFieldMark) == std::string_view::npos) return text_->format(msg, dest);
    line_ = LogPayloadAsText(payload);
    spdlog::details::log_msg rewritten = msg;
    rewritten.payload = spdlog::string_view_t(line_.data(), line_.size());
    text_->format(rewritten, dest);
    msg.color_range_start = rewritten.color_range_start;
    msg.color_range_end = rewritten.color_range_end;
  }

  // 2026-12-03T18:52:11.123Z; the part up to the seconds is kept per second.
  void AppendTime(spdlog::log_clock::time_point time) {
    const auto since_epoch = time.time_since_epoch();
    const auto seconds = std::chrono::duration_cast<std::chrono::seconds>(since_epoch);
    const auto millis =
        std::chrono::duration_cast<std::chrono::milliseconds>(since_epoch - seconds).count();
    if (seconds.count() != cached_second_) {
      const time_t t = static_cast<time_t>(seconds.count());
      tm utc{};
      gmtime_r(&t, &utc);
      char buf[32];
      const size_t n = std::strftime(buf, sizeof(buf), "%Y-%m-%dT%H:%M:%S", &utc);
      cached_time_.assign(buf, n);
      cached_second_ = seconds.count();
    }
    line_.append(cached_time_);
    char ms[8];
    std::snprintf(ms, sizeof(ms), ".%03dZ", static_cast<int>(millis));
    line_.append(ms);
  }

  const LogFormat format_;
  const std::unique_ptr<spdlog::formatter> text_;
  std::string line_;  // reused from line to line
  int64_t cached_second_ = -1;
  std::string cached_time_;
};

}  // namespace

std::optional<LogFormat> ParseLogFormat(std::string_view name) {
  if (name == "text") return LogFormat::kText;
  if (name == "logfmt") return LogFormat::kLogfmt;
  if (name == "json") return LogFormat::kJson;
  return std::nullopt;
}

std::string_view LogFormatName(LogFormat format) {
  switch (format) {
    case LogFormat::kText:
      return "text";
    case LogFormat::kLogfmt:
      return "logfmt";
    case LogFormat::kJson:
      return "json";
  }
  return "text";
}

std::string LogPayloadAsText(std::string_view payload) {
  if (payload.find(kFieldMark) == std::string_view::npos) return std::string(payload);
  const DecodedLogEvent event = DecodeLogEvent(payload);
  std::string text(event.message);
  for (const DecodedField& f : event.fields) {
    text.push_back(' ');
    AppendKey(f.key, &text);
    text.push_back('=');
    AppendLogfmtValue(f.value, &text);
  }
  return text;
}

std::unique_ptr<spdlog::formatter> NewLogFormatter(LogFormat format) {
  UseEncodedLogEvents();
  return std::make_unique<StructuredFormatter>(format);
}

void AppendEscaped(std::string_view text, std::string* out) {
  for (size_t i = 0; i < text.size();) {
    const auto c = static_cast<unsigned char>(text[i]);
    if (c >= 0x80) {
      const size_t n = Utf8Length(text, i);
      if (n == 0) {
        out->append("\\ufffd");
        ++i;
      } else {
        out->append(text.substr(i, n));
        i += n;
      }
      continue;
    }
    switch (c) {
      case '"':
        out->append("\\\"");
        break;
      case '\\':
        out->append("\\\\");
        break;
      case '\n':
        out->append("\\n");
        break;
      case '\r':
        out->append("\\r");
        break;
      case '\t':
        out->append("\\t");
        break;
      default:
        if (c < 0x20 || c == 0x7f) {
          const char esc[] = {'\\', 'u', '0', '0', kHex[c >> 4], kHex[c & 0xf]};
          out->append(esc, sizeof(esc));
        } else {
          out->push_back(static_cast<char>(c));
        }
    }
    ++i;
  }
}

void AppendLogfmtValue(std::string_view value, std::string* out) {
  if (!NeedsLogfmtQuotes(value)) {
    out->append(value);
    return;
  }
  out->push_back('"');
  AppendEscaped(value, out);
  out->push_back('"');
}

}  // namespace kvcache
