// BlockPayload: a block's copy in host memory (a StoredCopy read in place), sealed at birth.
// StagingBlock: the memory of a block while its bytes are being written.
//
// A block's bytes are written into a StagingBlock, which has one owner and no
// seal: nothing can look it up, fetch it or store it in a tier. Whoever wrote
// it (an append, a read-back from a lower tier, a restore, a re-encoding, a
// compaction move, a fetch's decoding) seals it: StagingBlock::Seal turns the
// memory into a BlockPayload carrying its BlockSeal, without copying. A
// payload is immutable from birth and made no other way, so every payload in
// the daemon has the seal of the bytes it holds.
//
// A payload is shared through BlockRef (a std::shared_ptr): the prefix index
// holds one reference, and every lease, in-flight fetch and in-flight append
// holds more. Memory returns to the pool when the last reference drops, so a
// fetch never reads freed memory, even if the block is evicted while it
// streams.
//
// A payload holds either the block's raw bytes (the layout in docs/api.md)
// or, once the importance policy compressed it, the compressed block format
// (server/importance/block_codec.h); compressed() says which. checksum() is
// always the XXH3-64 of the bytes the payload holds (verified before they are
// decoded or re-encoded); raw_checksum() is the checksum of the block as a
// worker appended it, which a compressed copy keeps, so a later append of the
// same tokens can be compared with what was first stored. A block staged by
// StagingBlock::OnHeap lives outside the pool: fetches use it for blocks they
// decode, and read-backs past the pool's room.
//
// Thread-safety: a payload is read-only and may be read concurrently. A
// StagingBlock is its one owner's.
#ifndef KVCACHE_SERVER_CORE_BLOCK_H_
#define KVCACHE_SERVER_CORE_BLOCK_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <span>

#include "server/core/pin.h"
#include "server/core/slab_pool.h"
#include "server/core/stored_copy.h"

namespace kvcache {

// XXH3-64 of `bytes`; the checksum every block carries end to end.
uint64_t Checksum(std::span<const std::byte> bytes);

class BlockPayload final : public StoredCopy {
 public:
  // Only a StagingBlock makes payloads (StagingBlock::Seal).
  class Key {
    Key() = default;
    friend class StagingBlock;
  };
  // Owns `allocation` (from `pool`, or the heap when `pool` is null), of
  // which seal.size bytes are used. REQUIRES: `pool` outlives this payload.
  BlockPayload(Key, SlabPool* pool, Allocation allocation, uint64_t key, const BlockSeal& seal)
      : StoredCopy(key, seal, allocation.bytes), pool_(pool), data_(allocation.data) {}
  ~BlockPayload() override;

  std::span<const std::byte> data() const { return {data_, seal().size}; }
  std::optional<std::span<const std::byte>> in_place_bytes() const override { return data(); }
  uint64_t size() const { return seal().size; }
  // The memory this payload holds (pool memory unless staged on the heap);
  // footprint() is its size class.
  Allocation allocation() const { return {.data = data_, .bytes = footprint()}; }

  uint64_t checksum() const { return seal().checksum; }
  uint64_t raw_checksum() const { return seal().raw_checksum; }
  // Checksum of what decoding this payload yields (== checksum() for a raw block).
  uint64_t decoded_checksum() const { return seal().fetch_checksum(); }
  bool compressed() const { return seal().compressed; }

 private:
  SlabPool* const pool_;
  std::byte* const data_;  // with footprint(), the allocation
};

using BlockRef = std::shared_ptr<BlockPayload>;
// A reference to a host payload that pins it (pin.h).
using PinnedBlock = PinnedRef<BlockPayload>;

class StagingBlock {
 public:
  StagingBlock() = default;  // empty
  // Owns `allocation` (from `pool`), of which `size` bytes are used.
  // REQUIRES: size <= allocation.bytes; `pool` outlives this block and the
  // payload it becomes.
  StagingBlock(SlabPool* pool, Allocation allocation, uint64_t size)
      : pool_(pool), allocation_(allocation), size_(size) {}
  // A block of `size` bytes on the heap, not counted against any tier.
  static StagingBlock OnHeap(uint64_t size);
  ~StagingBlock() { Free(); }
  StagingBlock(StagingBlock&& other) noexcept;
  StagingBlock& operator=(StagingBlock&& other) noexcept;

  bool empty() const { return allocation_.data == nullptr; }
  std::span<std::byte> data() { return {allocation_.data, size_}; }
  std::span<const std::byte> data() const { return {allocation_.data, size_}; }
  uint64_t size() const { return size_; }
  uint64_t footprint() const { return allocation_.bytes; }

  // The bytes as written become the payload of the block whose chain key is
  // `key`, sealed with `seal` (a raw seal's decoded_checksum is its
  // checksum); this block is left empty. REQUIRES: !empty(),
  // seal.size == size(); the process aborts otherwise, in every build.
  BlockRef Seal(uint64_t key, BlockSeal seal) &&;

 private:
  void Free();

  SlabPool* pool_ = nullptr;
  Allocation allocation_;
  uint64_t size_ = 0;
};

}  // namespace kvcache

#endif  // KVCACHE_SERVER_CORE_BLOCK_H_
