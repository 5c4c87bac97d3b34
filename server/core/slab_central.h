// SlabCentral: a SlabPool's central lists: the size classes, their spans
// and chunks, the free spans and large runs, pinning, and compaction plans,
// exactly as slab_pool.h describes them apart from the per-thread caches
// (which sit in front, in slab_pool.cc and slab_stripes.h).
//
// Not thread-safe: the pool owns one and calls every method under its
// mutex. allocated/live counts (Stats, ClassStats) count chunks out of the
// central lists, which includes chunks the per-thread caches hold; the pool
// subtracts those. The free functions below (class geometry) are pure and
// need no lock.
#ifndef KVCACHE_SERVER_CORE_SLAB_CENTRAL_H_
#define KVCACHE_SERVER_CORE_SLAB_CENTRAL_H_

#include <algorithm>
#include <array>
#include <bit>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/functional/function_ref.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "server/core/slab_pool.h"

namespace kvcache {

// Size classes between powers of two, for classes of at least
// kSlabMinSteppedClass bytes (so every class stays a multiple of 64 bytes).
inline constexpr int kSlabStepsPerDoubling = 4;
inline constexpr uint64_t kSlabMinSteppedClass = 256;
static_assert(kSlabStepsPerDoubling == 4, "SlabClassIndex shifts by log2(4)");

// The usable size SlabPool::Allocate(bytes) hands out: the class size, or
// the run size (whole slabs, saturating) above slab_bytes; 0 for 0. Inline
// and without a division: Allocate and Free call it on their fast path.
inline uint64_t SlabRoundedSize(const SlabPoolOptions& options, uint64_t bytes) {
  if (bytes == 0) return 0;
  const uint64_t slab = options.slab_bytes;
  if (bytes <= slab) {
    // Classes: powers of two, and from kSlabMinSteppedClass up three steps
    // between each power and the next (1.25, 1.5, 1.75 times it), so a
    // block compressed to a little over half its size saves a third of it.
    const uint64_t b = std::max(options.min_class_bytes, bytes);
    const uint64_t p = std::bit_floor(b);
    if (b == p) return p;
    if (p < kSlabMinSteppedClass) return 2 * p;
    const uint64_t step = p / kSlabStepsPerDoubling;  // a power of two
    return (b + step - 1) & ~(step - 1);
  }
  const uint64_t slabs = bytes / slab + (bytes % slab != 0 ? 1 : 0);
  return slabs > UINT64_MAX / slab ? UINT64_MAX : slabs * slab;  // saturates
}

// How many class indices the options give (some are no class).
size_t SlabClassCount(const SlabPoolOptions& options);

// The index of the class of `chunk_bytes`, which must be a SlabRoundedSize
// value of at most slab_bytes.
inline int SlabClassIndex(const SlabPoolOptions& options, uint64_t chunk_bytes) {
  const uint64_t p = std::bit_floor(chunk_bytes);
  const int power = std::countr_zero(p);
  // (chunk_bytes - p) / (p / kSlabStepsPerDoubling), p / 4 being 2^(power - 2)
  const int step =
      p < kSlabMinSteppedClass ? 0 : static_cast<int>((chunk_bytes - p) >> (power - 2));
  return (power - std::countr_zero(options.min_class_bytes)) * kSlabStepsPerDoubling + step;
}
// The chunk size of class index `class_index`; 0 when the index is no class.
uint64_t SlabClassChunkBytes(const SlabPoolOptions& options, size_t class_index);

class SlabCentral {
 public:
  // REQUIRES: options.Validate() is ok.
  SlabCentral(const SlabPoolOptions& options, std::shared_ptr<HostMemoryRegistrar> registrar);
  ~SlabCentral();  // unmaps (and unpins) every mapping, live or not
  SlabCentral(const SlabCentral&) = delete;
  SlabCentral& operator=(const SlabCentral&) = delete;

  // A chunk of class size `rounded` (or a run, above slab_bytes). A chunk
  // comes from a draining span only when `may_take_draining` and nothing
  // else serves it within capacity (the span then stops draining).
  // RESOURCE_EXHAUSTED as SlabPool::Allocate.
  absl::StatusOr<Allocation> Allocate(uint64_t rounded, bool may_take_draining);
  // Up to `n` chunks of class `class_index` into `out`, fullest span first,
  // never from a draining span, reserving a new span only for the first.
  // Returns how many.
  uint64_t TakeChunks(int class_index, uint64_t n, std::byte** out);
  // Dies on a chunk or run this pool did not hand out (or handed back).
  void Free(const Allocation& allocation);
  // A chunk of class size `chunk_bytes` in a partly used span that is not
  // draining; RESOURCE_EXHAUSTED when there is none.
  absl::StatusOr<Allocation> AllocateMoveTarget(uint64_t chunk_bytes);
  // REQUIRES: 0 <= options.max_span_occupancy <= 1.
  CompactionPlan PlanCompaction(const CompactionPlanOptions& options);
  bool HasDrainingSpans(int class_index) const { return !classes_[class_index].draining.empty(); }

  // Everything but failed_allocations and cached_bytes (the pool's own).
  SlabPoolStats Stats() const;
  // Per class, live_chunks less `cached_chunks(class_index)`.
  std::vector<SlabClassStats> ClassStats(absl::FunctionRef<uint64_t(int)> cached_chunks) const;

 private:
  // Partly used spans of a class are kept in kFullnessBuckets lists by the
  // fraction of their chunks in use; a chunk comes from the fullest
  // non-empty bucket, so sparse spans drain and free instead of being
  // refilled.
  static constexpr int kFullnessBuckets = 16;
  // The longest span, in slabs (see "Spans" in slab_pool.h).
  static constexpr uint64_t kMaxSpanSlabs = 8;

  // One span of `slabs` contiguous class slabs: on its class's fullness
  // bucket `bucket` while 0 < live < chunk_count, unlisted (bucket -1) while
  // full, on free_spans_[slabs] while serving no class; unlisted while
  // draining. Owned by spans_.
  struct Span {
    std::byte* base = nullptr;
    uint64_t slabs = 1;
    int class_index = -1;  // -1 while free
    int bucket = -1;
    bool draining = false;  // in the current compaction plan (on SizeClass::draining)
    uint64_t chunk_bytes = 0;
    uint64_t chunk_count = 0;
    uint64_t carved = 0;             // chunks [0, carved) were handed out since assignment
    uint64_t live = 0;               // chunks handed out and not freed
    std::byte* free_head = nullptr;  // intrusive list of freed chunks
    Span* prev = nullptr;            // links in the bucket's list
    Span* next = nullptr;
  };

  // A size class: its chunk, span shape, partly used spans and counters.
  struct SizeClass {
    uint64_t chunk_bytes = 0;
    uint64_t span_slabs = 1;
    uint64_t chunk_count = 0;  // chunks per span
    // floor(2^32 * kFullnessBuckets / chunk_count): a span's bucket is
    // (live * bucket_scale) >> 32 (<= live * 16 / chunk_count, no division).
    uint64_t bucket_scale = 0;
    std::array<Span*, kFullnessBuckets> partial{};
    uint32_t nonempty = 0;        // bit b set iff partial[b] != nullptr
    uint64_t spans = 0;           // spans serving the class
    uint64_t live = 0;            // chunks live
    std::vector<Span*> draining;  // spans of the current compaction plan (live > 0)
  };

  void AppendLiveChunks(const Span& span, std::vector<Allocation>* out);
  Allocation TakeChunk(SizeClass& c, Span* span);
  void StopDraining(SizeClass& c, Span* span);
  absl::Status Exhausted(absl::string_view what, uint64_t need) const;
  absl::StatusOr<Allocation> AllocateRun(uint64_t run_bytes);
  void FreeRun(const Allocation& allocation);
  void MakeRoomToMap(uint64_t bytes);
  absl::StatusOr<Allocation> AllocateChunk(uint64_t chunk_bytes, bool may_take_draining);
  void FreeChunk(const Allocation& allocation);
  absl::StatusOr<Span*> TakeSpan(int class_index);
  Span* Register(std::byte* base, uint64_t slabs);
  void SplitIntoSlabs(Span* span);
  void Pin(std::byte* data, uint64_t bytes);
  bool Unpin(std::byte* data);
  void Release(std::byte* data, uint64_t bytes);
  void Relist(SizeClass& c, Span* span);
  void Unlist(SizeClass& c, Span* span);

  const SlabPoolOptions options_;
  const std::shared_ptr<HostMemoryRegistrar> registrar_;  // null: pin nothing
  // Per class index (SlabClassIndex); entries that are no class have chunk_bytes 0.
  std::vector<SizeClass> classes_;
  // Every mapped span (in use or free), by base address, and the span owning
  // each of their slabs, by slab base address.
  absl::flat_hash_map<uintptr_t, std::unique_ptr<Span>> spans_;
  absl::flat_hash_map<uintptr_t, Span*> slab_owner_;
  // Mapped spans serving no class, by length in slabs (index 0 unused), and their bytes.
  std::array<std::vector<Span*>, kMaxSpanSlabs + 1> free_spans_;
  uint64_t free_span_bytes_ = 0;
  absl::flat_hash_map<std::byte*, uint64_t> runs_;  // data -> bytes
  // Freed runs kept mapped for reuse: (data, bytes), and their total.
  std::vector<std::pair<std::byte*, uint64_t>> free_runs_;
  uint64_t free_run_bytes_ = 0;
  uint64_t reserved_bytes_ = 0;
  uint64_t allocated_bytes_ = 0;  // chunks and runs out of the central lists
  uint64_t live_allocations_ = 0;
  uint64_t drained_spans_ = 0;
  uint64_t move_targets_ = 0;
  // Ranges the registrar registered (base -> bytes).
  absl::flat_hash_map<std::byte*, uint64_t> pinned_;
  uint64_t pinned_bytes_ = 0;
  uint64_t pin_failures_ = 0;
};

}  // namespace kvcache

#endif  // KVCACHE_SERVER_CORE_SLAB_CENTRAL_H_
