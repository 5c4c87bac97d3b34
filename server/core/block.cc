#include "server/core/block.h"

#include <xxhash.h>

#include <new>

namespace kvcache {

uint64_t Checksum(std::span<const std::byte> bytes) {
  return XXH3_64bits(bytes.data(), bytes.size());
}

BlockPayload::~BlockPayload() {
  if (pool_ != nullptr) {
    pool_->Free(allocation_);
  } else {
    ::operator delete (allocation_.data, std::align_val_t{64});
  }
}

std::shared_ptr<BlockPayload> BlockPayload::FromHeap(uint64_t size) {
  Allocation a;
  a.data = static_cast<std::byte*>(::operator new (size == 0 ? 1 : size, std::align_val_t{64}));
  a.bytes = size;
  return std::make_shared<BlockPayload>(nullptr, a, size);
}

}  // namespace kvcache
