// BlockPayload: the bytes of one cached block, in the host-memory pool.
//
// A payload is written once by the append that created it, sealed with its
// XXH3-64 checksum, and immutable from then on. It is shared through BlockRef
// (a std::shared_ptr): the prefix index holds one reference, and every lease,
// in-flight fetch and in-flight append holds more. Memory returns to the pool
// when the last reference drops, so a fetch never reads freed memory, even if
// the block is evicted while it streams.
//
// A payload holds either the block's raw bytes (the layout in docs/api.md)
// or, once the importance policy compressed it, the compressed block format
// (server/importance/block_codec.h); compressed() says which. checksum() is
// always the XXH3-64 of the bytes the payload holds (verified before they are
// decoded or re-encoded); raw_checksum() is the checksum of the block as a
// worker appended it, which a compressed copy keeps, so a later append of the
// same tokens can be compared with what was first stored. A payload made by
// FromHeap lives outside the pool: fetches use it for blocks they decode.
//
// Thread-safety: a sealed payload is read-only and may be read concurrently.
// Writing (mutable_data) is for the single owner before Seal().
#ifndef KVCACHE_SERVER_CORE_BLOCK_H_
#define KVCACHE_SERVER_CORE_BLOCK_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>

#include "server/core/pin.h"
#include "server/core/slab_pool.h"

namespace kvcache {

// XXH3-64 of `bytes`; the checksum every block carries end to end.
uint64_t Checksum(std::span<const std::byte> bytes);

// What a sealed block's bytes are, wherever a copy of them lives: a host
// payload and every copy of it in a lower tier carry the same seal.
struct BlockSeal {
  uint64_t size = 0;              // bytes the copy holds
  uint64_t checksum = 0;          // XXH3-64 of those bytes
  uint64_t raw_checksum = 0;      // of the block as a worker appended it
  uint64_t decoded_checksum = 0;  // of the decoding of a compressed block
  bool compressed = false;        // the compressed block format (lossy)

  // Checksum of what a fetch that decodes the block sends.
  uint64_t fetch_checksum() const { return compressed ? decoded_checksum : checksum; }
};

class BlockPayload {
 public:
  // Takes ownership of `allocation` (from `pool`), of which `size` bytes are used.
  // REQUIRES: size <= allocation.bytes; `pool` outlives this payload.
  BlockPayload(SlabPool* pool, Allocation allocation, uint64_t size)
      : pool_(pool), allocation_(allocation), size_(size) {}
  ~BlockPayload();
  BlockPayload(const BlockPayload&) = delete;
  BlockPayload& operator=(const BlockPayload&) = delete;

  std::span<std::byte> mutable_data() { return {allocation_.data, size_}; }
  std::span<const std::byte> data() const { return {allocation_.data, size_}; }
  uint64_t size() const { return size_; }
  // Bytes of pool memory this payload holds (its size class).
  uint64_t footprint() const { return allocation_.bytes; }
  // The memory this payload holds (pool memory unless made by FromHeap).
  const Allocation& allocation() const { return allocation_; }

  // A payload of `size` bytes on the heap, not counted against any tier.
  static std::shared_ptr<BlockPayload> FromHeap(uint64_t size);

  // Seals a raw block: its checksum is also its raw checksum.
  void Seal(uint64_t checksum) { checksum_ = raw_checksum_ = checksum; }
  // Seals a re-encoded block: `checksum` of its bytes, `raw_checksum` of the
  // raw block it was made from, `decoded_checksum` of its decoding.
  void Seal(uint64_t checksum, uint64_t raw_checksum, uint64_t decoded_checksum) {
    checksum_ = checksum;
    raw_checksum_ = raw_checksum;
    decoded_checksum_ = decoded_checksum;
  }
  uint64_t checksum() const { return checksum_; }
  uint64_t raw_checksum() const { return raw_checksum_; }
  // Checksum of what decoding this payload yields (== checksum() for a raw block).
  uint64_t decoded_checksum() const { return compressed_ ? decoded_checksum_ : checksum_; }

  void set_compressed(bool compressed) { compressed_ = compressed; }
  bool compressed() const { return compressed_; }

  // Who besides the index holds this payload (pin.h).
  const PinCounts& pins() const { return pins_; }

  BlockSeal seal() const {
    return {.size = size_,
            .checksum = checksum_,
            .raw_checksum = raw_checksum_,
            .decoded_checksum = decoded_checksum(),
            .compressed = compressed_};
  }
  // Seals this payload as a copy of a block sealed with `seal` (a block read
  // back from a lower tier). REQUIRES: seal.size == size().
  void SealAs(const BlockSeal& seal) {
    checksum_ = seal.checksum;
    raw_checksum_ = seal.raw_checksum;
    decoded_checksum_ = seal.decoded_checksum;
    compressed_ = seal.compressed;
  }

 private:
  SlabPool* const pool_;
  const Allocation allocation_;
  const uint64_t size_;
  uint64_t checksum_ = 0;
  uint64_t raw_checksum_ = 0;
  uint64_t decoded_checksum_ = 0;
  bool compressed_ = false;
  PinCounts pins_;
};

using BlockRef = std::shared_ptr<BlockPayload>;
// A reference to a host payload that pins it (pin.h).
using PinnedBlock = PinnedRef<BlockPayload>;

}  // namespace kvcache

#endif  // KVCACHE_SERVER_CORE_BLOCK_H_
