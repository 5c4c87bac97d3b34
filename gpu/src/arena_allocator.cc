#include "kvcache/gpu/arena_allocator.h"

#include <algorithm>
#include <bit>
#include <set>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "kvcache/gpu/mutex.h"

namespace kvcache::gpu {
namespace {

GpuStatus Invalid(const std::string& message) {
  return GpuStatus::Error(GpuCode::kInvalidArgument, message);
}

bool IsPowerOfTwo(uint64_t v) { return v != 0 && (v & (v - 1)) == 0; }

// The smallest step between classes: slot offsets stay multiples of it.
constexpr uint64_t kMinStepBytes = 256;

class ArenaAllocatorImpl final : public ArenaAllocator {
 public:
  ArenaAllocatorImpl(const ArenaAllocatorOptions& options, ArenaSource source)
      : options_(options),
        source_(std::move(source)),
        slabs_per_arena_(options.arena_bytes / options.slab_bytes),
        class_bytes_(ClassSizes(options.min_block_bytes, options.slab_bytes)),
        partial_(class_bytes_.size()) {}

  GpuStatus Allocate(uint64_t bytes, BlockSlot* out) override {
    const int cls = ClassIndex(bytes);
    if (cls < 0) {
      return Invalid("block of " + std::to_string(bytes) + " bytes: must be 1 .. slab_bytes (" +
                     std::to_string(options_.slab_bytes) + ")");
    }
    const uint64_t class_bytes = class_bytes_[cls];
    MutexLock lock(&mu_);
    if (partial_[cls].empty()) {
      if (free_slabs_.empty()) {
        if (GpuStatus s = GrowLocked(); !s.ok()) return s;
      }
      const uint64_t index = *free_slabs_.begin();
      free_slabs_.erase(free_slabs_.begin());
      Slab& slab = slabs_[index];
      slab.cls = cls;
      const uint64_t slots = options_.slab_bytes / class_bytes;
      slab.requested.assign(slots, 0);
      slab.free_slots.clear();
      for (uint64_t i = slots; i-- > 0;) slab.free_slots.push_back(static_cast<uint32_t>(i));
      partial_[cls].insert(index);
    }
    const uint64_t index = *partial_[cls].begin();
    Slab& slab = slabs_[index];
    const uint32_t slot = slab.free_slots.back();
    slab.free_slots.pop_back();
    slab.requested[slot] = bytes;
    ++slab.live;
    if (slab.free_slots.empty()) partial_[cls].erase(index);
    allocated_bytes_ += class_bytes;
    requested_bytes_ += bytes;
    ++live_blocks_;
    *out = {arena_ids_[index / slabs_per_arena_],
            (index % slabs_per_arena_) * options_.slab_bytes + slot * class_bytes, class_bytes};
    return GpuStatus::Ok();
  }

  GpuStatus Free(const BlockSlot& slot) override {
    MutexLock lock(&mu_);
    auto arena = arena_index_.find(slot.arena);
    if (arena == arena_index_.end()) {
      return GpuStatus::Error(GpuCode::kNotFound, "no arena " + std::to_string(slot.arena));
    }
    if (slot.offset >= options_.arena_bytes) {
      return Invalid("offset " + std::to_string(slot.offset) + " is past the arena");
    }
    const uint64_t index = arena->second * slabs_per_arena_ + slot.offset / options_.slab_bytes;
    Slab& slab = slabs_[index];
    const uint64_t in_slab = slot.offset % options_.slab_bytes;
    if (slab.cls < 0) return Invalid(Describe(slot) + " is not allocated");
    const uint64_t class_bytes = class_bytes_[slab.cls];
    if (slot.bytes != class_bytes) {
      return Invalid(Describe(slot) + ": its slab holds " + std::to_string(class_bytes) +
                     "-byte slots");
    }
    if (in_slab % class_bytes != 0) return Invalid(Describe(slot) + " is not a slot start");
    const uint64_t i = in_slab / class_bytes;
    if (i >= slab.requested.size()) return Invalid(Describe(slot) + " is in its slab's tail");
    if (slab.requested[i] == 0) return Invalid(Describe(slot) + " is not allocated");
    allocated_bytes_ -= class_bytes;
    requested_bytes_ -= slab.requested[i];
    --live_blocks_;
    slab.requested[i] = 0;
    slab.free_slots.push_back(static_cast<uint32_t>(i));
    if (--slab.live == 0) {
      partial_[slab.cls].erase(index);
      slab.cls = -1;
      slab.free_slots.clear();
      slab.requested.clear();
      free_slabs_.insert(index);
    } else {
      partial_[slab.cls].insert(index);
    }
    return GpuStatus::Ok();
  }

  std::vector<ArenaId> Arenas() const override {
    MutexLock lock(&mu_);
    return arena_ids_;
  }

  ArenaAllocatorStats Stats() const override {
    MutexLock lock(&mu_);
    ArenaAllocatorStats stats;
    stats.capacity_bytes = options_.capacity_bytes;
    stats.reserved_bytes = arena_ids_.size() * options_.arena_bytes;
    stats.allocated_bytes = allocated_bytes_;
    stats.requested_bytes = requested_bytes_;
    stats.live_blocks = live_blocks_;
    stats.arenas = arena_ids_.size();
    stats.free_slabs = free_slabs_.size();
    stats.failed_allocations = failed_allocations_;
    return stats;
  }

  uint64_t ClassBytes(uint64_t bytes) const override {
    const int cls = ClassIndex(bytes);
    return cls < 0 ? 0 : class_bytes_[cls];
  }

 private:
  struct Slab {
    int cls = -1;                      // size class index; -1 when the slab is free
    uint32_t live = 0;                 // allocated slots
    std::vector<uint32_t> free_slots;  // slot indices, next to hand out at the back
    std::vector<uint64_t> requested;   // per slot: requested bytes, 0 when free
  };

  int ClassIndex(uint64_t bytes) const {
    if (bytes == 0 || bytes > options_.slab_bytes) return -1;
    return static_cast<int>(std::lower_bound(class_bytes_.begin(), class_bytes_.end(), bytes) -
                            class_bytes_.begin());
  }

  // The class sizes, smallest first: each power of two p from min_block_bytes to slab_bytes,
  // and between p and 2p the quarter steps 1.25p, 1.5p and 1.75p where a quarter of p is at
  // least kMinStepBytes (so every slot stays 256-byte aligned in its slab).
  static std::vector<uint64_t> ClassSizes(uint64_t min_block_bytes, uint64_t slab_bytes) {
    std::vector<uint64_t> sizes;
    for (uint64_t p = min_block_bytes; p <= slab_bytes; p *= 2) {
      sizes.push_back(p);
      if (p == slab_bytes || p / 4 < kMinStepBytes) continue;
      for (uint64_t step = 1; step < 4; ++step) sizes.push_back(p + step * (p / 4));
    }
    return sizes;
  }

  static std::string Describe(const BlockSlot& slot) {
    return "slot (arena " + std::to_string(slot.arena) + ", offset " + std::to_string(slot.offset) +
           ", " + std::to_string(slot.bytes) + " bytes)";
  }

  // Adds one arena's slabs to free_slabs_.
  GpuStatus GrowLocked() KVCACHE_GPU_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    const uint64_t reserved = arena_ids_.size() * options_.arena_bytes;
    if (options_.capacity_bytes - reserved < options_.arena_bytes) {
      ++failed_allocations_;
      return GpuStatus::Error(GpuCode::kResourceExhausted,
                              "GPU tier full: " + std::to_string(reserved) + " of " +
                                  std::to_string(options_.capacity_bytes) +
                                  " capacity_bytes reserved and no free slot");
    }
    ArenaId id = 0;
    GpuStatus s = source_(options_.arena_bytes, &id);
    if (!s.ok()) {
      if (s.code == GpuCode::kResourceExhausted) ++failed_allocations_;
      s.message =
          "adding an arena of " + std::to_string(options_.arena_bytes) + " bytes: " + s.message;
      return s;
    }
    if (id == 0 || arena_index_.count(id) != 0) {
      return GpuStatus::Error(GpuCode::kInternal,
                              "arena source returned a zero or duplicate id " + std::to_string(id));
    }
    arena_index_[id] = arena_ids_.size();
    arena_ids_.push_back(id);
    const uint64_t first = slabs_.size();
    slabs_.resize(first + slabs_per_arena_);
    for (uint64_t i = first; i < slabs_.size(); ++i) free_slabs_.insert(i);
    return GpuStatus::Ok();
  }

  const ArenaAllocatorOptions options_;
  const ArenaSource source_;
  const uint64_t slabs_per_arena_;
  const std::vector<uint64_t> class_bytes_;  // by class index, ascending

  mutable Mutex mu_;
  std::vector<ArenaId> arena_ids_ KVCACHE_GPU_GUARDED_BY(mu_);  // arena index -> id
  std::unordered_map<ArenaId, uint64_t> arena_index_ KVCACHE_GPU_GUARDED_BY(mu_);  // id -> index
  // arena index * slabs_per_arena + slab
  std::vector<Slab> slabs_ KVCACHE_GPU_GUARDED_BY(mu_);
  // Ordered: low arenas are reused first.
  std::set<uint64_t> free_slabs_ KVCACHE_GPU_GUARDED_BY(mu_);
  // Per class: slabs with a free slot.
  std::vector<std::set<uint64_t>> partial_ KVCACHE_GPU_GUARDED_BY(mu_);
  uint64_t allocated_bytes_ KVCACHE_GPU_GUARDED_BY(mu_) = 0;
  uint64_t requested_bytes_ KVCACHE_GPU_GUARDED_BY(mu_) = 0;
  uint64_t live_blocks_ KVCACHE_GPU_GUARDED_BY(mu_) = 0;
  uint64_t failed_allocations_ KVCACHE_GPU_GUARDED_BY(mu_) = 0;
};

}  // namespace

GpuStatus ArenaAllocatorOptions::Validate() const {
  if (!IsPowerOfTwo(min_block_bytes) || min_block_bytes < 256) {
    return Invalid("min_block_bytes must be a power of two >= 256, not " +
                   std::to_string(min_block_bytes));
  }
  if (!IsPowerOfTwo(slab_bytes) || slab_bytes < min_block_bytes) {
    return Invalid("slab_bytes must be a power of two >= min_block_bytes, not " +
                   std::to_string(slab_bytes));
  }
  if (slab_bytes / min_block_bytes > (uint64_t{1} << 31)) {
    return Invalid("slab_bytes / min_block_bytes must be at most 2^31");
  }
  if (arena_bytes == 0 || arena_bytes % slab_bytes != 0) {
    return Invalid("arena_bytes must be a positive multiple of slab_bytes, not " +
                   std::to_string(arena_bytes));
  }
  if (capacity_bytes < arena_bytes) {
    return Invalid("capacity_bytes (" + std::to_string(capacity_bytes) +
                   ") must hold at least one arena of " + std::to_string(arena_bytes));
  }
  return GpuStatus::Ok();
}

GpuStatus ArenaAllocator::Create(const ArenaAllocatorOptions& options, ArenaSource source,
                                 std::unique_ptr<ArenaAllocator>* out) {
  if (GpuStatus s = options.Validate(); !s.ok()) return s;
  if (!source) return Invalid("ArenaAllocator needs an arena source");
  *out = std::make_unique<ArenaAllocatorImpl>(options, std::move(source));
  return GpuStatus::Ok();
}

}  // namespace kvcache::gpu
