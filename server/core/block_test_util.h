// Blocks for tests: sealed payloads made from given bytes, and the memory
// faults the daemon's checks must catch.
#ifndef KVCACHE_SERVER_CORE_BLOCK_TEST_UTIL_H_
#define KVCACHE_SERVER_CORE_BLOCK_TEST_UTIL_H_

#include <cstddef>
#include <cstring>
#include <span>

#include "server/core/block.h"

namespace kvcache {

// A payload on the heap holding `bytes`, sealed with `seal` (its size set
// to the bytes').
inline BlockRef SealedHeapBlock(std::span<const std::byte> bytes, BlockSeal seal) {
  StagingBlock staged = StagingBlock::OnHeap(bytes.size());
  if (!bytes.empty()) std::memcpy(staged.data().data(), bytes.data(), bytes.size());
  seal.size = bytes.size();
  return std::move(staged).Seal(/*key=*/0, seal);
}
// A raw payload on the heap holding `bytes`, with their checksum.
inline BlockRef SealedHeapBlock(std::span<const std::byte> bytes) {
  return SealedHeapBlock(bytes, BlockSeal::Raw(bytes.size(), Checksum(bytes)));
}

// Flips `mask` in byte `at` of a sealed payload, as failing memory would.
inline void FlipBits(const BlockPayload& payload, size_t at, std::byte mask) {
  payload.allocation().data[at] ^= mask;
}

}  // namespace kvcache

#endif  // KVCACHE_SERVER_CORE_BLOCK_TEST_UTIL_H_
