// SplitMix64 (Steele, Lea and Flood, "Fast splittable pseudorandom number
// generators", 2014): the one copy of the mixer the daemon, its tests and its
// benchmarks use wherever they need a cheap, well-spread 64-bit hash of a
// 64-bit word or a reproducible stream of words.
//
// Not a cryptographic hash: block keys that must not be computable by others
// are keyed XXH3 (server/core/block_hasher.h), which uses the finalizer only
// to fold words it already keyed.
#ifndef KVCACHE_SERVER_COMMON_SPLITMIX64_H_
#define KVCACHE_SERVER_COMMON_SPLITMIX64_H_

#include <cstdint>

namespace kvcache {

// The generator's increment: 2^64 divided by the golden ratio, odd.
inline constexpr uint64_t kSplitMix64Gamma = 0x9e3779b97f4a7c15;

// splitmix64's finalizer (Stafford's "Mix13"): a bijection of 64-bit words in
// which every input bit flips each output bit with probability close to 1/2.
constexpr uint64_t SplitMix64Finalize(uint64_t x) {
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9;
  x = (x ^ (x >> 27)) * 0x94d049bb133111eb;
  return x ^ (x >> 31);
}

// The splitmix64 value of `x`: the finalizer of x + gamma. A stateless hash
// of a word (SplitMix64(seed + i) is the i-th word of the stream from seed).
constexpr uint64_t SplitMix64(uint64_t x) { return SplitMix64Finalize(x + kSplitMix64Gamma); }

// The next word of the stream whose state is `state`, which it advances.
inline uint64_t SplitMix64Next(uint64_t& state) {
  state += kSplitMix64Gamma;
  return SplitMix64Finalize(state);
}

}  // namespace kvcache

#endif  // KVCACHE_SERVER_COMMON_SPLITMIX64_H_
