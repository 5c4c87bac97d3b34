// kvcache/gpu/arena_allocator.h: carves device arenas into block slots. Pure CPU logic: it
// deals in (arena id, offset) pairs, never dereferences memory, and gets arenas from a callback.
//
// Each arena (arena_bytes) is cut into slabs (slab_bytes, a power of two). A request of at most
// one slab is rounded up to a size class (min_block_bytes .. slab_bytes): the powers of two p and
// the quarter steps between them (1.25p, 1.5p, 1.75p; where p / 4 >= 256), so a slot wastes at
// most a fifth of itself, as the host pool's classes do. A slab serves one class at a time,
// holding floor(slab_bytes / class) slots (the tail after the last is unused), and goes back to
// the free-slab list when its last slot is freed, so any class can reuse it. Blocks larger than a
// slab are rejected (INVALID_ARGUMENT): the GPU tier stores KV blocks, which are sized well below a
// slab. When no slab is free the allocator asks the ArenaSource for one more arena, as long as the
// arenas reserved stay within capacity_bytes (the tier's hard limit); otherwise Allocate fails
// with RESOURCE_EXHAUSTED and the caller evicts and retries. Arenas are kept until destruction.
//
// Slot offsets in a slab are multiples of their class size, and every class is a multiple of 256
// bytes; arenas from DeviceMemory are at least 256-byte aligned, so every slot is too.
//
// Thread-safe: every method may be called concurrently. The ArenaSource is called with the
// allocator's lock held (arenas are added rarely) and must not call back into the allocator.
#ifndef KVCACHE_GPU_ARENA_ALLOCATOR_H_
#define KVCACHE_GPU_ARENA_ALLOCATOR_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include "kvcache/gpu/device_memory.h"
#include "kvcache/gpu/status.h"

namespace kvcache::gpu {

struct ArenaAllocatorOptions {
  uint64_t capacity_bytes = uint64_t{8} << 30;    // hard limit on arenas reserved
  uint64_t arena_bytes = uint64_t{1} << 30;       // multiple of slab_bytes, <= capacity_bytes
  uint64_t slab_bytes = uint64_t{8} << 20;        // power of two, >= min_block_bytes; largest block
  uint64_t min_block_bytes = uint64_t{64} << 10;  // power of two, >= 256

  // INVALID_ARGUMENT naming the field that is out of range.
  GpuStatus Validate() const;
};

// A slot: `bytes` is its class size (>= the request) at `offset` in arena `arena`.
struct BlockSlot {
  ArenaId arena = 0;
  uint64_t offset = 0;
  uint64_t bytes = 0;
};

struct ArenaAllocatorStats {
  uint64_t capacity_bytes = 0;
  uint64_t reserved_bytes = 0;   // arenas obtained so far
  uint64_t allocated_bytes = 0;  // sum of live slot (class) sizes
  uint64_t requested_bytes = 0;  // sum of live request sizes
  uint64_t live_blocks = 0;
  uint64_t arenas = 0;
  uint64_t free_slabs = 0;
  uint64_t failed_allocations = 0;  // RESOURCE_EXHAUSTED answers so far
  // requested_bytes / reserved_bytes (0 when nothing is reserved): how much of the reserved
  // device memory holds block bytes.
  double utilization() const {
    return reserved_bytes == 0 ? 0.0 : static_cast<double>(requested_bytes) / reserved_bytes;
  }
};

// Provides one new arena of `bytes`; its id must be unique and non-zero.
using ArenaSource = std::function<GpuStatus(uint64_t bytes, ArenaId* id)>;

class ArenaAllocator {
 public:
  // INVALID_ARGUMENT when options do not validate or source is empty.
  static GpuStatus Create(const ArenaAllocatorOptions& options, ArenaSource source,
                          std::unique_ptr<ArenaAllocator>* out);

  virtual ~ArenaAllocator() = default;

  // A slot of at least `bytes` (1 .. slab_bytes). RESOURCE_EXHAUSTED when full (capacity
  // reached or the source failed with RESOURCE_EXHAUSTED); the source's other errors as is.
  virtual GpuStatus Allocate(uint64_t bytes, BlockSlot* out) = 0;
  // Frees a slot from Allocate (arena and offset identify it; bytes is checked against the
  // class). NOT_FOUND for an unknown arena, INVALID_ARGUMENT for an offset that is not a live
  // slot (double free, wrong class, misaligned).
  virtual GpuStatus Free(const BlockSlot& slot) = 0;

  // The arenas obtained so far, in the order obtained.
  virtual std::vector<ArenaId> Arenas() const = 0;
  virtual ArenaAllocatorStats Stats() const = 0;
  // The class a request of `bytes` gets; 0 when it is out of range.
  virtual uint64_t ClassBytes(uint64_t bytes) const = 0;
};

}  // namespace kvcache::gpu

#endif  // KVCACHE_GPU_ARENA_ALLOCATOR_H_
