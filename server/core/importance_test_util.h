// Shared shapes for the importance and integrity unit tests
// (importance_test.cc, integrity_test.cc): one fp32 test layout of 8 KiB
// blocks, a four-block test sequence, and element indexing. Test-only.
#ifndef KVCACHE_SERVER_CORE_IMPORTANCE_TEST_UTIL_H_
#define KVCACHE_SERVER_CORE_IMPORTANCE_TEST_UTIL_H_

#include <cstddef>
#include <cstdint>

#include "server/core/layout.h"

namespace kvcache::importance_test {

inline constexpr uint32_t kBt = 16;
inline constexpr uint32_t kLayers = 2;
inline constexpr uint32_t kHeads = 2;
inline constexpr uint32_t kDim = 16;
inline constexpr uint32_t kBlocks = 4;  // the test sequence: 64 tokens
inline constexpr uint64_t kSlab = uint64_t{64} << 10;
inline constexpr size_t kBlockFloats = size_t{kLayers} * 2 * kHeads * kBt * kDim;  // 8 KiB
inline const ModelKey kModel{"default", "m"};

inline ModelLayout TestLayout() { return {kLayers, kHeads, kDim, DType::kFp32, kBt}; }

// Index of element (layer, kv, head, token-in-block, dim) in a block of floats.
inline size_t At(uint32_t layer, uint32_t kv, uint32_t head, uint32_t t, uint32_t d) {
  return ((((size_t{layer} * 2 + kv) * kHeads + head) * kBt + t) * kDim) + d;
}

}  // namespace kvcache::importance_test

#endif  // KVCACHE_SERVER_CORE_IMPORTANCE_TEST_UTIL_H_
