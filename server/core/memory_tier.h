// MemoryTier: a Tier in heap memory, with a hard capacity.
//
// It stands in for a lower tier where no device is at hand: the cache's tier
// logic (demotion, promotion, corruption handling) is tested through it, and
// it is the behaviour suite's reference. Corrupt() flips a byte of the copies
// written under a key, so tests can make a read fail on purpose.
//
// Thread-safe.
#ifndef KVCACHE_SERVER_CORE_MEMORY_TIER_H_
#define KVCACHE_SERVER_CORE_MEMORY_TIER_H_

#include <cstdint>
#include <memory>
#include <string>

#include "server/core/tier.h"

namespace kvcache {

class MemoryTier : public Tier {
 public:
  // A store that holds at most `capacity_bytes` of copies (each copy's
  // footprint is its size rounded up to 4 KiB); GetStats() names it `kind`.
  static std::shared_ptr<MemoryTier> Create(uint64_t capacity_bytes, std::string kind = "memory");

  // Flips the byte at `offset` of every live copy written under `key` (those
  // shorter are left alone): the next read of one answers DATA_LOSS. Returns
  // how many copies it changed.
  virtual int Corrupt(uint64_t key, uint64_t offset) = 0;
};

}  // namespace kvcache

#endif  // KVCACHE_SERVER_CORE_MEMORY_TIER_H_
