// What the shared tier's tests and benchmarks share: a secret of known bytes,
// block bytes of a seed, and (tests only) a suite over one real cluster.
#ifndef KVCACHE_SERVER_REMOTE_REMOTE_TEST_UTIL_H_
#define KVCACHE_SERVER_REMOTE_REMOTE_TEST_UTIL_H_

#include <cstddef>
#include <cstdint>
#include <vector>

#include "server/security/daemon_secret.h"

namespace kvcache::remote_test {

// A secret every byte of which is `fill`: equal fills, one deployment.
inline DaemonSecret Secret(uint8_t fill) {
  SecretKey bytes;
  bytes.fill(fill);
  return DaemonSecret::FromBytes(bytes);
}

// `n` bytes that look random (xorshift64 of `seed`); equal seeds, equal bytes.
inline std::vector<std::byte> SeededBytes(size_t n, uint64_t seed) {
  std::vector<std::byte> v(n);
  uint64_t x = 0x9E3779B97F4A7C15ull * (seed + 1);
  for (size_t i = 0; i < n; ++i) {
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    v[i] = static_cast<std::byte>(x);
  }
  return v;
}

}  // namespace kvcache::remote_test

#endif  // KVCACHE_SERVER_REMOTE_REMOTE_TEST_UTIL_H_
