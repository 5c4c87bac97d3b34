#include "server/core/block.h"

#include <xxhash.h>

#include <cstdio>
#include <cstdlib>
#include <new>
#include <utility>

namespace kvcache {
namespace {

void FreeAllocation(SlabPool* pool, const Allocation& allocation) {
  if (pool != nullptr) {
    pool->Free(allocation);
  } else {
    ::operator delete (allocation.data, std::align_val_t{64});
  }
}

}  // namespace

uint64_t Checksum(std::span<const std::byte> bytes) {
  return XXH3_64bits(bytes.data(), bytes.size());
}

BlockPayload::~BlockPayload() { FreeAllocation(pool_, allocation()); }

StagingBlock StagingBlock::OnHeap(uint64_t size) {
  Allocation a;
  a.data = static_cast<std::byte*>(::operator new (size == 0 ? 1 : size, std::align_val_t{64}));
  a.bytes = size;
  return StagingBlock(nullptr, a, size);
}

StagingBlock::StagingBlock(StagingBlock&& other) noexcept
    : pool_(other.pool_),
      allocation_(std::exchange(other.allocation_, Allocation{})),
      size_(std::exchange(other.size_, 0)) {}

StagingBlock& StagingBlock::operator=(StagingBlock&& other) noexcept {
  if (this != &other) {
    Free();
    pool_ = other.pool_;
    allocation_ = std::exchange(other.allocation_, Allocation{});
    size_ = std::exchange(other.size_, 0);
  }
  return *this;
}

void StagingBlock::Free() {
  if (allocation_.data == nullptr) return;
  FreeAllocation(pool_, allocation_);
  allocation_ = Allocation{};
  size_ = 0;
}

BlockRef StagingBlock::Seal(uint64_t key, BlockSeal seal) && {
  // A seal of another size would let data() reach past the allocation: never
  // a block, in any build.
  if (empty() || seal.size != size_) {
    std::fprintf(stderr, "StagingBlock::Seal: a seal of %llu bytes for a block of %llu (%s)\n",
                 static_cast<unsigned long long>(seal.size), static_cast<unsigned long long>(size_),
                 empty() ? "empty" : "not empty");
    std::abort();
  }
  if (!seal.compressed) seal.decoded_checksum = seal.checksum;
  auto payload = std::make_shared<BlockPayload>(BlockPayload::Key(), pool_, allocation_, key, seal);
  allocation_ = Allocation{};
  size_ = 0;
  return payload;
}

}  // namespace kvcache
