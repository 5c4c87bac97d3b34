#include "server/tier/gpu_device_tier.h"

#include <atomic>
#include <cstring>
#include <memory>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "kvcache/gpu/device_memory.h"
#include "kvcache/gpu/gpu_block_pool.h"
#include "xxhash.h"
#ifdef KVCACHE_GPU_TIER_CUDA
#include "kvcache/gpu/cuda_device_memory.h"
#endif

namespace kvcache {
namespace {

absl::Status FromGpu(const gpu::GpuStatus& s) {
  if (s.ok()) return absl::OkStatus();
  return absl::Status(static_cast<absl::StatusCode>(s.code), s.message);
}

class GpuDeviceTier;

// One block's slot on the device; freed when the last reference drops.
class GpuCopy final : public StoredCopy {
 public:
  GpuCopy(GpuDeviceTier* tier, uint64_t key, const BlockSeal& seal,
          const gpu::GpuBlockHandle& handle)
      : StoredCopy(key, seal, handle.slot_bytes), tier_(tier), handle_(handle) {}
  ~GpuCopy() override;
  const gpu::GpuBlockHandle& handle() const { return handle_; }

 private:
  GpuDeviceTier* const tier_;
  const gpu::GpuBlockHandle handle_;
};

class GpuDeviceTier final : public DeviceTier, public std::enable_shared_from_this<GpuDeviceTier> {
 public:
  GpuDeviceTier(std::string kind, std::unique_ptr<gpu::DeviceMemory> device,
                std::unique_ptr<gpu::GpuBlockPool> pool, std::string description)
      : kind_(std::move(kind)),
        device_(std::move(device)),
        pool_(std::move(pool)),
        description_(std::move(description)) {}
  ~GpuDeviceTier() override {
    pool_.reset();  // frees the arenas before the device goes
  }

  absl::StatusOr<StoredRef> Write(uint64_t key, const BlockPayload& payload) override {
    gpu::GpuBlockHandle handle;
    const gpu::GpuStatus s =
        pool_->Put(payload.data().data(), payload.size(), payload.checksum(), &handle);
    if (!s.ok()) {
      if (s.code == gpu::GpuCode::kResourceExhausted) failed_writes_.fetch_add(1);
      return FromGpu(s);
    }
    writes_.fetch_add(1);
    write_bytes_.fetch_add(payload.size());
    live_.fetch_add(1);
    payload_bytes_.fetch_add(payload.size());
    return std::make_shared<GpuCopy>(this, key, payload.seal(), handle);
  }

  absl::Status Read(const StoredCopy& copy, std::span<std::byte> out) override {
    const auto& c = static_cast<const GpuCopy&>(copy);
    if (out.size() != c.handle().bytes) {
      return absl::InvalidArgumentError(absl::StrCat("read of ", out.size(), " bytes from a ",
                                                     c.handle().bytes, "-byte device copy"));
    }
    const gpu::GpuStatus s = pool_->Get(c.handle(), out.data(), out.size());
    if (s.code == gpu::GpuCode::kDataLoss) checksum_failures_.fetch_add(1);
    if (!s.ok()) return FromGpu(s);
    reads_.fetch_add(1);
    read_bytes_.fetch_add(out.size());
    return absl::OkStatus();
  }

  TierStats GetStats() const override {
    const gpu::GpuBlockPoolStats p = pool_->Stats();
    return {.kind = "gpu",
            .capacity_bytes = p.allocator.capacity_bytes,
            .allocated_bytes = p.allocator.allocated_bytes,
            .payload_bytes = payload_bytes_.load(),
            .live_copies = live_.load(),
            .writes = writes_.load(),
            .write_bytes = write_bytes_.load(),
            .reads = reads_.load(),
            .read_bytes = read_bytes_.load(),
            .checksum_failures = checksum_failures_.load(),
            .failed_writes = failed_writes_.load()};
  }

  std::string_view device_kind() const override { return kind_; }
  std::string device_description() const override { return description_; }

  DeviceSlot Slot(const StoredCopy& copy) const override {
    const gpu::GpuBlockHandle& h = static_cast<const GpuCopy&>(copy).handle();
    return {.arena = h.arena, .offset = h.offset, .bytes = h.bytes, .slot_bytes = h.slot_bytes};
  }

  std::vector<DeviceArena> Arenas() const override {
    std::vector<DeviceArena> out;
    for (const gpu::ExportedArena& a : pool_->Export()) {
      std::string handle(sizeof(a.handle), '\0');
      std::memcpy(handle.data(), &a.handle, sizeof(a.handle));
      out.push_back({.arena = a.arena, .bytes = a.handle.arena_bytes, .ipc_handle = handle});
    }
    return out;
  }

  std::shared_ptr<HostMemoryRegistrar> HostPinner() override;

  gpu::DeviceMemory& device() { return *device_; }

  void Free(const gpu::GpuBlockHandle& handle) {
    // A slot the pool cannot free is a bug in this tier; nothing else to do
    // with it here (it stays allocated, which only costs capacity).
    (void)pool_->Free(handle);
    live_.fetch_sub(1);
    payload_bytes_.fetch_sub(handle.bytes);
  }

 private:
  const std::string kind_;
  std::unique_ptr<gpu::DeviceMemory> device_;
  std::unique_ptr<gpu::GpuBlockPool> pool_;
  const std::string description_;
  std::atomic<uint64_t> live_{0};
  std::atomic<uint64_t> payload_bytes_{0};
  std::atomic<uint64_t> writes_{0};
  std::atomic<uint64_t> write_bytes_{0};
  std::atomic<uint64_t> reads_{0};
  std::atomic<uint64_t> read_bytes_{0};
  std::atomic<uint64_t> checksum_failures_{0};
  std::atomic<uint64_t> failed_writes_{0};
};

GpuCopy::~GpuCopy() { tier_->Free(handle_); }

// Page-locks the host pool's mappings with the tier's device
// (cudaHostRegister; the stand-in records them).
class DeviceHostPinner final : public HostMemoryRegistrar {
 public:
  explicit DeviceHostPinner(std::shared_ptr<GpuDeviceTier> tier) : tier_(std::move(tier)) {}
  absl::Status Register(std::byte* data, uint64_t bytes) override {
    return FromGpu(tier_->device().RegisterHost(data, bytes));
  }
  void Unregister(std::byte* data, uint64_t /*bytes*/) override {
    // Only ranges Register() took reach here; a failure leaves nothing to undo.
    (void)tier_->device().UnregisterHost(data);
  }

 private:
  const std::shared_ptr<GpuDeviceTier> tier_;
};

std::shared_ptr<HostMemoryRegistrar> GpuDeviceTier::HostPinner() {
  return std::make_shared<DeviceHostPinner>(shared_from_this());
}

}  // namespace

bool GpuTierCudaBuilt() {
#ifdef KVCACHE_GPU_TIER_CUDA
  return true;
#else
  return false;
#endif
}

absl::StatusOr<std::shared_ptr<DeviceTier>> OpenGpuDeviceTier(const GpuTierOptions& options) {
  std::unique_ptr<gpu::DeviceMemory> device;
  if (options.kind == "host_stand_in") {
    device = gpu::NewHostStandInMemory({.device_bytes = options.capacity_bytes});
  } else if (options.kind == "cuda") {
#ifdef KVCACHE_GPU_TIER_CUDA
    device = gpu::NewCudaDeviceMemory(options.device);
#else
    return absl::UnavailableError(
        "gpu tier: this kvcached was built without CUDA (KVCACHE_ENABLE_CUDA off)");
#endif
  } else {
    return absl::InvalidArgumentError(
        absl::StrCat("gpu tier: kind \"", options.kind, "\" is not one of cuda, host_stand_in"));
  }
  const gpu::DeviceInfo info = device->Probe();
  if (!info.usable) return absl::UnavailableError(absl::StrCat("gpu tier: ", info.reason));
  gpu::GpuBlockPoolOptions pool_options{
      .allocator = {.capacity_bytes = options.capacity_bytes,
                    .arena_bytes = options.arena_bytes,
                    .slab_bytes = options.slab_bytes,
                    .min_block_bytes = options.min_block_bytes},
      .checksum = [](const void* data, size_t bytes) { return XXH3_64bits(data, bytes); }};
  std::unique_ptr<gpu::GpuBlockPool> pool;
  if (gpu::GpuStatus s = gpu::GpuBlockPool::Create(device.get(), std::move(pool_options), &pool);
      !s.ok()) {
    return absl::Status(static_cast<absl::StatusCode>(s.code), "gpu tier: " + s.message);
  }
  std::string description =
      absl::StrCat(info.name, " (device ", info.device, ", ", info.total_bytes >> 20, " MiB");
  if (info.compute_capability != 0) {
    absl::StrAppend(&description, ", compute ", info.compute_capability / 10, ".",
                    info.compute_capability % 10);
  }
  absl::StrAppend(&description, ")");
  return std::make_shared<GpuDeviceTier>(options.kind, std::move(device), std::move(pool),
                                         std::move(description));
}

}  // namespace kvcache
