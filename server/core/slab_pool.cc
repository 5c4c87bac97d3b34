// SlabPool implementation: a thread-safe facade over the central lists
// (SlabCentral, slab_central.h: spans, classes, runs, compaction), guarded
// by mu_, with the per-thread caches (ChunkStripes, slab_stripes.h) in
// front.
//
// A chunk in a stripe is out of the central lists (SlabCentral counts it as
// live and allocated); GetStats and GetClassStats subtract what the stripes
// hold, under every stripe's lock, so they count chunks handed out. Lock
// order: a stripe's lock, then mu_.
//
// has_draining_ mirrors "the class has draining spans" for the fast paths,
// which read it under their stripe's lock: it turns true only under every
// stripe's lock (PlanCompaction), so an Allocate or Free that reads false
// ran before the plan (its chunks were flushed by it) or after a plan that
// drains none of the class. It turns false, under mu_ only, once the
// class's last draining span is released or stops draining; a stale true
// only sends a call to the central lists.
#include "server/core/slab_pool.h"

#include <algorithm>
#include <array>
#include <atomic>
#include <bit>
#include <cstdint>
#include <memory>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "server/common/asan_poison.h"
#include "server/common/mutex.h"
#include "server/common/status_macros.h"
#include "server/core/slab_central.h"
#include "server/core/slab_stripes.h"

namespace kvcache {
namespace {

constexpr uint64_t kMinSlabBytes = uint64_t{64} << 10;
constexpr uint64_t kMaxSlabBytes = uint64_t{1} << 30;
constexpr uint64_t kMinClassBytes = 64;  // also the chunk alignment
constexpr int kNoClass = -1;
constexpr uint64_t kMaxThreadCacheBytes = uint64_t{16} << 20;
// Per-thread caches: the largest cached class, and the most chunks a bin holds.
constexpr uint64_t kMaxCachedChunkBytes = uint64_t{64} << 10;
constexpr uint64_t kMaxBinChunks = 64;

absl::Status CheckPowerOfTwo(absl::string_view field, uint64_t value, uint64_t lo, uint64_t hi) {
  if (!std::has_single_bit(value) || value < lo || value > hi) {
    return absl::InvalidArgumentError(absl::StrCat(
        "slab_pool.", field, " is ", value, "; it must be a power of two in ", lo, "..", hi));
  }
  return absl::OkStatus();
}

// What the stripes cache per class index (see Per-thread caches in slab_pool.h).
std::vector<CachedClass> CachedClasses(const SlabPoolOptions& options) {
  std::vector<CachedClass> out(SlabClassCount(options));
  for (size_t i = 0; i < out.size(); ++i) {
    const uint64_t chunk = SlabClassChunkBytes(options, i);
    if (chunk == 0 || chunk > kMaxCachedChunkBytes) continue;
    out[i] = CachedClass{.chunk_bytes = chunk,
                         .bin_chunks = static_cast<uint32_t>(
                             std::min(kMaxBinChunks, options.thread_cache_bytes / (4 * chunk)))};
  }
  return out;
}

class SlabPoolImpl final : public SlabPool {
 public:
  SlabPoolImpl(const SlabPoolOptions& options, std::shared_ptr<HostMemoryRegistrar> registrar)
      : options_(options),
        stripes_(CachedClasses(options), options.thread_cache_bytes),
        has_draining_(new std::atomic<bool>[SlabClassCount(options)]()),
        central_(options, std::move(registrar)) {}

  absl::StatusOr<Allocation> Allocate(uint64_t bytes) override {
    if (bytes == 0) return absl::InvalidArgumentError("SlabPool::Allocate: bytes must be > 0");
    if (bytes > options_.capacity_bytes) {
      return absl::InvalidArgumentError(absl::StrCat("SlabPool::Allocate: bytes is ", bytes,
                                                     "; it exceeds capacity_bytes ",
                                                     options_.capacity_bytes));
    }
    const uint64_t rounded = RoundedSize(bytes);
    if (const int cached = CachedClassOf(rounded); cached != kNoClass) {
      if (std::byte* chunk = AllocateFromStripe(cached); chunk != nullptr) {
        return Allocation{chunk, rounded};
      }
    }
    {
      MutexLock lock(&mu_);
      absl::StatusOr<Allocation> result = central_.Allocate(rounded, /*may_take_draining=*/false);
      if (result.ok()) return result;
    }
    // Chunks parked in the stripes may be all that is free: return them and
    // try once more, a draining span now included.
    FlushThreadCaches();
    MutexLock lock(&mu_);
    absl::StatusOr<Allocation> result = central_.Allocate(rounded, /*may_take_draining=*/true);
    if (result.ok()) {
      if (rounded <= options_.slab_bytes) SyncDraining(SlabClassIndex(options_, rounded));
    } else {
      ++failed_allocations_;
    }
    return result;
  }

  void Free(Allocation allocation) override {
    if (const int cached = CachedClassOf(allocation.bytes);
        cached != kNoClass && FreeToStripe(cached, allocation)) {
      return;
    }
    MutexLock lock(&mu_);
    FreeCentral(allocation);
  }

  void FlushThreadCaches() override {
    std::vector<std::pair<int, std::byte*>> chunks;
    for (size_t i = 0; i < stripes_.count(); ++i) {
      ChunkStripe& stripe = stripes_.Stripe(i);
      if (stripe.SeemsEmpty()) continue;
      StripeLockHolder stripe_lock(&stripe.mu);
      chunks.clear();
      stripe.TakeAll(&chunks);
      if (chunks.empty()) continue;
      MutexLock lock(&mu_);
      for (const auto& [class_index, chunk] : chunks) ReturnCached(class_index, chunk);
    }
  }

  uint64_t RoundedSize(uint64_t bytes) const override { return SlabRoundedSize(options_, bytes); }

  SlabPoolStats GetStats() const override {
    AllStripesLock stripes(stripes_);
    MutexLock lock(&mu_);
    uint64_t cached_bytes = 0, cached_chunks = 0;
    for (size_t i = 0; i < stripes_.count(); ++i) {
      const ChunkStripe& stripe = stripes_.Stripe(i);
      stripe.mu.AssertHeld();
      cached_bytes += stripe.cached_bytes();
      cached_chunks += stripe.cached_chunks();
    }
    SlabPoolStats stats = central_.Stats();
    stats.allocated_bytes -= cached_bytes;
    stats.live_allocations -= cached_chunks;
    stats.cached_bytes = cached_bytes;
    stats.failed_allocations = failed_allocations_;
    return stats;
  }

  std::vector<SlabClassStats> GetClassStats() const override {
    AllStripesLock stripes(stripes_);
    MutexLock lock(&mu_);
    return central_.ClassStats([this](int class_index) {
      uint64_t cached = 0;
      for (size_t i = 0; i < stripes_.count(); ++i) {
        const ChunkStripe& stripe = stripes_.Stripe(i);
        stripe.mu.AssertHeld();  // every stripe is locked (above)
        cached += stripe.cached_chunks(class_index);
      }
      return cached;
    });
  }

  absl::StatusOr<CompactionPlan> PlanCompaction(const CompactionPlanOptions& options) override {
    if (!(options.max_span_occupancy >= 0 && options.max_span_occupancy <= 1)) {
      return absl::InvalidArgumentError(
          absl::StrCat("SlabPool::PlanCompaction: max_span_occupancy is ",
                       options.max_span_occupancy, "; it must be in 0..1"));
    }
    // Every stripe's lock for the whole plan: the stripes are emptied, and
    // the fast paths read has_draining_ either before the plan (their chunks
    // are flushed here) or after it.
    AllStripesLock stripes(stripes_);
    MutexLock lock(&mu_);
    std::vector<std::pair<int, std::byte*>> chunks;
    for (size_t i = 0; i < stripes_.count(); ++i) {
      ChunkStripe& stripe = stripes_.Stripe(i);
      stripe.mu.AssertHeld();
      stripe.TakeAll(&chunks);
    }
    for (const auto& [class_index, chunk] : chunks) ReturnCached(class_index, chunk);
    CompactionPlan plan = central_.PlanCompaction(options);
    for (size_t i = 0; i < SlabClassCount(options_); ++i) {
      has_draining_[i].store(central_.HasDrainingSpans(static_cast<int>(i)),
                             std::memory_order_relaxed);
    }
    return plan;
  }

  absl::StatusOr<Allocation> AllocateMoveTarget(const Allocation& source) override {
    if (source.bytes == 0 || source.bytes > options_.slab_bytes ||
        RoundedSize(source.bytes) != source.bytes) {
      return absl::InvalidArgumentError(
          absl::StrCat("SlabPool::AllocateMoveTarget: source.bytes is ", source.bytes,
                       "; it must be a size class (large runs are never moved)"));
    }
    MutexLock lock(&mu_);
    return central_.AllocateMoveTarget(source.bytes);
  }

 private:
  // The class index of `bytes` when the stripes cache it (it is a class
  // size, 64-byte multiple and cached), else kNoClass.
  int CachedClassOf(uint64_t bytes) const {
    if (bytes > kMaxCachedChunkBytes || bytes > options_.slab_bytes || bytes == 0 ||
        RoundedSize(bytes) != bytes) {
      return kNoClass;
    }
    const int class_index = SlabClassIndex(options_, bytes);
    return stripes_.Caches(class_index) ? class_index : kNoClass;
  }

  // A chunk of the cached class from the calling thread's stripe, refilling
  // its bin with a batch from the central lists when empty (never from a
  // draining span, never reserving more than one new span); nullptr when the
  // class has draining spans or the central lists have no chunk without
  // passing capacity.
  std::byte* AllocateFromStripe(int class_index) {
    ChunkStripe& stripe = stripes_.Mine();
    StripeLockHolder stripe_lock(&stripe.mu);
    // While a plan drains spans of the class, its free chunks elsewhere are
    // the plan's move targets: no batch takes them (and the bins are empty).
    if (has_draining_[class_index].load(std::memory_order_relaxed)) return nullptr;
    std::byte* chunk = stripe.Pop(class_index);
    if (chunk == nullptr) {
      std::array<std::byte*, kMaxBinChunks> batch;
      const uint64_t want =
          std::min<uint64_t>(stripes_.Class(class_index).Batch(), 1 + stripe.Room(class_index));
      uint64_t got;
      {
        MutexLock lock(&mu_);
        got = central_.TakeChunks(class_index, want, batch.data());
      }
      if (got == 0) return nullptr;
      chunk = batch[0];
      const uint64_t chunk_bytes = stripes_.Class(class_index).chunk_bytes;
      for (uint64_t i = got; i-- > 1;) {  // batch[1] ends up popped first
        ASAN_POISON_MEMORY_REGION(batch[i], chunk_bytes);
        stripe.Push(class_index, batch[i]);
      }
    }
    ASAN_UNPOISON_MEMORY_REGION(chunk, stripes_.Class(class_index).chunk_bytes);
    return chunk;
  }

  // Parks a freed chunk of the cached class in the calling thread's stripe,
  // first returning the older half of a full bin; false (nothing done) when
  // the chunk must go to the central lists: its class has draining spans,
  // or the stripe holds its bytes' worth already.
  bool FreeToStripe(int class_index, const Allocation& allocation) {
    ChunkStripe& stripe = stripes_.Mine();
    StripeLockHolder stripe_lock(&stripe.mu);
    if (has_draining_[class_index].load(std::memory_order_relaxed)) return false;
    if (!stripe.HasRoom(class_index)) {
      std::vector<std::byte*> spill;
      stripe.TakeOldest(class_index, stripes_.Class(class_index).Batch(), &spill);
      if (!spill.empty()) {
        MutexLock lock(&mu_);
        for (std::byte* chunk : spill) ReturnCached(class_index, chunk);
      }
      if (!stripe.HasRoom(class_index)) return false;
    }
    ASAN_POISON_MEMORY_REGION(allocation.data, allocation.bytes);
    stripe.Push(class_index, allocation.data);
    return true;
  }

  // Free's path through the central lists.
  void FreeCentral(const Allocation& allocation) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    central_.Free(allocation);
    if (allocation.bytes <= options_.slab_bytes) {
      SyncDraining(SlabClassIndex(options_, allocation.bytes));
    }
  }

  // A chunk a stripe held (poisoned) back to its span.
  void ReturnCached(int class_index, std::byte* chunk) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    const uint64_t chunk_bytes = stripes_.Class(class_index).chunk_bytes;
    ASAN_UNPOISON_MEMORY_REGION(chunk, chunk_bytes);
    FreeCentral(Allocation{chunk, chunk_bytes});
  }

  // Clears the class's has_draining_ once it has no draining span left (a
  // span released or taken back into service).
  void SyncDraining(int class_index) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (has_draining_[class_index].load(std::memory_order_relaxed) &&
        !central_.HasDrainingSpans(class_index)) {
      has_draining_[class_index].store(false, std::memory_order_relaxed);
    }
  }

  const SlabPoolOptions options_;
  // The stripes lock themselves (their own locks, taken before mu_).
  mutable ChunkStripes stripes_;
  // Per class index: whether the class has draining spans (see the top).
  const std::unique_ptr<std::atomic<bool>[]> has_draining_;
  mutable Mutex mu_;
  SlabCentral central_ ABSL_GUARDED_BY(mu_);
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
  if (thread_cache_bytes > kMaxThreadCacheBytes) {
    return absl::InvalidArgumentError(absl::StrCat("slab_pool.thread_cache_bytes is ",
                                                   thread_cache_bytes, "; it must be at most ",
                                                   kMaxThreadCacheBytes));
  }
  if (capacity_bytes < slab_bytes) {
    return absl::InvalidArgumentError(absl::StrCat("slab_pool.capacity_bytes is ", capacity_bytes,
                                                   "; it must hold at least one slab (slab_bytes ",
                                                   slab_bytes, ")"));
  }
  return absl::OkStatus();
}

void SlabPoolStats::VisitCounters(CounterVisitor& visitor) const {
  visitor.Visit({"kvcached_pool_drained_spans_total",
                 "Host pool spans released after compaction drained them", CounterType::kCounter},
                drained_spans);
  visitor.Visit(
      {"kvcached_host_pool_pinned_bytes",
       "Host pool memory page-locked with the GPU tier's device (gpu_tier.pin_host_memory)",
       CounterType::kGauge},
      pinned_bytes);
  visitor.Visit({"kvcached_host_pool_cached_bytes",
                 "Free host pool chunks parked in the per-CPU caches (their spans stay reserved)",
                 CounterType::kGauge},
                cached_bytes);
  visitor.Visit(
      {"kvcached_host_pool_pin_failures_total",
       "Host pool mappings the device refused to page-lock (used unpinned)", CounterType::kCounter},
      pin_failures);
}

bool CompactionPlan::Contains(const std::byte* data) const {
  auto it = std::lower_bound(moves.begin(), moves.end(), data,
                             [](const Allocation& a, const std::byte* d) { return a.data < d; });
  return it != moves.end() && it->data == data;
}

absl::StatusOr<std::unique_ptr<SlabPool>> SlabPool::Create(
    const SlabPoolOptions& options, std::shared_ptr<HostMemoryRegistrar> registrar) {
  KVCACHE_RETURN_IF_ERROR(options.Validate());
  return std::unique_ptr<SlabPool>(new SlabPoolImpl(options, std::move(registrar)));
}

}  // namespace kvcache
