// SlabPool: the host-memory tier's allocator for block payloads.
//
// Memory is reserved in fixed-size slabs (4 MiB by default). A request of at
// most one slab is rounded up to a size class (min_class_bytes .. slab_bytes):
// the powers of two, and from 256 bytes up also 1.25, 1.5 and 1.75 times each
// power (so a block compressed to 0.55 of its size takes 0.625 of its class,
// not all of it).
//
// Spans: a class takes its memory in spans of k contiguous slabs, k fixed per
// class: the smallest k <= 8 (and <= capacity / slab_bytes) whose unused tail
// (k * slab_bytes mod class) is under 1/256 of the span, else the k with the
// smallest tail fraction. Powers of two and small classes get k = 1; with
// 4 MiB slabs the 80 KiB and 320 KiB classes (5 x 2^k) get k = 5 (no tail)
// where one slab would leave 16 KiB and 256 KiB unused; 1.5 x 2^j classes
// get k = 3 and 1.75 x 2^j classes k = 7 once their tail in one slab is
// 1/256 or more. Chunks never cross their span's end. A span serves
// one class at a time; a new chunk comes from the fullest partly used span of
// its class (by sixteenths), so sparse spans drain. A span is released when
// its last chunk is freed and its memory is then reusable by any class. A
// request larger than a slab gets its own run of whole slabs.
//
// Capacity: the sum of all spans and runs reserved never exceeds
// capacity_bytes: that is the tier's hard limit, and Allocate() fails with
// RESOURCE_EXHAUSTED exactly when reserved bytes plus the span (or run) it
// needs would pass it, whatever the layout of free memory. Each span is its
// own mapping, so contiguity is only ever needed inside a fresh mapping and
// free memory cannot fragment into unusable pieces: a released span is kept
// mapped (not counted as reserved) and reused by the next class with the
// same k; a one-slab class may split a cached longer span into slabs; when
// new memory must be mapped, cached runs and spans are unmapped first, so
// mapped memory (reserved plus cached) never exceeds capacity_bytes either.
// The pool never evicts; its caller frees and retries.
//
// Compaction: under a churn of mixed sizes a class's free chunks scatter over
// many partly used spans, each reserved whole. PlanCompaction() picks, per
// class, the sparsest partly used spans (at most max_span_occupancy of their
// chunks live) whose live chunks fit in the free chunks of the class's other
// partly used spans, marks them draining and names their live chunks. A
// draining span gives no chunk to AllocateMoveTarget() and none to Allocate()
// unless that is the only way to serve it within capacity (then the span
// stops draining). The caller moves each named chunk: AllocateMoveTarget()
// gives a chunk of the same class in a span that is not draining (never a
// new span), the caller copies the bytes, repoints its users and frees the
// source through Free() once nothing reads it. The pool never frees a chunk
// itself: a draining span is released when its last chunk is freed, as any
// span. The next PlanCompaction() ends the previous plan: spans still
// draining (chunks the caller did not move, or not yet freed) serve
// allocations again and may be picked again.
//
// Per-thread caches: Allocate and Free of classes up to 64 KiB go through
// the stripe of the CPU the thread runs on (one stripe per CPU, at least
// 16; threads running at the same time use different stripes), each with
// its own lock and, per class, a bin of free chunks: Allocate takes the chunk its stripe freed
// last, else moves a batch (half a bin) out of the central lists above under
// the pool's lock; Free parks the chunk in its stripe, and a full bin moves
// its older half back. A bin holds at most 64 chunks and
// thread_cache_bytes / (4 x class) chunks, and a stripe at most
// thread_cache_bytes in all (256 KiB by default, so 4 MiB over 16 stripes); larger classes and
// runs, and every class with thread_cache_bytes = 0, take the pool's lock on
// each call as the paragraphs above describe. A cached chunk is free, not
// allocated (stats count chunks handed out; cached_bytes counts the parked
// ones), but it keeps its span reserved: at worst one span per cached chunk
// (a span is released when its last chunk is freed and not cached). That
// never costs capacity or exactness: before Allocate() answers
// RESOURCE_EXHAUSTED (or takes a chunk of a draining span) it returns every
// stripe's chunks to the central lists and tries again, PlanCompaction()
// returns them all before it plans (and while a class has draining spans
// its Allocate and Free bypass the caches, so no batch takes the plan's move
// targets), and FlushThreadCaches() returns them on
// demand: with no live allocation, it leaves reserved_bytes at 0. Cached
// chunks are poisoned under ASan like any free chunk. A chunk's span is
// checked when it returns to the central lists, so a bad Free() of a cached
// class may only be reported then.
//
// Memory is 64-byte aligned (class chunks) or page aligned (spans and runs),
// reserved lazily on first use and kept for reuse (cached free spans are only
// unmapped to make room for a mapping of another shape, or when the pool is
// destroyed).
//
// Thread-safe: every method may be called concurrently. The pool must outlive
// every Allocation it handed out.
#ifndef KVCACHE_SERVER_CORE_SLAB_POOL_H_
#define KVCACHE_SERVER_CORE_SLAB_POOL_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "absl/status/statusor.h"
#include "server/common/counter_visitor.h"

namespace kvcache {

struct SlabPoolOptions {
  uint64_t capacity_bytes = uint64_t{1} << 30;  // hard limit on reserved bytes
  uint64_t slab_bytes = uint64_t{4} << 20;      // power of two, >= 64 KiB
  uint64_t min_class_bytes = 64;                // power of two, 64 .. slab_bytes
  // Most bytes of free chunks one per-thread cache (stripe) parks (see
  // Per-thread caches); 0 turns them off. At most 16 MiB.
  uint64_t thread_cache_bytes = uint64_t{256} << 10;

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
  uint64_t reserved_bytes = 0;   // spans in use by a class, and large runs
  uint64_t allocated_bytes = 0;  // sum of Allocation::bytes currently live
  uint64_t live_allocations = 0;
  uint64_t cached_bytes = 0;        // free chunks parked in per-thread caches (in reserved spans)
  uint64_t failed_allocations = 0;  // RESOURCE_EXHAUSTED answers so far
  uint64_t draining_spans = 0;      // spans of the current compaction plan not yet released
  uint64_t drained_spans = 0;       // spans released while draining, so far
  uint64_t move_targets = 0;        // chunks AllocateMoveTarget handed out, so far
  uint64_t pinned_bytes = 0;        // mapped bytes a HostMemoryRegistrar registered, now
  uint64_t pin_failures = 0;        // mappings it refused (used unpinned), so far

  // The pool's own counters (its size is reported with the host tier's).
  void VisitCounters(CounterVisitor& visitor) const;
};

// Told of every range of memory a SlabPool maps and unmaps, so that a device
// can page-lock it for DMA (the GPU tier: cudaHostRegister). Register() is
// called right after a range is mapped; a range it registered is passed to
// Unregister() with the same data and bytes right before it is unmapped, and
// registered ranges never overlap. A pool uses a range it could not register
// all the same (unpinned), and counts it (SlabPoolStats::pin_failures).
// Called under the pool's lock: implementations must not call back into it.
class HostMemoryRegistrar {
 public:
  virtual ~HostMemoryRegistrar() = default;
  virtual absl::Status Register(std::byte* data, uint64_t bytes) = 0;
  virtual void Unregister(std::byte* data, uint64_t bytes) = 0;
};

struct CompactionPlanOptions {
  // A span is drained only while at most this fraction of its chunks is live.
  double max_span_occupancy = 0.5;
  // Most chunk bytes one plan names (the copying the caller signs up for).
  uint64_t max_bytes = uint64_t{64} << 20;
};

// The live chunks of the spans a plan drains, sorted by address.
struct CompactionPlan {
  std::vector<Allocation> moves;
  uint64_t spans = 0;  // spans marked draining
  uint64_t bytes = 0;  // sum of moves' bytes

  // Whether `data` is the start of a chunk the plan names.
  bool Contains(const std::byte* data) const;
};

// One size class: its chunk, the span its chunks are carved from, and how
// much of it is in use. reserved = spans * span_bytes; the class's share of
// allocated_bytes is live_chunks * chunk_bytes.
struct SlabClassStats {
  uint64_t chunk_bytes = 0;
  uint64_t span_bytes = 0;  // span_slabs * slab_bytes
  uint64_t chunks_per_span = 0;
  uint64_t spans = 0;  // spans serving the class now
  uint64_t live_chunks = 0;
};

class SlabPool {
 public:
  // `registrar` (optional) is told of every mapping the pool makes; it must
  // outlive the pool's mappings (the pool holds a reference).
  static absl::StatusOr<std::unique_ptr<SlabPool>> Create(
      const SlabPoolOptions& options, std::shared_ptr<HostMemoryRegistrar> registrar = nullptr);
  virtual ~SlabPool() = default;

  // Returns memory of at least `bytes`. INVALID_ARGUMENT when bytes is 0 or
  // larger than capacity; RESOURCE_EXHAUSTED when no free chunk of the class
  // exists and reserving another span (or the run) would pass the capacity.
  virtual absl::StatusOr<Allocation> Allocate(uint64_t bytes) = 0;

  // REQUIRES: `allocation` came from Allocate() on this pool and was not freed.
  virtual void Free(Allocation allocation) = 0;

  // The usable size Allocate(bytes) would hand out (class or run size).
  virtual uint64_t RoundedSize(uint64_t bytes) const = 0;

  // Exact (a consistent snapshot): takes every stripe's lock and the pool's.
  virtual SlabPoolStats GetStats() const = 0;

  // Every size class, smallest first (classes with no span included);
  // live_chunks counts chunks handed out, not cached ones.
  virtual std::vector<SlabClassStats> GetClassStats() const = 0;

  // Returns every chunk the per-thread caches hold to the central lists,
  // releasing the spans that only cached chunks kept reserved.
  virtual void FlushThreadCaches() = 0;

  // Ends the previous plan and makes a new one (see Compaction above), after
  // returning the per-thread caches' chunks to the central lists.
  // INVALID_ARGUMENT unless 0 <= max_span_occupancy <= 1.
  virtual absl::StatusOr<CompactionPlan> PlanCompaction(const CompactionPlanOptions& options) = 0;

  // A chunk of `source`'s class in a partly used span that is not draining,
  // to move `source`'s bytes to; `source` stays live (the caller frees it).
  // Counted as an allocation. RESOURCE_EXHAUSTED when the class has no free
  // chunk outside draining spans (no span is reserved for a move);
  // INVALID_ARGUMENT for a large run (runs are never moved).
  // REQUIRES: `source` came from Allocate() or AllocateMoveTarget() on this
  // pool and was not freed.
  virtual absl::StatusOr<Allocation> AllocateMoveTarget(const Allocation& source) = 0;
};

}  // namespace kvcache

#endif  // KVCACHE_SERVER_CORE_SLAB_POOL_H_
