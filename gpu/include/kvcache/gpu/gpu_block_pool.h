// kvcache/gpu/gpu_block_pool.h: the GPU tier's block store: an ArenaAllocator over the arenas of
// one DeviceMemory.
//
// Put copies a block's bytes host-to-device into a slot and returns a handle (arena, offset,
// size, checksum); Get copies them back and verifies the checksum, so a block corrupted on the
// device is reported (DATA_LOSS) instead of handed to a worker. The checksum is a callback the
// caller supplies (the daemon passes XXH3-64, as for its other tiers), which keeps this library
// free of a hashing dependency. Put verifies the host bytes against the checksum it is given, so
// a handle's checksum always describes the bytes stored.
//
// Workers on the same host reach blocks without host copies: Export() lists every arena's IPC
// handle (each arena is exported once, when it is added); a worker maps each arena once
// (ArenaMappings, arena_mappings.h) and copies device-to-device at handle.offset.
//
// The pool owns its arenas (freed on destruction) but not the DeviceMemory, which must outlive
// it. It never evicts: RESOURCE_EXHAUSTED means the caller evicts and retries. Thread-safe.
#ifndef KVCACHE_GPU_GPU_BLOCK_POOL_H_
#define KVCACHE_GPU_GPU_BLOCK_POOL_H_

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include "kvcache/gpu/arena_allocator.h"
#include "kvcache/gpu/device_memory.h"
#include "kvcache/gpu/status.h"

namespace kvcache::gpu {

// Checksum of `bytes` host bytes; must be deterministic (the daemon: XXH3_64bits).
using ChecksumFn = std::function<uint64_t(const void* data, size_t bytes)>;

struct GpuBlockPoolOptions {
  ArenaAllocatorOptions allocator;
  ChecksumFn checksum;  // required
};

// Where a block lives. `bytes` is the block's size, `slot_bytes` its slot (class) size.
struct GpuBlockHandle {
  ArenaId arena = 0;
  uint64_t offset = 0;
  uint64_t bytes = 0;
  uint64_t slot_bytes = 0;
  uint64_t checksum = 0;
};

// One arena as a worker needs it: the id block handles name, and its IPC handle.
struct ExportedArena {
  ArenaId arena = 0;
  ArenaIpcHandle handle;
};

struct GpuBlockPoolStats {
  ArenaAllocatorStats allocator;
  uint64_t puts = 0;
  uint64_t gets = 0;
  uint64_t corrupt_blocks = 0;  // Get answers of DATA_LOSS so far
};

class GpuBlockPool {
 public:
  // UNAVAILABLE (with Probe()'s reason) when the device is not usable; INVALID_ARGUMENT for bad
  // options or a missing checksum. Allocates no arena yet.
  static GpuStatus Create(DeviceMemory* device, GpuBlockPoolOptions options,
                          std::unique_ptr<GpuBlockPool>* out);

  virtual ~GpuBlockPool() = default;

  // Stores `bytes` (1 .. slab_bytes) bytes from `host`. DATA_LOSS when checksum(host) !=
  // `checksum` (nothing stored); RESOURCE_EXHAUSTED when the tier is full.
  virtual GpuStatus Put(const void* host, uint64_t bytes, uint64_t checksum,
                        GpuBlockHandle* out) = 0;
  // Copies the block into `host` (at least handle.bytes) and verifies it. DATA_LOSS when the
  // bytes read back do not match handle.checksum (`host` then holds the bad bytes).
  virtual GpuStatus Get(const GpuBlockHandle& handle, void* host, uint64_t host_bytes) = 0;
  // Frees the block's slot. REQUIRES: no copy of it is in flight.
  virtual GpuStatus Free(const GpuBlockHandle& handle) = 0;

  // The block's device pointer in this process, for device-to-device copies.
  virtual GpuStatus Locate(const GpuBlockHandle& handle, std::byte** device_ptr) const = 0;
  // Every arena, in the order added (exported once each, when added).
  virtual std::vector<ExportedArena> Export() const = 0;
  virtual GpuBlockPoolStats Stats() const = 0;
};

}  // namespace kvcache::gpu

#endif  // KVCACHE_GPU_GPU_BLOCK_POOL_H_
