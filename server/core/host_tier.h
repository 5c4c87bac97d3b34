// HostTier: host memory as a Tier, the first level of the tier list.
//
// Its copies are BlockPayloads in the host-memory slab pool: sealed at birth
// (block.h) and readable in place (StoredCopy::in_place_bytes), so a fetch
// sends a host copy without a read. Write copies a sealed block into the
// pool: RESOURCE_EXHAUSTED when the pool has no room, INVALID_ARGUMENT when
// the block is larger than the pool could ever give. Read copies a copy out
// and checks it against its seal: DATA_LOSS when the memory no longer holds
// what was sealed. Volatile: not persistent, no retention (Tier's defaults).
//
// The pool is the tier's: the blocks that appends, read-backs and restores
// stage (StagingBlock) are allocated from it too (pool()), so the tier's
// allocated bytes count them. TierStats::payload_bytes counts host copies by
// their pool chunks (allocated_bytes): the pool does not keep the sizes
// inside its chunks.
//
// Thread-safe. The tier must outlive its copies.
#ifndef KVCACHE_SERVER_CORE_HOST_TIER_H_
#define KVCACHE_SERVER_CORE_HOST_TIER_H_

#include <atomic>
#include <cstdint>
#include <memory>

#include "server/core/slab_pool.h"
#include "server/core/tier.h"

namespace kvcache {

class HostTier final : public Tier {
 public:
  explicit HostTier(std::unique_ptr<SlabPool> pool) : pool_(std::move(pool)) {}

  SlabPool& pool() const { return *pool_; }

  absl::StatusOr<StoredRef> Write(uint64_t key, const BlockPayload& payload) override;
  // REQUIRES (else INVALID_ARGUMENT): `copy` is a host copy.
  absl::Status Read(const StoredCopy& copy, std::span<std::byte> out) override;
  TierStats GetStats() const override;

 private:
  const std::unique_ptr<SlabPool> pool_;
  std::atomic<uint64_t> writes_{0};
  std::atomic<uint64_t> write_bytes_{0};
  std::atomic<uint64_t> failed_writes_{0};
  std::atomic<uint64_t> reads_{0};
  std::atomic<uint64_t> read_bytes_{0};
  std::atomic<uint64_t> checksum_failures_{0};
};

}  // namespace kvcache

#endif  // KVCACHE_SERVER_CORE_HOST_TIER_H_
