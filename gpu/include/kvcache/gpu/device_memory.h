// kvcache/gpu/device_memory.h: the one seam between the GPU tier and a device.
//
// A DeviceMemory hands out device memory in large arenas (never managed / unified memory),
// copies between host and device and within the device, and shares arenas with other processes
// on the same host (CUDA IPC): the owner exports an arena once as a fixed-size ArenaIpcHandle;
// another process opens the handle once and keeps the ArenaMapping, so moving a block between
// a worker's GPU memory and the daemon's is a device-to-device copy.
//
// Two implementations:
//   * NewCudaDeviceMemory() (cuda_device_memory.h, built with the CUDA toolkit): cudaMalloc
//     arenas, cudaMemcpyAsync on its own streams, cudaIpcGetMemHandle / cudaIpcOpenMemHandle.
//   * NewHostStandInMemory() (below): the sanctioned host-memory stand-in for a GPU. Arenas are
//     memfd-backed shared mappings, so an exported handle opens in another process (after fork,
//     or fork + exec) exactly like a CUDA IPC handle; copies are memcpy.
//
// Pointers: a "device pointer" is one inside an arena this object allocated or a mapping it
// opened (base + offset). Every copy checks that each device range it touches lies wholly inside
// one of them (INVALID_ARGUMENT otherwise); host pointers cannot be checked. On the stand-in a
// device pointer is host-addressable; on CUDA it is not.
//
// Start-up: Probe() says whether a usable device exists and, if not, why ("no CUDA device",
// "CUDA driver too old ..."); the daemon logs that and runs without the tier or refuses,
// as configured. On an unusable device every other method returns UNAVAILABLE with that reason.
//
// Thread-safety: every method may be called concurrently. Async copies on one stream run in
// order; the caller keeps host buffers alive and unchanged until Synchronize(stream) returns.
// Destroying a DeviceMemory closes its mappings, destroys its streams and frees its arenas; the
// caller must not use any pointer from it afterwards.
#ifndef KVCACHE_GPU_DEVICE_MEMORY_H_
#define KVCACHE_GPU_DEVICE_MEMORY_H_

#include <array>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "kvcache/gpu/status.h"

namespace kvcache::gpu {

using ArenaId = uint64_t;    // 0 is never a valid arena
using StreamId = uint64_t;   // 0 is never a valid stream
using MappingId = uint64_t;  // 0 is never a valid mapping

struct DeviceInfo {
  bool usable = false;
  std::string reason;  // why not usable ("no CUDA device", "CUDA driver too old: ..."); else ""
  std::string kind;    // "cuda" or "host-stand-in"
  std::string name;    // device name ("NVIDIA H200"), or "host memory"
  int device = 0;      // device ordinal
  uint64_t total_bytes = 0;
  uint64_t free_bytes = 0;  // at probe time
  int driver_version = 0;   // CUDA: e.g. 13000; stand-in: 0
  int runtime_version = 0;
  int compute_capability = 0;  // major * 10 + minor; stand-in: 0
};

// A device allocation owned by the DeviceMemory that made it.
struct Arena {
  ArenaId id = 0;
  std::byte* base = nullptr;  // device pointer
  uint64_t bytes = 0;
};

// What another process needs to map an arena: the 64 opaque bytes of a cudaIpcMemHandle_t (or
// the stand-in's equivalent) for the arena's base, and the arena's size. Trivially copyable, a
// fixed 72 bytes; send it as raw bytes. Offsets of blocks are relative to the arena base.
struct ArenaIpcHandle {
  static constexpr size_t kOpaqueBytes = 64;
  std::array<uint8_t, kOpaqueBytes> opaque{};
  uint64_t arena_bytes = 0;
};
static_assert(sizeof(ArenaIpcHandle) == 72);

// An arena of another process mapped into this one: a copy source / destination here.
struct ArenaMapping {
  MappingId id = 0;
  std::byte* base = nullptr;  // device pointer in this process
  uint64_t bytes = 0;
};

enum class CopyKind : int32_t { kHostToDevice = 0, kDeviceToHost = 1, kDeviceToDevice = 2 };

class DeviceMemory {
 public:
  virtual ~DeviceMemory() = default;

  // What this object runs on and whether it is usable. Cheap after the first call (cached).
  virtual DeviceInfo Probe() = 0;

  // A new arena of `bytes` (> 0; CUDA rounds nothing, the stand-in rounds to pages internally).
  // RESOURCE_EXHAUSTED when the device is out of memory.
  virtual GpuStatus AllocateArena(uint64_t bytes, Arena* out) = 0;
  // REQUIRES: no mapping of the arena is open in another process (CUDA IPC does not keep it
  // alive). NOT_FOUND for an unknown id.
  virtual GpuStatus FreeArena(ArenaId id) = 0;

  // Synchronous copy of `bytes` (0 is a no-op). The device side(s) must lie in one arena or
  // mapping each.
  virtual GpuStatus Copy(CopyKind kind, void* dst, const void* src, uint64_t bytes) = 0;

  // Streams (queues) for asynchronous copies.
  virtual GpuStatus CreateStream(StreamId* out) = 0;
  virtual GpuStatus DestroyStream(StreamId stream) = 0;
  // Queues a copy on `stream`; errors found before queueing are returned, later ones by
  // Synchronize.
  virtual GpuStatus CopyAsync(CopyKind kind, void* dst, const void* src, uint64_t bytes,
                              StreamId stream) = 0;
  // Waits for every copy queued on `stream`.
  virtual GpuStatus Synchronize(StreamId stream) = 0;

  // IPC. ExportArena may be called any number of times; the handle stays valid while the arena
  // lives. OpenArena maps a handle exported by ANOTHER process (CUDA cannot open its own
  // process's handles); map each arena once and keep the mapping. CloseArena unmaps.
  virtual GpuStatus ExportArena(ArenaId id, ArenaIpcHandle* out) = 0;
  virtual GpuStatus OpenArena(const ArenaIpcHandle& handle, ArenaMapping* out) = 0;
  virtual GpuStatus CloseArena(MappingId mapping) = 0;

  // Page-locks host memory [data, data + bytes) for DMA (cudaHostRegister), so copies between it
  // and the device need no staging buffer. A range may not overlap one registered already
  // (INVALID_ARGUMENT); it stays registered until UnregisterHost(data) (NOT_FOUND unless `data`
  // starts a registered range), which must come before the memory is unmapped. The stand-in
  // checks and records the ranges and pins nothing.
  virtual GpuStatus RegisterHost(void* data, uint64_t bytes) = 0;
  virtual GpuStatus UnregisterHost(void* data) = 0;
  // Bytes registered now.
  virtual uint64_t registered_host_bytes() = 0;
};

struct HostStandInOptions {
  // Simulated device: total bytes of arenas (RESOURCE_EXHAUSTED beyond), and whether Probe()
  // reports a usable device (false lets tests drive the "no device" start-up path).
  uint64_t device_bytes = uint64_t{16} << 30;
  bool usable = true;
  std::string unusable_reason = "host stand-in configured as unusable";
};

// The host-memory stand-in for a GPU. Arenas are memfd_create() files mapped MAP_SHARED and
// page aligned; a handle names the exporting process and the file, so OpenArena in another
// process (a fork()ed child, or an exec()ed one while the exporter lives) maps the same pages.
// Unlike CUDA, it can also open handles of its own process. Async copies complete immediately.
std::unique_ptr<DeviceMemory> NewHostStandInMemory(const HostStandInOptions& options = {});

const char* CopyKindName(CopyKind kind);

}  // namespace kvcache::gpu

#endif  // KVCACHE_GPU_DEVICE_MEMORY_H_
