#include "server/core/block.h"

#include <xxhash.h>

namespace kvcache {

uint64_t Checksum(std::span<const std::byte> bytes) {
  return XXH3_64bits(bytes.data(), bytes.size());
}

}  // namespace kvcache
