// Helpers for the gpu tests: the checksum the pool is given, and seeded random bytes.
#ifndef KVCACHE_GPU_TESTS_TEST_UTIL_H_
#define KVCACHE_GPU_TESTS_TEST_UTIL_H_

#include <cstddef>
#include <cstdint>
#include <random>
#include <vector>

#if defined(KVCACHE_GPU_TEST_XXH3)
#include <xxhash.h>
#endif

namespace kvcache::gpu::test {

// XXH3-64 (what the daemon passes) when the test links xxhash; else 64-bit FNV-1a.
inline uint64_t TestChecksum(const void* data, size_t bytes) {
#if defined(KVCACHE_GPU_TEST_XXH3)
  return XXH3_64bits(data, bytes);
#else
  uint64_t h = 0xcbf29ce484222325ull;
  const auto* p = static_cast<const unsigned char*>(data);
  for (size_t i = 0; i < bytes; ++i) h = (h ^ p[i]) * 0x100000001b3ull;
  return h;
#endif
}

inline std::vector<std::byte> RandomBytes(size_t bytes, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::vector<std::byte> out(bytes);
  for (size_t i = 0; i < bytes; ++i) out[i] = static_cast<std::byte>(rng() & 0xff);
  return out;
}

}  // namespace kvcache::gpu::test

#endif  // KVCACHE_GPU_TESTS_TEST_UTIL_H_
