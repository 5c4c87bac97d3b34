// Fuzz target: the HTTP endpoint's query parser (server/http/http_server.h),
// HttpRequest::Param and UrlDecode, which read the status page's queries from
// anyone who can reach listen.metrics_address.
//
// Input: byte 0 picks the mode; the rest is the text.
//   even: the rest is a raw query string. Properties: UrlDecode never grows
//     its input and leaves text without '%' or '+' as it is; for every
//     '&'-separated piece, Param(its decoded name) answers the value of the
//     first piece with that name (as a plain reference split computes it);
//     a name no piece has is absent.
//   odd: the rest is NUL-separated names and values, each percent-encoded
//     (every byte, or only the unsafe ones: bit 1 of byte 0) into a query
//     "n1=v1&n2=v2...". Properties: Param(n_i) gives back the value of the
//     first pair named n_i exactly (bytes '&', '=', '%', '+', NUL included),
//     and UrlDecode(encoding) is the original bytes.
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "server/http/http_server.h"
#include "tests/fuzz/fuzz_check.h"

namespace {

using kvcache::HttpRequest;
using kvcache::UrlDecode;

std::vector<std::string_view> Split(std::string_view text, char separator) {
  std::vector<std::string_view> pieces;
  size_t begin = 0;
  for (;;) {
    const size_t end = text.find(separator, begin);
    pieces.push_back(text.substr(begin, end == std::string_view::npos ? end : end - begin));
    if (end == std::string_view::npos) return pieces;
    begin = end + 1;
  }
}

// The reference: the first piece whose decoded name is `name`.
std::optional<std::string> Reference(std::string_view query, std::string_view name) {
  for (std::string_view piece : Split(query, '&')) {
    if (piece.empty()) continue;
    const size_t eq = piece.find('=');
    if (UrlDecode(piece.substr(0, eq), true) != name) continue;
    return eq == std::string_view::npos ? std::string() : UrlDecode(piece.substr(eq + 1), true);
  }
  return std::nullopt;
}

std::string Encode(std::string_view bytes, bool every_byte) {
  static constexpr char kHex[] = "0123456789ABCDEF";
  std::string out;
  for (char c : bytes) {
    const auto u = static_cast<unsigned char>(c);
    const bool plain = (u >= 'a' && u <= 'z') || (u >= 'A' && u <= 'Z') || (u >= '0' && u <= '9') ||
                       u == '-' || u == '_' || u == '.' || u == '~';
    if (plain && !every_byte) {
      out.push_back(c);
    } else {
      out.push_back('%');
      out.push_back(kHex[u >> 4]);
      out.push_back(kHex[u & 15]);
    }
  }
  return out;
}

void RawQuery(std::string_view text) {
  for (bool plus : {false, true}) {
    const std::string decoded = UrlDecode(text, plus);
    FUZZ_CHECK(decoded.size() <= text.size());
    if (text.find('%') == std::string_view::npos &&
        (!plus || text.find('+') == std::string_view::npos)) {
      FUZZ_CHECK(decoded == text);
    }
  }
  const HttpRequest request{
      .method = "GET", .path = "/status/attention", .query = std::string(text)};
  for (std::string_view piece : Split(text, '&')) {
    const std::string name = UrlDecode(piece.substr(0, piece.find('=')), true);
    FUZZ_CHECK(request.Param(name) == Reference(text, name));
  }
  const std::string absent = "\x01no such parameter\x02";
  FUZZ_CHECK(request.Param(absent) == Reference(text, absent));
}

void EncodedPairs(std::string_view text, bool every_byte) {
  const std::vector<std::string_view> parts = Split(text, '\0');
  std::string query;
  std::vector<std::pair<std::string, std::string>> pairs;
  for (size_t i = 0; i + 1 < parts.size(); i += 2) {
    if (!query.empty()) query.push_back('&');
    const std::string name = Encode(parts[i], every_byte);
    const std::string value = Encode(parts[i + 1], every_byte);
    FUZZ_CHECK(UrlDecode(name, true) == parts[i]);
    FUZZ_CHECK(UrlDecode(value, false) == parts[i + 1]);
    query += name + "=" + value;
    pairs.emplace_back(parts[i], parts[i + 1]);
  }
  const HttpRequest request{.method = "GET", .path = "/status", .query = query};
  for (size_t i = 0; i < pairs.size(); ++i) {
    // The first pair with this name wins (an empty name is a piece "=v",
    // which is not empty, so Param reads it too).
    size_t first = 0;
    while (pairs[first].first != pairs[i].first) ++first;
    const std::optional<std::string> got = request.Param(pairs[i].first);
    FUZZ_CHECK(got.has_value());
    FUZZ_CHECK(*got == pairs[first].second);
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const std::string_view text(reinterpret_cast<const char*>(data + 1), size - 1);
  if (data[0] % 2 == 0) {
    RawQuery(text);
  } else {
    EncodedPairs(text, (data[0] & 2) != 0);
  }
  return 0;
}
