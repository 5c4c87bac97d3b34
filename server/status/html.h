// Small helpers the status pages build their HTML with (server/status).
#ifndef KVCACHE_SERVER_STATUS_HTML_H_
#define KVCACHE_SERVER_STATUS_HTML_H_

#include <cstdint>
#include <span>
#include <string>
#include <string_view>

#include "absl/time/time.h"
#include "server/core/layout.h"

namespace kvcache {

// Escapes & < > " ' so that `text` is safe in element content and in quoted
// attribute values.
std::string HtmlEscape(std::string_view text);
// Percent-encodes everything but unreserved characters (a query value).
std::string UrlEncode(std::string_view text);

std::string BytesText(uint64_t bytes);       // "1.50 GiB"
std::string DurationText(absl::Duration d);  // "3d 4h 5m", "12.3 s", "450 us"
std::string TimeText(absl::Time t);          // "2026-12-03 18:54:18Z"; "-" for infinite past
std::string KeyText(uint64_t key);           // 16 hex digits
std::string TokensText(std::span<const Token> tokens);  // "1 2 3"
// A ratio in [0, 1] as a percentage for a CSS width ("42.5%"); clamped.
std::string Percent(double ratio);

}  // namespace kvcache

#endif  // KVCACHE_SERVER_STATUS_HTML_H_
