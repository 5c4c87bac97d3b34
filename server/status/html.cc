#include "server/status/html.h"

#include <algorithm>
#include <cmath>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"

namespace kvcache {

std::string HtmlEscape(std::string_view text) {
  std::string out;
  out.reserve(text.size());
  for (char c : text) {
    switch (c) {
      case '&':
        out += "&amp;";
        break;
      case '<':
        out += "&lt;";
        break;
      case '>':
        out += "&gt;";
        break;
      case '"':
        out += "&quot;";
        break;
      case '\'':
        out += "&#39;";
        break;
      default:
        out.push_back(c);
    }
  }
  return out;
}

std::string UrlEncode(std::string_view text) {
  static constexpr char kHex[] = "0123456789ABCDEF";
  std::string out;
  for (unsigned char c : text) {
    if ((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '-' ||
        c == '_' || c == '.' || c == '~') {
      out.push_back(static_cast<char>(c));
    } else {
      out.push_back('%');
      out.push_back(kHex[c >> 4]);
      out.push_back(kHex[c & 15]);
    }
  }
  return out;
}

std::string BytesText(uint64_t bytes) {
  static constexpr const char* kUnits[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB"};
  double value = static_cast<double>(bytes);
  int unit = 0;
  while (value >= 1024 && unit < 5) {
    value /= 1024;
    ++unit;
  }
  if (unit == 0) return absl::StrCat(bytes, " B");
  return absl::StrFormat("%.2f %s", value, kUnits[unit]);
}

std::string DurationText(absl::Duration d) {
  if (d < absl::ZeroDuration()) d = absl::ZeroDuration();
  if (d < absl::Milliseconds(1)) return absl::StrCat(absl::ToInt64Microseconds(d), " us");
  if (d < absl::Seconds(1)) return absl::StrFormat("%.1f ms", absl::ToDoubleMilliseconds(d));
  if (d < absl::Minutes(1)) return absl::StrFormat("%.1f s", absl::ToDoubleSeconds(d));
  const int64_t s = absl::ToInt64Seconds(d);
  const int64_t days = s / 86400, hours = s / 3600 % 24, minutes = s / 60 % 60;
  if (days > 0) return absl::StrCat(days, "d ", hours, "h ", minutes, "m");
  if (hours > 0) return absl::StrCat(hours, "h ", minutes, "m ", s % 60, "s");
  return absl::StrCat(minutes, "m ", s % 60, "s");
}

std::string TimeText(absl::Time t) {
  if (t == absl::InfinitePast() || t == absl::InfiniteFuture()) return "-";
  return absl::FormatTime("%Y-%m-%d %H:%M:%SZ", t, absl::UTCTimeZone());
}

std::string KeyText(uint64_t key) { return absl::StrFormat("%016x", key); }

std::string TokensText(std::span<const Token> tokens) {
  return absl::StrJoin(tokens.begin(), tokens.end(), " ");
}

std::string Percent(double ratio) {
  if (!(ratio >= 0)) ratio = 0;  // also NaN
  return absl::StrFormat("%.1f%%", std::min(ratio, 1.0) * 100);
}

}  // namespace kvcache
