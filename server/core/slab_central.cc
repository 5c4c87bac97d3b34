// SlabCentral: the central lists of a SlabPool (slab_central.h).
//
// Layout: every class span is its own mapping of k slabs (see the header),
// aligned to slab_bytes, and each of its slabs is registered in `slab_owner_`
// by base address, so Free() finds the span owning a chunk by masking the
// chunk's address (`addr & ~(slab_bytes - 1)`: the slab it starts in) and one
// hash lookup. A span carves its chunks lazily (a bump index) and keeps freed
// chunks on an intrusive singly linked list threaded through the chunks
// themselves. Each class keeps its partly used spans in 16 intrusive doubly
// linked lists by fullness (live * 16 / chunks) and a bit mask of the
// non-empty ones, so Allocate() takes the fullest in O(1) and Free() moves a
// span between lists in O(1). Under ASan free chunks are poisoned, so a stale
// read of pool memory is reported.
//
// Compaction: a draining span is off its class's buckets (so neither
// Allocate nor AllocateMoveTarget picks it) and on the class's `draining`
// list; PlanCompaction finds its live chunks by marking the chunks on its
// free list among those carved. Allocate falls back to a draining span only
// when the class has no other free chunk and no span can be reserved, so the
// capacity contract stays exact while a plan is under way.
//
// Free spans stay mapped on free_spans_[k]. A one-slab class with none free
// splits a free longer span into one-slab spans (munmap can later release
// each slab alone); a longer span is never assembled from scattered free
// slabs: it is mapped fresh after unmapping cached memory as needed. That
// costs page faults when the mix of span lengths changes, never capacity.
//
// Large runs are their own page-aligned mappings. A freed run is kept mapped
// on a free-run list and reused by the next run of the same size, so a model
// whose blocks are larger than a slab does not pay mmap, munmap and a page
// fault per page for every block it stores.
//
// Compaction, capacity and the per-thread caches: SlabPool (slab_pool.cc)
// flushes its caches before it plans or answers RESOURCE_EXHAUSTED; here a
// chunk in a cache counts as live.
//
// Accounting: reserved_bytes_ counts class spans and runs in use. Free spans
// and free runs stay mapped for reuse (not counted as reserved); whenever new
// memory must be mapped, cached free runs and spans are unmapped first as
// needed, so that mapped memory (reserved plus cached) never exceeds
// capacity_bytes either. A request therefore fails exactly when
// reserved_bytes_ plus what it must reserve would pass capacity_bytes.
#include "server/core/slab_central.h"

#include <sys/mman.h>

#include <algorithm>
#include <array>
#include <bit>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "server/common/asan_poison.h"

namespace kvcache {
namespace {

[[noreturn]] void Die(absl::string_view what) {
  std::fprintf(stderr, "SlabPool: %.*s\n", static_cast<int>(what.size()), what.data());
  std::abort();
}

constexpr uint64_t kHugePageBytes = uint64_t{2} << 20;

// An anonymous read-write mapping of `bytes`, page aligned and also aligned to
// `alignment` (a power of two) when given; nullptr when the kernel refuses.
std::byte* Map(uint64_t bytes, uint64_t alignment = 0) {
  // Over-map by `alignment`, then trim to the aligned part.
  void* raw =
      mmap(nullptr, bytes + alignment, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (raw == MAP_FAILED) return nullptr;
  auto* start = static_cast<std::byte*>(raw);
  if (alignment != 0) {
    const uintptr_t addr = reinterpret_cast<uintptr_t>(raw);
    const uint64_t head = ((addr + alignment - 1) & ~(alignment - 1)) - addr;
    if (head > 0) munmap(start, head);
    if (alignment - head > 0) munmap(start + head + bytes, alignment - head);
    start += head;
  }
  // Transparent huge pages where the kernel offers them on request: a block
  // written into fresh pool memory then faults once per 2 MiB, not per 4 KiB.
  if (bytes >= kHugePageBytes) madvise(start, bytes, MADV_HUGEPAGE);
  return start;
}

void Unmap(std::byte* data, uint64_t bytes) {
  ASAN_UNPOISON_MEMORY_REGION(data, bytes);
  munmap(data, bytes);
}

constexpr int kStepsPerDoubling = kSlabStepsPerDoubling;
constexpr uint64_t kMinSteppedClass = kSlabMinSteppedClass;

// Spans: a class takes its memory in spans of 1..SlabCentral::kMaxSpanSlabs
// contiguous slabs, the fewest whose unused tail stays under
// 1/kTailWasteDivisor of the span (else the span with the smallest tail
// fraction).
constexpr uint64_t kTailWasteDivisor = 256;

// The span length (in slabs) for chunks of `chunk_bytes` in slabs of
// `slab_bytes`, at most `max_slabs`; see kMaxSpanSlabs.
uint64_t SpanSlabs(uint64_t chunk_bytes, uint64_t slab_bytes, uint64_t max_slabs) {
  uint64_t best = 1;
  double best_waste = 1.0;
  for (uint64_t k = 1; k <= max_slabs; ++k) {
    const uint64_t span = k * slab_bytes;
    const uint64_t tail = span % chunk_bytes;
    if (tail * kTailWasteDivisor < span) return k;
    const double waste = static_cast<double>(tail) / static_cast<double>(span);
    if (waste < best_waste) {
      best_waste = waste;
      best = k;
    }
  }
  return best;
}

}  // namespace

size_t SlabClassCount(const SlabPoolOptions& options) {
  return static_cast<size_t>(std::countr_zero(options.slab_bytes) -
                             std::countr_zero(options.min_class_bytes) + 1) *
         kStepsPerDoubling;
}

uint64_t SlabClassChunkBytes(const SlabPoolOptions& options, size_t class_index) {
  const int power =
      std::countr_zero(options.min_class_bytes) + static_cast<int>(class_index) / kStepsPerDoubling;
  const uint64_t p = uint64_t{1} << power;
  const int step = static_cast<int>(class_index) % kStepsPerDoubling;
  if (step != 0 && p < kMinSteppedClass) return 0;  // not a class
  const uint64_t chunk = p + step * (p / kStepsPerDoubling);
  return chunk > options.slab_bytes ? 0 : chunk;
}

SlabCentral::SlabCentral(const SlabPoolOptions& options,
                         std::shared_ptr<HostMemoryRegistrar> registrar)
    : options_(options), registrar_(std::move(registrar)), classes_(SlabClassCount(options)) {
  for (size_t i = 0; i < classes_.size(); ++i) {
    const uint64_t chunk = SlabClassChunkBytes(options, i);
    if (chunk == 0) continue;
    SizeClass& c = classes_[i];
    c.chunk_bytes = chunk;
    // A span never needs more than the whole capacity.
    c.span_slabs = SpanSlabs(chunk, options.slab_bytes,
                             std::min(kMaxSpanSlabs, options.capacity_bytes / options.slab_bytes));
    c.chunk_count = c.span_slabs * options.slab_bytes / chunk;
    c.bucket_scale = (uint64_t{kFullnessBuckets} << 32) / c.chunk_count;
  }
}

SlabCentral::~SlabCentral() {
  for (auto& [base, span] : spans_) Release(span->base, span->slabs * options_.slab_bytes);
  for (auto& [data, bytes] : runs_) Release(data, bytes);
  for (auto& [data, bytes] : free_runs_) Release(data, bytes);
}

absl::StatusOr<Allocation> SlabCentral::Allocate(uint64_t rounded, bool may_take_draining) {
  absl::StatusOr<Allocation> result = rounded > options_.slab_bytes
                                          ? AllocateRun(rounded)
                                          : AllocateChunk(rounded, may_take_draining);
  if (result.ok()) {
    allocated_bytes_ += result->bytes;
    ++live_allocations_;
  }
  return result;
}

uint64_t SlabCentral::TakeChunks(int class_index, uint64_t n, std::byte** out) {
  SizeClass& c = classes_[class_index];
  uint64_t got = 0;
  while (got < n) {
    Span* span;
    if (c.nonempty != 0) {
      span = c.partial[31 - std::countl_zero(c.nonempty)];  // the fullest bucket
    } else if (got == 0) {
      absl::StatusOr<Span*> taken = TakeSpan(class_index);
      if (!taken.ok()) break;
      span = *taken;
    } else {
      break;
    }
    out[got++] = TakeChunk(c, span).data;
  }
  allocated_bytes_ += got * c.chunk_bytes;
  live_allocations_ += got;
  return got;
}

void SlabCentral::Free(const Allocation& allocation) {
  if (allocation.bytes > options_.slab_bytes) {
    FreeRun(allocation);
  } else {
    FreeChunk(allocation);
  }
  allocated_bytes_ -= allocation.bytes;
  --live_allocations_;
}

absl::StatusOr<Allocation> SlabCentral::AllocateMoveTarget(uint64_t chunk_bytes) {
  SizeClass& c = classes_[SlabClassIndex(options_, chunk_bytes)];
  if (c.nonempty == 0) {
    return absl::ResourceExhaustedError(
        absl::StrCat("SlabPool: no free ", chunk_bytes,
                     "-byte chunk outside draining spans to move a chunk to"));
  }
  const Allocation target = TakeChunk(c, c.partial[31 - std::countl_zero(c.nonempty)]);
  allocated_bytes_ += target.bytes;
  ++live_allocations_;
  ++move_targets_;
  return target;
}

CompactionPlan SlabCentral::PlanCompaction(const CompactionPlanOptions& options) {
  CompactionPlan plan;
  for (SizeClass& c : classes_) {  // end the previous plan
    for (Span* span : c.draining) {
      span->draining = false;
      Relist(c, span);
    }
    c.draining.clear();
  }
  for (SizeClass& c : classes_) {
    if (c.chunk_bytes == 0 || c.nonempty == 0) continue;
    std::vector<Span*> partial;
    uint64_t free = 0;  // free chunks in the class's listed spans
    for (Span* head : c.partial) {
      for (Span* span = head; span != nullptr; span = span->next) {
        partial.push_back(span);
        free += span->chunk_count - span->live;
      }
    }
    if (partial.size() < 2) continue;
    std::sort(partial.begin(), partial.end(), [](const Span* a, const Span* b) {
      return a->live != b->live ? a->live < b->live : a->base < b->base;
    });
    uint64_t moving = 0;  // chunks of the class the plan names so far
    for (Span* span : partial) {
      if (static_cast<double>(span->live) >
          options.max_span_occupancy * static_cast<double>(span->chunk_count)) {
        break;
      }
      // Draining takes the span's free chunks out of the targets; the
      // rest must still hold every chunk named so far and the span's own.
      const uint64_t left = free - (span->chunk_count - span->live);
      if (left < moving + span->live) break;
      if (plan.bytes + span->live * c.chunk_bytes > options.max_bytes) break;
      free = left;
      moving += span->live;
      Unlist(c, span);
      span->draining = true;
      c.draining.push_back(span);
      ++plan.spans;
      plan.bytes += span->live * c.chunk_bytes;
      AppendLiveChunks(*span, &plan.moves);
    }
  }
  std::sort(plan.moves.begin(), plan.moves.end(),
            [](const Allocation& a, const Allocation& b) { return a.data < b.data; });
  return plan;
}

SlabPoolStats SlabCentral::Stats() const {
  uint64_t draining = 0;
  for (const SizeClass& c : classes_) draining += c.draining.size();
  return SlabPoolStats{.capacity_bytes = options_.capacity_bytes,
                       .slab_bytes = options_.slab_bytes,
                       .reserved_bytes = reserved_bytes_,
                       .allocated_bytes = allocated_bytes_,
                       .live_allocations = live_allocations_,
                       .draining_spans = draining,
                       .drained_spans = drained_spans_,
                       .move_targets = move_targets_,
                       .pinned_bytes = pinned_bytes_,
                       .pin_failures = pin_failures_};
}

std::vector<SlabClassStats> SlabCentral::ClassStats(
    absl::FunctionRef<uint64_t(int)> cached_chunks) const {
  std::vector<SlabClassStats> out;
  for (size_t i = 0; i < classes_.size(); ++i) {
    const SizeClass& c = classes_[i];
    if (c.chunk_bytes == 0) continue;
    out.push_back(SlabClassStats{.chunk_bytes = c.chunk_bytes,
                                 .span_bytes = c.span_slabs * options_.slab_bytes,
                                 .chunks_per_span = c.chunk_count,
                                 .spans = c.spans,
                                 .live_chunks = c.live - cached_chunks(static_cast<int>(i))});
  }
  return out;
}

// Appends the live chunks of `span` (carved and not on its free list).
void SlabCentral::AppendLiveChunks(const Span& span, std::vector<Allocation>* out) {
  std::vector<bool> is_free(span.carved, false);
  for (std::byte* chunk = span.free_head; chunk != nullptr;) {
    is_free[static_cast<uint64_t>(chunk - span.base) / span.chunk_bytes] = true;
    ASAN_UNPOISON_MEMORY_REGION(chunk, sizeof(std::byte*));
    std::byte* next;
    std::memcpy(&next, chunk, sizeof(std::byte*));
    ASAN_POISON_MEMORY_REGION(chunk, sizeof(std::byte*));
    chunk = next;
  }
  for (uint64_t i = 0; i < span.carved; ++i) {
    if (!is_free[i]) out->push_back(Allocation{span.base + i * span.chunk_bytes, span.chunk_bytes});
  }
}

// Takes a free chunk of `span` (a span of class `c` with one) and relists it.
Allocation SlabCentral::TakeChunk(SizeClass& c, Span* span) {
  const uint64_t chunk_bytes = c.chunk_bytes;
  std::byte* chunk;
  if (span->free_head != nullptr) {
    chunk = span->free_head;
    ASAN_UNPOISON_MEMORY_REGION(chunk, chunk_bytes);
    std::memcpy(&span->free_head, chunk, sizeof(std::byte*));
  } else {
    chunk = span->base + span->carved++ * chunk_bytes;
    ASAN_UNPOISON_MEMORY_REGION(chunk, chunk_bytes);
  }
  ++span->live;
  ++c.live;
  Relist(c, span);
  return Allocation{chunk, chunk_bytes};
}

// Takes `span` out of its class's compaction plan (it serves allocations again).
void SlabCentral::StopDraining(SizeClass& c, Span* span) {
  span->draining = false;
  c.draining.erase(std::find(c.draining.begin(), c.draining.end(), span));
}

absl::Status SlabCentral::Exhausted(absl::string_view what, uint64_t need) const {
  return absl::ResourceExhaustedError(absl::StrCat(
      "SlabPool: reserving ", need, " bytes for ", what, " would take reserved_bytes from ",
      reserved_bytes_, " past capacity_bytes ", options_.capacity_bytes));
}

absl::StatusOr<Allocation> SlabCentral::AllocateRun(uint64_t run_bytes) {
  if (run_bytes > options_.capacity_bytes - reserved_bytes_) {
    return Exhausted("a large run", run_bytes);
  }
  std::byte* data = nullptr;
  auto cached = std::find_if(free_runs_.begin(), free_runs_.end(),
                             [run_bytes](const auto& r) { return r.second == run_bytes; });
  if (cached != free_runs_.end()) {
    data = cached->first;
    *cached = free_runs_.back();
    free_runs_.pop_back();
    free_run_bytes_ -= run_bytes;
    ASAN_UNPOISON_MEMORY_REGION(data, run_bytes);
  } else {
    MakeRoomToMap(run_bytes);
    data = Map(run_bytes);
    if (data == nullptr) {
      return absl::ResourceExhaustedError(
          absl::StrCat("SlabPool: mmap of a ", run_bytes, "-byte run failed: errno ", errno));
    }
    Pin(data, run_bytes);
  }
  runs_.emplace(data, run_bytes);
  reserved_bytes_ += run_bytes;
  return Allocation{data, run_bytes};
}

void SlabCentral::FreeRun(const Allocation& allocation) {
  auto it = runs_.find(allocation.data);
  if (it == runs_.end() || it->second != allocation.bytes) Die("Free of an unknown large run");
  runs_.erase(it);
  reserved_bytes_ -= allocation.bytes;
  ASAN_POISON_MEMORY_REGION(allocation.data, allocation.bytes);
  free_runs_.emplace_back(allocation.data, allocation.bytes);
  free_run_bytes_ += allocation.bytes;
}

// Unmaps cached free runs, then cached free spans (longest first), until
// `bytes` more can be mapped without mapped memory passing capacity_bytes.
void SlabCentral::MakeRoomToMap(uint64_t bytes) {
  const uint64_t capacity = options_.capacity_bytes;
  auto mapped = [&] { return reserved_bytes_ + free_run_bytes_ + free_span_bytes_; };
  while (!free_runs_.empty() && mapped() + bytes > capacity) {
    Release(free_runs_.back().first, free_runs_.back().second);
    free_run_bytes_ -= free_runs_.back().second;
    free_runs_.pop_back();
  }
  for (uint64_t k = kMaxSpanSlabs; k >= 1 && mapped() + bytes > capacity; --k) {
    while (!free_spans_[k].empty() && mapped() + bytes > capacity) {
      Span* span = free_spans_[k].back();
      free_spans_[k].pop_back();
      free_span_bytes_ -= k * options_.slab_bytes;
      Release(span->base, k * options_.slab_bytes);
      for (uint64_t i = 0; i < k; ++i) {
        slab_owner_.erase(reinterpret_cast<uintptr_t>(span->base + i * options_.slab_bytes));
      }
      spans_.erase(reinterpret_cast<uintptr_t>(span->base));
    }
  }
}

// A chunk of the class, from a draining span only when `may_take_draining`
// and nothing else is left within capacity (the span then stops draining).
absl::StatusOr<Allocation> SlabCentral::AllocateChunk(uint64_t chunk_bytes,
                                                      bool may_take_draining) {
  const int class_index = SlabClassIndex(options_, chunk_bytes);
  SizeClass& c = classes_[class_index];
  Span* span;
  if (c.nonempty != 0) {
    span = c.partial[31 - std::countl_zero(c.nonempty)];  // the fullest bucket
  } else {
    absl::StatusOr<Span*> taken = TakeSpan(class_index);
    if (taken.ok()) {
      span = *taken;
    } else if (may_take_draining && !c.draining.empty()) {
      // The last free chunks of the class are in spans being drained: a
      // plan never makes a request fail that would succeed without it.
      span = c.draining.back();
      StopDraining(c, span);
    } else {
      return taken.status();
    }
  }
  return TakeChunk(c, span);
}

void SlabCentral::FreeChunk(const Allocation& allocation) {
  const uintptr_t addr = reinterpret_cast<uintptr_t>(allocation.data);
  auto it = slab_owner_.find(addr & ~(options_.slab_bytes - 1));
  if (it == slab_owner_.end()) Die("Free of memory no slab owns");
  Span* span = it->second;
  const uint64_t offset = static_cast<uint64_t>(allocation.data - span->base);
  if (span->class_index == -1 || span->chunk_bytes != allocation.bytes ||
      offset % span->chunk_bytes != 0 || offset / span->chunk_bytes >= span->carved ||
      span->live == 0) {
    Die("Free of a chunk whose size or offset does not match its span");
  }
  std::memcpy(allocation.data, &span->free_head, sizeof(std::byte*));
  span->free_head = allocation.data;
  ASAN_POISON_MEMORY_REGION(allocation.data, allocation.bytes);
  SizeClass& c = classes_[span->class_index];
  --span->live;
  --c.live;
  if (span->live == 0) {
    if (span->draining) {
      StopDraining(c, span);
      ++drained_spans_;
    }
    Unlist(c, span);
    span->class_index = -1;
    --c.spans;
    const uint64_t span_bytes = span->slabs * options_.slab_bytes;
    reserved_bytes_ -= span_bytes;
    free_spans_[span->slabs].push_back(span);
    free_span_bytes_ += span_bytes;
  } else if (!span->draining) {
    Relist(c, span);
  }
}

// A span for class `class_index`, unlisted with no chunk live: a cached
// free span of its length, else one slab split off a longer cached span
// (for one-slab classes), else newly mapped.
absl::StatusOr<SlabCentral::Span*> SlabCentral::TakeSpan(int class_index) {
  SizeClass& c = classes_[class_index];
  const uint64_t k = c.span_slabs;
  const uint64_t span_bytes = k * options_.slab_bytes;
  if (span_bytes > options_.capacity_bytes - reserved_bytes_) {
    return Exhausted(absl::StrCat("a span of ", k, " slabs of ", c.chunk_bytes, "-byte chunks"),
                     span_bytes);
  }
  Span* span = nullptr;
  if (!free_spans_[k].empty()) {
    span = free_spans_[k].back();
    free_spans_[k].pop_back();
  } else if (k == 1) {
    for (uint64_t j = 2; j <= kMaxSpanSlabs && span == nullptr; ++j) {
      if (free_spans_[j].empty()) continue;
      span = free_spans_[j].back();
      free_spans_[j].pop_back();
      SplitIntoSlabs(span);
      free_spans_[1].pop_back();  // SplitIntoSlabs listed the first slab (this span)
    }
  }
  if (span != nullptr) {
    free_span_bytes_ -= span_bytes;
  } else {
    MakeRoomToMap(span_bytes);
    std::byte* base = Map(span_bytes, options_.slab_bytes);
    if (base == nullptr) {
      return absl::ResourceExhaustedError(
          absl::StrCat("SlabPool: mmap of a ", span_bytes, "-byte span failed: errno ", errno));
    }
    ASAN_POISON_MEMORY_REGION(base, span_bytes);
    Pin(base, span_bytes);
    span = Register(base, k);
  }
  *span = Span{.base = span->base,
               .slabs = k,
               .class_index = class_index,
               .chunk_bytes = c.chunk_bytes,
               .chunk_count = c.chunk_count};
  reserved_bytes_ += span_bytes;
  ++c.spans;
  return span;
}

// A new Span for the mapping [base, base + slabs * slab_bytes), owning its slabs.
SlabCentral::Span* SlabCentral::Register(std::byte* base, uint64_t slabs) {
  auto owned = std::make_unique<Span>();
  owned->base = base;
  owned->slabs = slabs;
  Span* span = owned.get();
  spans_.emplace(reinterpret_cast<uintptr_t>(base), std::move(owned));
  for (uint64_t i = 0; i < slabs; ++i) {
    slab_owner_.insert_or_assign(reinterpret_cast<uintptr_t>(base + i * options_.slab_bytes), span);
  }
  return span;
}

// Turns a free span of several slabs (off every list) into one-slab free
// spans on free_spans_[1], the span's own first slab pushed last.
void SlabCentral::SplitIntoSlabs(Span* span) {
  // Each slab may be unmapped alone from now on, so each is registered
  // alone (the span is free: no copy reads it meanwhile).
  if (Unpin(span->base)) {
    for (uint64_t i = 0; i < span->slabs; ++i) {
      Pin(span->base + i * options_.slab_bytes, options_.slab_bytes);
    }
  }
  for (uint64_t i = span->slabs - 1; i >= 1; --i) {
    free_spans_[1].push_back(Register(span->base + i * options_.slab_bytes, 1));
  }
  span->slabs = 1;
  free_spans_[1].push_back(span);
}

// Registers a range just mapped with the registrar, if there is one.
void SlabCentral::Pin(std::byte* data, uint64_t bytes) {
  if (registrar_ == nullptr) return;
  if (!registrar_->Register(data, bytes).ok()) {
    ++pin_failures_;
    return;
  }
  pinned_.emplace(data, bytes);
  pinned_bytes_ += bytes;
}
// Unregisters the range starting at `data` if it was registered; whether it was.
bool SlabCentral::Unpin(std::byte* data) {
  auto it = pinned_.find(data);
  if (it == pinned_.end()) return false;
  registrar_->Unregister(data, it->second);
  pinned_bytes_ -= it->second;
  pinned_.erase(it);
  return true;
}
// Unpins and unmaps a mapping (a span or a run).
void SlabCentral::Release(std::byte* data, uint64_t bytes) {
  Unpin(data);
  Unmap(data, bytes);
}

// Puts `span` on the bucket for its fullness (off the lists while full).
void SlabCentral::Relist(SizeClass& c, Span* span) {
  const int bucket =
      span->live == span->chunk_count ? -1 : static_cast<int>((span->live * c.bucket_scale) >> 32);
  if (bucket == span->bucket) return;
  Unlist(c, span);
  if (bucket < 0) return;
  Span*& head = c.partial[bucket];
  span->prev = nullptr;
  span->next = head;
  if (head != nullptr) head->prev = span;
  head = span;
  span->bucket = bucket;
  c.nonempty |= uint32_t{1} << bucket;
}

void SlabCentral::Unlist(SizeClass& c, Span* span) {
  if (span->bucket < 0) return;
  if (span->prev != nullptr) {
    span->prev->next = span->next;
  } else {
    c.partial[span->bucket] = span->next;
    if (span->next == nullptr) c.nonempty &= ~(uint32_t{1} << span->bucket);
  }
  if (span->next != nullptr) span->next->prev = span->prev;
  span->prev = span->next = nullptr;
  span->bucket = -1;
}

}  // namespace kvcache
