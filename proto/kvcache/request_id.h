// Request ids, shared by the daemon and the client library: every call
// carries one in the `x-request-id` metadata; the daemon writes it in the
// call's log line and echoes it in the trailers (docs/api.md, docs/logging.md).
#ifndef KVCACHE_PROTO_KVCACHE_REQUEST_ID_H_
#define KVCACHE_PROTO_KVCACHE_REQUEST_ID_H_

#include <cstdint>
#include <random>
#include <string>

namespace kvcache {

// The metadata key, in requests and in trailers.
inline constexpr char kRequestIdHeader[] = "x-request-id";

// A new id: 16 lowercase hex digits of a random 64-bit number.
inline std::string NewRequestId() {
  thread_local std::mt19937_64 rng(std::random_device{}());
  constexpr char kHex[] = "0123456789abcdef";
  uint64_t v = rng();
  std::string id(16, '0');
  for (int i = 15; i >= 0; --i, v >>= 4) id[i] = kHex[v & 0xf];
  return id;
}

}  // namespace kvcache

#endif  // KVCACHE_PROTO_KVCACHE_REQUEST_ID_H_
