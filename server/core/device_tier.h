// DeviceTier: the GPU tier above host memory (docs/tiers.md, "The GPU tier").
//
// A DeviceTier is a Tier whose copies live in device memory, carved
// from a few large arenas. It adds what same-host workers need to reach those
// copies without a host round trip: the arenas' IPC handles (each exported
// once, mapped once per worker session) and each copy's slot in them, so a
// worker copies a block device-to-device at (arena, offset).
//
// The cache keeps the GPU tier inclusive: a block with a device copy always
// has a host or SSD copy with the same seal too, so dropping a device copy
// never writes anything and never loses a block. Device copies are placed on
// demand (Cache::PlaceOnDevice) and dropped by the tier's own LRU order when
// it passes its high watermark or needs room.
//
// Integrity: Write() verifies the bytes it is given against the payload's
// checksum before they reach the device, and Read() (device to host)
// verifies them again on the way back (DATA_LOSS on a mismatch), as every
// Tier does. A worker's own device-to-device copy is not re-hashed by
// the daemon; see docs/tiers.md for what the worker can check.
//
// Every implementation passes the Tier behaviour suite
// (server/tier/tier_behaviour_test.cc). Thread-safety: as Tier.
#ifndef KVCACHE_SERVER_CORE_DEVICE_TIER_H_
#define KVCACHE_SERVER_CORE_DEVICE_TIER_H_

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "server/core/slab_pool.h"
#include "server/core/tier.h"

namespace kvcache {

// Where a device copy lives: `bytes` of block at `offset` of arena `arena`,
// in a slot of `slot_bytes`.
struct DeviceSlot {
  uint64_t arena = 0;
  uint64_t offset = 0;
  uint64_t bytes = 0;
  uint64_t slot_bytes = 0;
};

// One arena as a worker maps it: the id DeviceSlots name, its size, and the
// opaque handle the worker's device layer opens (a CUDA IPC handle, or the
// host stand-in's process and memfd).
struct DeviceArena {
  uint64_t arena = 0;
  uint64_t bytes = 0;
  std::string ipc_handle;
};

class DeviceTier : public Tier {
 public:
  // "cuda" or "host_stand_in" (the host-memory stand-in for a device that
  // tests and machines without a GPU use); a worker opens the arenas with a
  // device layer of the same kind.
  virtual std::string_view device_kind() const = 0;
  // A human-readable description of the device (name, memory), for logs.
  virtual std::string device_description() const = 0;
  // REQUIRES: `copy` came from this tier.
  virtual DeviceSlot Slot(const StoredCopy& copy) const = 0;
  // Every arena allocated so far, in the order added.
  virtual std::vector<DeviceArena> Arenas() const = 0;
  // A registrar that page-locks host memory for this device (for the host
  // pool: SlabPool::Create), so host <-> device copies are DMA with no
  // staging. It keeps the tier alive while it is held.
  virtual std::shared_ptr<HostMemoryRegistrar> HostPinner() = 0;
};

}  // namespace kvcache

#endif  // KVCACHE_SERVER_CORE_DEVICE_TIER_H_
