// kvcache/gpu/arena_mappings.h: a worker's side of the GPU tier: the daemon's arenas mapped into
// the worker process, one mapping per arena, kept for the worker's session.
//
// A worker session creates one ArenaMappings over its own DeviceMemory, maps the arenas the
// daemon exported (GpuBlockPool::Export) as it learns of them, and resolves block handles to
// device pointers here to copy device-to-device between its KV buffers and the daemon's slots.
// Destroying the ArenaMappings (the session ends) closes every mapping. Thread-safe; the
// DeviceMemory must outlive it.
#ifndef KVCACHE_GPU_ARENA_MAPPINGS_H_
#define KVCACHE_GPU_ARENA_MAPPINGS_H_

#include <cstddef>
#include <cstdint>
#include <unordered_map>

#include "kvcache/gpu/device_memory.h"
#include "kvcache/gpu/gpu_block_pool.h"
#include "kvcache/gpu/mutex.h"
#include "kvcache/gpu/status.h"

namespace kvcache::gpu {

class ArenaMappings {
 public:
  explicit ArenaMappings(DeviceMemory* device) : device_(device) {}
  ArenaMappings(const ArenaMappings&) = delete;
  ArenaMappings& operator=(const ArenaMappings&) = delete;
  ~ArenaMappings();

  // Maps the arena unless it is mapped already (then OK, nothing done).
  GpuStatus Map(const ExportedArena& arena);
  // The device pointer, in this process, of `bytes` bytes at `offset` of arena `arena`.
  // NOT_FOUND when the arena is not mapped; INVALID_ARGUMENT when the range leaves it.
  GpuStatus Resolve(ArenaId arena, uint64_t offset, uint64_t bytes, std::byte** out) const;
  // Closes every mapping (also done on destruction); the first error, after trying all.
  GpuStatus CloseAll();
  size_t size() const;

 private:
  DeviceMemory* const device_;
  mutable Mutex mu_;
  std::unordered_map<ArenaId, ArenaMapping> mappings_ KVCACHE_GPU_GUARDED_BY(mu_);
};

}  // namespace kvcache::gpu

#endif  // KVCACHE_GPU_ARENA_MAPPINGS_H_
