// SlabPool implementation.
//
// Layout: every class slab is a slab_bytes-sized mapping aligned to
// slab_bytes, so Free() finds the slab owning a chunk by masking the address
// (`addr & ~(slab_bytes - 1)`) and looking the base up in `slabs_`. A slab
// carves its chunks lazily (a bump index) and keeps freed chunks on an
// intrusive singly linked list threaded through the chunks themselves. Each
// class keeps an intrusive doubly linked list of its slabs that still have a
// free chunk, so Allocate() and Free() are O(1) for class sizes. Under ASan
// free chunks are poisoned, so a stale read of pool memory is reported.
//
// Large runs are their own page-aligned mappings. A freed run is kept mapped
// on a free-run list and reused by the next run of the same size, so a model
// whose blocks are larger than a slab does not pay mmap, munmap and a page
// fault per page for every block it stores.
//
// Accounting: reserved_bytes_ counts class slabs and runs in use. Free slabs
// and free runs stay mapped for reuse (not counted as reserved); whenever new
// memory must be mapped, cached free runs and slabs are unmapped first as
// needed, so that mapped memory (reserved plus cached) never exceeds
// capacity_bytes either. A request therefore fails exactly when
// reserved_bytes_ plus what it must reserve would pass capacity_bytes.
#include "server/core/slab_pool.h"

#include <sys/mman.h>

#include <algorithm>
#include <bit>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <utility>
#include <vector>

#include "absl/base/config.h"
#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "server/core/mutex.h"

#if defined(__has_include) && __has_include(<sanitizer/asan_interface.h>)
#include <sanitizer/asan_interface.h>  // no-op macros unless built with ASan
#endif
#ifndef ASAN_POISON_MEMORY_REGION
#define ASAN_POISON_MEMORY_REGION(addr, size) ((void)(addr), (void)(size))
#define ASAN_UNPOISON_MEMORY_REGION(addr, size) ((void)(addr), (void)(size))
#endif

namespace kvcache {
namespace {

constexpr uint64_t kMinSlabBytes = uint64_t{64} << 10;
constexpr uint64_t kMaxSlabBytes = uint64_t{1} << 30;
constexpr uint64_t kMinClassBytes = 64;  // also the chunk alignment
constexpr int kNoClass = -1;

absl::Status CheckPowerOfTwo(absl::string_view field, uint64_t value, uint64_t lo, uint64_t hi) {
  if (!std::has_single_bit(value) || value < lo || value > hi) {
    return absl::InvalidArgumentError(absl::StrCat(
        "slab_pool.", field, " is ", value, "; it must be a power of two in ", lo, "..", hi));
  }
  return absl::OkStatus();
}

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

// Size classes between powers of two (see RoundedSize), for classes of at
// least kMinSteppedClass bytes (so every class stays a multiple of 64 bytes).
constexpr int kStepsPerDoubling = 4;
constexpr uint64_t kMinSteppedClass = 256;

// One class slab; on its class's partial list while 0 < live < chunk_count
// (or just after TakeSlab), on the free-slab list while live == 0. Owned by SlabPoolImpl::slabs_;
// guarded by SlabPoolImpl::mu_.
struct Slab {
  std::byte* base = nullptr;
  int class_index = kNoClass;  // kNoClass while on the free-slab list
  uint64_t chunk_bytes = 0;
  uint64_t chunk_count = 0;
  uint64_t carved = 0;             // chunks [0, carved) were handed out since assignment
  uint64_t live = 0;               // chunks handed out and not freed
  std::byte* free_head = nullptr;  // intrusive list of freed chunks
  Slab* prev = nullptr;            // links in the class's partial list
  Slab* next = nullptr;
};

class SlabPoolImpl final : public SlabPool {
 public:
  explicit SlabPoolImpl(const SlabPoolOptions& options)
      : options_(options),
        min_class_shift_(std::countr_zero(options.min_class_bytes)),
        partial_((std::countr_zero(options.slab_bytes) - min_class_shift_ + 1) * kStepsPerDoubling,
                 nullptr) {}

  ~SlabPoolImpl() override {
    MutexLock lock(&mu_);
    for (auto& [base, slab] : slabs_) Unmap(slab->base, options_.slab_bytes);
    for (auto& [data, bytes] : runs_) Unmap(data, bytes);
    for (auto& [data, bytes] : free_runs_) Unmap(data, bytes);
  }

  absl::StatusOr<Allocation> Allocate(uint64_t bytes) override {
    if (bytes == 0) return absl::InvalidArgumentError("SlabPool::Allocate: bytes must be > 0");
    if (bytes > options_.capacity_bytes) {
      return absl::InvalidArgumentError(absl::StrCat("SlabPool::Allocate: bytes is ", bytes,
                                                     "; it exceeds capacity_bytes ",
                                                     options_.capacity_bytes));
    }
    const uint64_t rounded = RoundedSize(bytes);
    MutexLock lock(&mu_);
    absl::StatusOr<Allocation> result =
        rounded > options_.slab_bytes ? AllocateRun(rounded) : AllocateChunk(rounded);
    if (result.ok()) {
      allocated_bytes_ += result->bytes;
      ++live_allocations_;
    } else {
      ++failed_allocations_;
    }
    return result;
  }

  void Free(Allocation allocation) override {
    MutexLock lock(&mu_);
    if (allocation.bytes > options_.slab_bytes) {
      FreeRun(allocation);
    } else {
      FreeChunk(allocation);
    }
    allocated_bytes_ -= allocation.bytes;
    --live_allocations_;
  }

  uint64_t RoundedSize(uint64_t bytes) const override {
    if (bytes == 0) return 0;
    const uint64_t slab = options_.slab_bytes;
    if (bytes <= slab) {
      // Classes: powers of two, and from kMinSteppedClass up three steps
      // between each power and the next (1.25, 1.5, 1.75 times it), so a
      // block compressed to a little over half its size saves a third of it.
      const uint64_t b = std::max(options_.min_class_bytes, bytes);
      const uint64_t p = std::bit_floor(b);
      if (b == p) return p;
      if (p < kMinSteppedClass) return 2 * p;
      const uint64_t step = p / kStepsPerDoubling;
      return p + (b - p + step - 1) / step * step;
    }
    const uint64_t slabs = bytes / slab + (bytes % slab != 0 ? 1 : 0);
    return slabs > UINT64_MAX / slab ? UINT64_MAX : slabs * slab;  // saturates
  }

  SlabPoolStats GetStats() const override {
    MutexLock lock(&mu_);
    return SlabPoolStats{options_.capacity_bytes, options_.slab_bytes, reserved_bytes_,
                         allocated_bytes_,        live_allocations_,   failed_allocations_};
  }

 private:
  absl::Status Exhausted(absl::string_view what, uint64_t need) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "SlabPool: reserving ", need, " bytes for ", what, " would take reserved_bytes from ",
        reserved_bytes_, " past capacity_bytes ", options_.capacity_bytes));
  }

  absl::StatusOr<Allocation> AllocateRun(uint64_t run_bytes) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
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
    }
    runs_.emplace(data, run_bytes);
    reserved_bytes_ += run_bytes;
    return Allocation{data, run_bytes};
  }

  void FreeRun(const Allocation& allocation) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    auto it = runs_.find(allocation.data);
    if (it == runs_.end() || it->second != allocation.bytes) Die("Free of an unknown large run");
    runs_.erase(it);
    reserved_bytes_ -= allocation.bytes;
    ASAN_POISON_MEMORY_REGION(allocation.data, allocation.bytes);
    free_runs_.emplace_back(allocation.data, allocation.bytes);
    free_run_bytes_ += allocation.bytes;
  }

  // Unmaps cached free runs, then cached free slabs, until `bytes` more can be
  // mapped without mapped memory passing capacity_bytes.
  void MakeRoomToMap(uint64_t bytes) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    const uint64_t capacity = options_.capacity_bytes;
    auto mapped = [&] {
      mu_.AssertHeld();  // the lambda runs under the lock
      return reserved_bytes_ + free_run_bytes_ + free_slabs_.size() * options_.slab_bytes;
    };
    while (!free_runs_.empty() && mapped() + bytes > capacity) {
      Unmap(free_runs_.back().first, free_runs_.back().second);
      free_run_bytes_ -= free_runs_.back().second;
      free_runs_.pop_back();
    }
    while (!free_slabs_.empty() && mapped() + bytes > capacity) {
      Slab* slab = free_slabs_.back();
      free_slabs_.pop_back();
      Unmap(slab->base, options_.slab_bytes);
      slabs_.erase(reinterpret_cast<uintptr_t>(slab->base));
    }
  }

  // Index into partial_ of the class of size `chunk_bytes` (a RoundedSize value).
  int ClassIndex(uint64_t chunk_bytes) const {
    const uint64_t p = std::bit_floor(chunk_bytes);
    const int step =
        p < kMinSteppedClass ? 0 : static_cast<int>((chunk_bytes - p) / (p / kStepsPerDoubling));
    return (std::countr_zero(p) - min_class_shift_) * kStepsPerDoubling + step;
  }

  absl::StatusOr<Allocation> AllocateChunk(uint64_t chunk_bytes)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    const int class_index = ClassIndex(chunk_bytes);
    Slab* slab = partial_[class_index];
    if (slab == nullptr) {
      absl::StatusOr<Slab*> taken = TakeSlab(class_index, chunk_bytes);
      if (!taken.ok()) return taken.status();
      slab = *taken;
    }
    std::byte* chunk;
    if (slab->free_head != nullptr) {
      chunk = slab->free_head;
      ASAN_UNPOISON_MEMORY_REGION(chunk, chunk_bytes);
      std::memcpy(&slab->free_head, chunk, sizeof(std::byte*));
    } else {
      chunk = slab->base + slab->carved++ * chunk_bytes;
      ASAN_UNPOISON_MEMORY_REGION(chunk, chunk_bytes);
    }
    if (++slab->live == slab->chunk_count) RemovePartial(slab);
    return Allocation{chunk, chunk_bytes};
  }

  void FreeChunk(const Allocation& allocation) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    const uintptr_t addr = reinterpret_cast<uintptr_t>(allocation.data);
    auto it = slabs_.find(addr & ~(options_.slab_bytes - 1));
    if (it == slabs_.end()) Die("Free of memory no slab owns");
    Slab* slab = it->second.get();
    const uint64_t offset = static_cast<uint64_t>(allocation.data - slab->base);
    if (slab->class_index == kNoClass || slab->chunk_bytes != allocation.bytes ||
        offset % slab->chunk_bytes != 0 || offset / slab->chunk_bytes >= slab->carved ||
        slab->live == 0) {
      Die("Free of a chunk whose size or offset does not match its slab");
    }
    std::memcpy(allocation.data, &slab->free_head, sizeof(std::byte*));
    slab->free_head = allocation.data;
    ASAN_POISON_MEMORY_REGION(allocation.data, allocation.bytes);
    const bool was_full = slab->live == slab->chunk_count;
    if (--slab->live == 0) {
      if (!was_full) RemovePartial(slab);  // a one-chunk slab was never re-listed
      slab->class_index = kNoClass;
      free_slabs_.push_back(slab);
      reserved_bytes_ -= options_.slab_bytes;
    } else if (was_full) {
      PushPartial(slab);
    }
  }

  // A slab for `class_index`, from the free-slab list or newly mapped, on the
  // class's partial list.
  absl::StatusOr<Slab*> TakeSlab(int class_index, uint64_t chunk_bytes)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    const uint64_t slab_bytes = options_.slab_bytes;
    if (slab_bytes > options_.capacity_bytes - reserved_bytes_) {
      return Exhausted(absl::StrCat("a slab of ", chunk_bytes, "-byte chunks"), slab_bytes);
    }
    Slab* slab;
    if (!free_slabs_.empty()) {
      slab = free_slabs_.back();
      free_slabs_.pop_back();
    } else {
      MakeRoomToMap(slab_bytes);
      std::byte* base = Map(slab_bytes, slab_bytes);
      if (base == nullptr) {
        return absl::ResourceExhaustedError(
            absl::StrCat("SlabPool: mmap of a slab failed: errno ", errno));
      }
      ASAN_POISON_MEMORY_REGION(base, slab_bytes);
      auto owned = std::make_unique<Slab>();
      owned->base = base;
      slab = owned.get();
      slabs_.emplace(reinterpret_cast<uintptr_t>(base), std::move(owned));
    }
    *slab = Slab{.base = slab->base,
                 .class_index = class_index,
                 .chunk_bytes = chunk_bytes,
                 .chunk_count = slab_bytes / chunk_bytes};
    reserved_bytes_ += slab_bytes;
    PushPartial(slab);
    return slab;
  }

  void PushPartial(Slab* slab) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    Slab*& head = partial_[slab->class_index];
    slab->prev = nullptr;
    slab->next = head;
    if (head != nullptr) head->prev = slab;
    head = slab;
  }

  void RemovePartial(Slab* slab) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (slab->prev != nullptr) {
      slab->prev->next = slab->next;
    } else {
      partial_[slab->class_index] = slab->next;
    }
    if (slab->next != nullptr) slab->next->prev = slab->prev;
    slab->prev = slab->next = nullptr;
  }

  const SlabPoolOptions options_;
  const int min_class_shift_;

  mutable Mutex mu_;
  // Every mapped class slab (in use or free), by base address.
  absl::flat_hash_map<uintptr_t, std::unique_ptr<Slab>> slabs_ ABSL_GUARDED_BY(mu_);
  // Per class (ClassIndex): head of its slabs with a free chunk.
  std::vector<Slab*> partial_ ABSL_GUARDED_BY(mu_);
  std::vector<Slab*> free_slabs_ ABSL_GUARDED_BY(mu_);                   // mapped, serving no class
  absl::flat_hash_map<std::byte*, uint64_t> runs_ ABSL_GUARDED_BY(mu_);  // data -> bytes
  // Freed runs kept mapped for reuse: (data, bytes), and their total.
  std::vector<std::pair<std::byte*, uint64_t>> free_runs_ ABSL_GUARDED_BY(mu_);
  uint64_t free_run_bytes_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t reserved_bytes_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t allocated_bytes_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t live_allocations_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t failed_allocations_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace

absl::Status SlabPoolOptions::Validate() const {
  if (auto s = CheckPowerOfTwo("slab_bytes", slab_bytes, kMinSlabBytes, kMaxSlabBytes); !s.ok()) {
    return s;
  }
  if (auto s = CheckPowerOfTwo("min_class_bytes", min_class_bytes, kMinClassBytes, slab_bytes);
      !s.ok()) {
    return s;
  }
  if (capacity_bytes < slab_bytes) {
    return absl::InvalidArgumentError(absl::StrCat("slab_pool.capacity_bytes is ", capacity_bytes,
                                                   "; it must hold at least one slab (slab_bytes ",
                                                   slab_bytes, ")"));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<SlabPool>> SlabPool::Create(const SlabPoolOptions& options) {
  if (absl::Status s = options.Validate(); !s.ok()) return s;
  return std::unique_ptr<SlabPool>(new SlabPoolImpl(options));
}

}  // namespace kvcache
