// StoredCopy: one sealed copy of a block in one tier (host memory, SSD, GPU,
// and later remote), and BlockSeal, what every copy of a block carries.
//
// A copy is immutable and carries its block's seal from birth: its size, the
// XXH3-64 of the bytes it holds, the checksum of the block as a worker
// appended it, and, for a compressed block, the checksum of its decoding.
// It is shared through StoredRef; its tier reuses its space only once the
// last reference drops. Host copies (BlockPayload, block.h) can be read in
// place: bytes() is set for them, and absent for copies that must be read
// through their tier (Tier::Read).
//
// Thread-safety: a copy is read-only and may be read concurrently; pins()
// counts concurrently (pin.h).
#ifndef KVCACHE_SERVER_CORE_STORED_COPY_H_
#define KVCACHE_SERVER_CORE_STORED_COPY_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <span>

#include "server/core/pin.h"

namespace kvcache {

// What a sealed block's bytes are, wherever a copy of them lives: a host
// payload and every copy of it in a lower tier carry the same seal.
struct BlockSeal {
  uint64_t size = 0;              // bytes the copy holds
  uint64_t checksum = 0;          // XXH3-64 of those bytes
  uint64_t raw_checksum = 0;      // of the block as a worker appended it
  uint64_t decoded_checksum = 0;  // of the decoding of a compressed block
  bool compressed = false;        // the compressed block format (lossy)

  // The seal of a raw block of `size` bytes whose XXH3-64 is `checksum`.
  static BlockSeal Raw(uint64_t size, uint64_t checksum) {
    return {
        .size = size, .checksum = checksum, .raw_checksum = checksum, .decoded_checksum = checksum};
  }
  // Checksum of what a fetch that decodes the block sends.
  uint64_t fetch_checksum() const { return compressed ? decoded_checksum : checksum; }

  friend bool operator==(const BlockSeal&, const BlockSeal&) = default;
};

class StoredCopy {
 public:
  StoredCopy(uint64_t key, const BlockSeal& seal, uint64_t footprint)
      : key_(key), seal_(seal), footprint_(footprint) {}
  virtual ~StoredCopy() = default;
  StoredCopy(const StoredCopy&) = delete;
  StoredCopy& operator=(const StoredCopy&) = delete;

  uint64_t key() const { return key_; }  // the block's chain key, as written
  const BlockSeal& seal() const { return seal_; }
  // Bytes of the tier's capacity the copy occupies.
  uint64_t footprint() const { return footprint_; }
  // The copy's bytes, when they can be read in place (a host copy); else
  // nullopt: read them with the tier's Read.
  virtual std::optional<std::span<const std::byte>> in_place_bytes() const { return std::nullopt; }
  // Who besides the index (or the GPU tier's copy map) holds this copy (pin.h).
  const PinCounts& pins() const { return pins_; }

 private:
  const uint64_t key_;
  const BlockSeal seal_;
  const uint64_t footprint_;
  PinCounts pins_;
};

using StoredRef = std::shared_ptr<const StoredCopy>;
// A reference to a tier's copy that pins it (pin.h).
using PinnedCopy = PinnedRef<const StoredCopy>;

}  // namespace kvcache

#endif  // KVCACHE_SERVER_CORE_STORED_COPY_H_
