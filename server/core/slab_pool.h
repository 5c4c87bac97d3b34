// SlabPool: the host-memory tier's allocator for block payloads.
//
// Memory is reserved in fixed-size slabs (4 MiB by default). A request of at
// most one slab is rounded up to a size class (min_class_bytes .. slab_bytes):
// the powers of two, and from 256 bytes up also 1.25, 1.5 and 1.75 times each
// power (so a block compressed to 0.55 of its size takes 0.625 of its class,
// not all of it). A slab holds floor(slab_bytes / class) chunks of its class
// (up to 1/8 of a slab stays unused for the stepped classes); each slab
// serves one class at a time and returns to the shared
// free-slab list when its last chunk is freed, so any class can reuse it. A
// request larger than a slab gets its own run of whole slabs. The sum of all
// slabs reserved (class slabs plus large runs) never exceeds capacity_bytes:
// that is the tier's hard limit, and Allocate() fails with RESOURCE_EXHAUSTED
// rather than exceed it. The pool never evicts; its caller frees and retries.
//
// Memory is 64-byte aligned (class chunks) or page aligned (slabs and runs),
// reserved lazily on first use and kept for reuse (free slabs are not returned
// to the OS until the pool is destroyed).
//
// Thread-safe: every method may be called concurrently. The pool must outlive
// every Allocation it handed out.
#ifndef KVCACHE_SERVER_CORE_SLAB_POOL_H_
#define KVCACHE_SERVER_CORE_SLAB_POOL_H_

#include <cstddef>
#include <cstdint>
#include <memory>

#include "absl/status/statusor.h"

namespace kvcache {

struct SlabPoolOptions {
  uint64_t capacity_bytes = uint64_t{1} << 30;  // hard limit on reserved bytes
  uint64_t slab_bytes = uint64_t{4} << 20;      // power of two, >= 64 KiB
  uint64_t min_class_bytes = 64;                // power of two, 64 .. slab_bytes

  // INVALID_ARGUMENT naming the field when out of range; capacity_bytes must
  // hold at least one slab.
  absl::Status Validate() const;
};

// A piece of pool memory. `bytes` is the usable size (the class size or the
// run size), which is at least what was asked for.
struct Allocation {
  std::byte* data = nullptr;
  uint64_t bytes = 0;
};

struct SlabPoolStats {
  uint64_t capacity_bytes = 0;
  uint64_t slab_bytes = 0;
  uint64_t reserved_bytes = 0;   // slabs in use by a class or a large run
  uint64_t allocated_bytes = 0;  // sum of Allocation::bytes currently live
  uint64_t live_allocations = 0;
  uint64_t failed_allocations = 0;  // RESOURCE_EXHAUSTED answers so far
};

class SlabPool {
 public:
  static absl::StatusOr<std::unique_ptr<SlabPool>> Create(const SlabPoolOptions& options);
  virtual ~SlabPool() = default;

  // Returns memory of at least `bytes`. INVALID_ARGUMENT when bytes is 0 or
  // larger than capacity; RESOURCE_EXHAUSTED when no free chunk of the class
  // exists and reserving another slab (or the run) would pass the capacity.
  virtual absl::StatusOr<Allocation> Allocate(uint64_t bytes) = 0;

  // REQUIRES: `allocation` came from Allocate() on this pool and was not freed.
  virtual void Free(Allocation allocation) = 0;

  // The usable size Allocate(bytes) would hand out (class or run size).
  virtual uint64_t RoundedSize(uint64_t bytes) const = 0;

  virtual SlabPoolStats GetStats() const = 0;
};

}  // namespace kvcache

#endif  // KVCACHE_SERVER_CORE_SLAB_POOL_H_
