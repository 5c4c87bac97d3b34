#include "kvcache/gpu/gpu_block_pool.h"

#include <atomic>
#include <string>
#include <unordered_map>
#include <utility>

#include "kvcache/gpu/mutex.h"

namespace kvcache::gpu {
namespace {

class GpuBlockPoolImpl final : public GpuBlockPool {
 public:
  GpuBlockPoolImpl(DeviceMemory* device, ChecksumFn checksum)
      : device_(device), checksum_(std::move(checksum)) {}

  ~GpuBlockPoolImpl() override {
    for (const ExportedArena& arena : exported_) (void)device_->FreeArena(arena.arena);
  }

  GpuStatus Init(const ArenaAllocatorOptions& options) {
    return ArenaAllocator::Create(
        options, [this](uint64_t bytes, ArenaId* id) { return AddArena(bytes, id); }, &allocator_);
  }

  GpuStatus Put(const void* host, uint64_t bytes, uint64_t checksum, GpuBlockHandle* out) override {
    if (host == nullptr) return GpuStatus::Error(GpuCode::kInvalidArgument, "Put of null bytes");
    if (const uint64_t actual = checksum_(host, bytes); actual != checksum) {
      return GpuStatus::Error(GpuCode::kDataLoss, "Put: checksum of the " + std::to_string(bytes) +
                                                      " host bytes does not match the one given");
    }
    BlockSlot slot;
    if (GpuStatus s = allocator_->Allocate(bytes, &slot); !s.ok()) return s;
    const GpuBlockHandle handle{slot.arena, slot.offset, bytes, slot.bytes, checksum};
    std::byte* device_ptr = nullptr;
    GpuStatus s = Locate(handle, &device_ptr);
    if (s.ok()) s = device_->Copy(CopyKind::kHostToDevice, device_ptr, host, bytes);
    if (!s.ok()) {
      (void)allocator_->Free(slot);
      return s;
    }
    puts_.fetch_add(1, std::memory_order_relaxed);
    *out = handle;
    return GpuStatus::Ok();
  }

  GpuStatus Get(const GpuBlockHandle& handle, void* host, uint64_t host_bytes) override {
    if (host == nullptr || host_bytes < handle.bytes) {
      return GpuStatus::Error(GpuCode::kInvalidArgument,
                              "Get: host buffer of " + std::to_string(host_bytes) +
                                  " bytes for a block of " + std::to_string(handle.bytes));
    }
    std::byte* device_ptr = nullptr;
    if (GpuStatus s = Locate(handle, &device_ptr); !s.ok()) return s;
    if (GpuStatus s = device_->Copy(CopyKind::kDeviceToHost, host, device_ptr, handle.bytes);
        !s.ok()) {
      return s;
    }
    gets_.fetch_add(1, std::memory_order_relaxed);
    if (checksum_(host, handle.bytes) != handle.checksum) {
      corrupt_.fetch_add(1, std::memory_order_relaxed);
      return GpuStatus::Error(GpuCode::kDataLoss, "GPU block at arena " +
                                                      std::to_string(handle.arena) + " offset " +
                                                      std::to_string(handle.offset) + " (" +
                                                      std::to_string(handle.bytes) +
                                                      " bytes) read back with a wrong checksum");
    }
    return GpuStatus::Ok();
  }

  GpuStatus Free(const GpuBlockHandle& handle) override {
    return allocator_->Free({handle.arena, handle.offset, handle.slot_bytes});
  }

  GpuStatus Locate(const GpuBlockHandle& handle, std::byte** device_ptr) const override {
    MutexLock lock(&mu_);
    auto it = bases_.find(handle.arena);
    if (it == bases_.end()) {
      return GpuStatus::Error(GpuCode::kNotFound, "no arena " + std::to_string(handle.arena));
    }
    const uint64_t arena_bytes = it->second.second;
    if (handle.offset > arena_bytes || handle.bytes > handle.slot_bytes ||
        handle.slot_bytes > arena_bytes - handle.offset) {
      return GpuStatus::Error(GpuCode::kInvalidArgument,
                              "block handle (offset " + std::to_string(handle.offset) + ", " +
                                  std::to_string(handle.slot_bytes) + "-byte slot) leaves arena " +
                                  std::to_string(handle.arena));
    }
    *device_ptr = it->second.first + handle.offset;
    return GpuStatus::Ok();
  }

  std::vector<ExportedArena> Export() const override {
    MutexLock lock(&mu_);
    return exported_;
  }

  GpuBlockPoolStats Stats() const override {
    GpuBlockPoolStats stats;
    stats.allocator = allocator_->Stats();
    stats.puts = puts_.load(std::memory_order_relaxed);
    stats.gets = gets_.load(std::memory_order_relaxed);
    stats.corrupt_blocks = corrupt_.load(std::memory_order_relaxed);
    return stats;
  }

 private:
  // The allocator's ArenaSource: a new device arena, exported once.
  GpuStatus AddArena(uint64_t bytes, ArenaId* id) {
    Arena arena;
    if (GpuStatus s = device_->AllocateArena(bytes, &arena); !s.ok()) return s;
    ExportedArena exported{arena.id, {}};
    if (GpuStatus s = device_->ExportArena(arena.id, &exported.handle); !s.ok()) {
      (void)device_->FreeArena(arena.id);
      return s;
    }
    MutexLock lock(&mu_);
    bases_[arena.id] = {arena.base, arena.bytes};
    exported_.push_back(exported);
    *id = arena.id;
    return GpuStatus::Ok();
  }

  DeviceMemory* const device_;
  const ChecksumFn checksum_;
  std::unique_ptr<ArenaAllocator> allocator_;
  std::atomic<uint64_t> puts_{0}, gets_{0}, corrupt_{0};

  mutable Mutex mu_;
  // id -> base, bytes
  std::unordered_map<ArenaId, std::pair<std::byte*, uint64_t>> bases_ KVCACHE_GPU_GUARDED_BY(mu_);
  std::vector<ExportedArena> exported_ KVCACHE_GPU_GUARDED_BY(mu_);
};

}  // namespace

GpuStatus GpuBlockPool::Create(DeviceMemory* device, GpuBlockPoolOptions options,
                               std::unique_ptr<GpuBlockPool>* out) {
  if (device == nullptr) return GpuStatus::Error(GpuCode::kInvalidArgument, "no DeviceMemory");
  if (!options.checksum) {
    return GpuStatus::Error(GpuCode::kInvalidArgument, "GpuBlockPoolOptions.checksum is empty");
  }
  const DeviceInfo info = device->Probe();
  if (!info.usable) {
    return GpuStatus::Error(GpuCode::kUnavailable, "GPU tier: " + info.reason);
  }
  auto pool = std::make_unique<GpuBlockPoolImpl>(device, std::move(options.checksum));
  if (GpuStatus s = pool->Init(options.allocator); !s.ok()) return s;
  *out = std::move(pool);
  return GpuStatus::Ok();
}

}  // namespace kvcache::gpu
