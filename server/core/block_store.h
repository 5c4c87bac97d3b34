// BlockStore: a tier below host memory (the SSD tier) that keeps copies of
// sealed blocks, so the cache can hold more than DRAM.
//
// The cache demotes a cold block by writing its payload to the store and
// dropping the host copy; a hit on a demoted block reads it back (and may
// promote it). A StoredCopy is one block's copy in the store: immutable,
// carrying the block's seal (size and checksums). It is shared through
// StoredRef; the store reuses a copy's space only once the last reference
// drops, so a reader holding a reference never reads space rewritten under
// it. The prefix index holds one reference per demoted block; leases and
// reads in flight hold more.
//
// Integrity: Read() verifies what it read against the copy's checksum and
// answers DATA_LOSS on any mismatch; it never returns unverified bytes as OK.
// The cache drops a block that fails (a miss, counted), never serves it.
//
// Every implementation passes the behaviour suite in
// server/tier/block_store_test.cc.
//
// Thread-safety: every method may be called concurrently. The store must
// outlive its copies.
#ifndef KVCACHE_SERVER_CORE_BLOCK_STORE_H_
#define KVCACHE_SERVER_CORE_BLOCK_STORE_H_

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "server/core/block.h"

namespace kvcache {

class StoredCopy {
 public:
  StoredCopy(uint64_t key, const BlockSeal& seal, uint64_t footprint)
      : key_(key), seal_(seal), footprint_(footprint) {}
  virtual ~StoredCopy() = default;
  StoredCopy(const StoredCopy&) = delete;
  StoredCopy& operator=(const StoredCopy&) = delete;

  uint64_t key() const { return key_; }  // the block's chain key, as written
  const BlockSeal& seal() const { return seal_; }
  // Bytes of the store's capacity the copy occupies.
  uint64_t footprint() const { return footprint_; }

 private:
  const uint64_t key_;
  const BlockSeal seal_;
  const uint64_t footprint_;
};

using StoredRef = std::shared_ptr<const StoredCopy>;

struct BlockStoreStats {
  std::string kind;  // "ssd", "memory"
  uint64_t capacity_bytes = 0;
  uint64_t allocated_bytes = 0;  // footprints of live copies
  uint64_t payload_bytes = 0;    // sizes of live copies
  uint64_t live_copies = 0;
  uint64_t writes = 0;
  uint64_t write_bytes = 0;
  uint64_t reads = 0;
  uint64_t read_bytes = 0;
  uint64_t checksum_failures = 0;  // reads that answered DATA_LOSS
  uint64_t failed_writes = 0;      // RESOURCE_EXHAUSTED answers
};

// One read of a batch.
struct StoredRead {
  const StoredCopy* copy = nullptr;
  std::span<std::byte> out;  // REQUIRES: out.size() == copy->seal().size
  absl::Status status;       // set by ReadBatch
};

class BlockStore {
 public:
  virtual ~BlockStore() = default;

  // Writes a copy of the sealed `payload` under `key`. RESOURCE_EXHAUSTED
  // when there is no room (the caller frees copies and retries);
  // INVALID_ARGUMENT when the block could never fit.
  virtual absl::StatusOr<StoredRef> Write(uint64_t key, const BlockPayload& payload) = 0;

  // Reads `copy` into `out`, verified: DATA_LOSS when what was read does not
  // match the copy's checksum (or its header). REQUIRES: `copy` came from this
  // store; out.size() == copy.seal().size.
  virtual absl::Status Read(const StoredCopy& copy, std::span<std::byte> out) = 0;

  // Several reads at once (a store may have them all in flight together);
  // sets each one's status.
  virtual void ReadBatch(std::span<StoredRead> reads) {
    for (StoredRead& r : reads) r.status = Read(*r.copy, r.out);
  }

  virtual BlockStoreStats GetStats() const = 0;
};

}  // namespace kvcache

#endif  // KVCACHE_SERVER_CORE_BLOCK_STORE_H_
