// The GPU tier: a DeviceTier (server/core/device_tier.h) over the device
// layer in gpu/ (kvcache::gpu's GpuBlockPool on a DeviceMemory).
//
// Two kinds of device:
//   "cuda"           a CUDA device (cudaMalloc arenas, CUDA IPC); only in a
//                    build with CUDA (KVCACHE_ENABLE_CUDA), and only when a
//                    usable device is present.
//   "host_stand_in"  the host-memory stand-in for a device (memfd arenas that
//                    a worker maps through /proc/<pid>/fd): the same code
//                    paths, for machines without a GPU and for tests.
// Copies are verified both ways with XXH3-64 (the blocks' checksum), as the
// other tiers are: DATA_LOSS on a mismatch.
#ifndef KVCACHE_SERVER_TIER_GPU_DEVICE_TIER_H_
#define KVCACHE_SERVER_TIER_GPU_DEVICE_TIER_H_

#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "server/core/device_tier.h"

namespace kvcache {

struct GpuTierOptions {
  std::string kind = "cuda";  // "cuda" or "host_stand_in"
  int device = 0;             // CUDA device ordinal
  // Hard limit on device memory the tier reserves, in arenas of arena_bytes
  // (a multiple of slab_bytes, at most capacity_bytes); slabs serve one
  // slot size class (min_block_bytes .. slab_bytes) at a time, and
  // a block larger than a slab is not placed (INVALID_ARGUMENT).
  uint64_t capacity_bytes = uint64_t{8} << 30;
  uint64_t arena_bytes = uint64_t{1} << 30;
  uint64_t slab_bytes = uint64_t{8} << 20;
  uint64_t min_block_bytes = uint64_t{64} << 10;
};

// A tier on the configured device. UNAVAILABLE naming the reason when the
// device is not usable ("no CUDA device", a build without CUDA);
// INVALID_ARGUMENT for an unknown kind or options out of range.
absl::StatusOr<std::shared_ptr<DeviceTier>> OpenGpuDeviceTier(const GpuTierOptions& options);

// Whether this build can open kind "cuda".
bool GpuTierCudaBuilt();

}  // namespace kvcache

#endif  // KVCACHE_SERVER_TIER_GPU_DEVICE_TIER_H_
