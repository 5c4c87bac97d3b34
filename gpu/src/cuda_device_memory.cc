// DeviceMemory over the CUDA runtime: cudaMalloc arenas, cudaMemcpyAsync on owned streams,
// legacy CUDA IPC (cudaIpcGetMemHandle / cudaIpcOpenMemHandle).
#include "kvcache/gpu/cuda_device_memory.h"

#include <cuda_runtime_api.h>

#include <cstring>
#include <string>
#include <unordered_map>

#include "device_ranges.h"
#include "kvcache/gpu/mutex.h"

namespace kvcache::gpu {
namespace {

static_assert(sizeof(cudaIpcMemHandle_t) == ArenaIpcHandle::kOpaqueBytes);

// A failed CUDA call as a status: RESOURCE_EXHAUSTED for out-of-memory, INTERNAL otherwise,
// with the call, the error name and the error string. Clears the sticky last error.
GpuStatus CudaError(const std::string& call, cudaError_t error) {
  cudaGetLastError();
  const GpuCode code =
      error == cudaErrorMemoryAllocation ? GpuCode::kResourceExhausted : GpuCode::kInternal;
  return GpuStatus::Error(
      code, call + ": " + cudaGetErrorName(error) + " (" + cudaGetErrorString(error) + ")");
}

#define KVCACHE_GPU_CUDA_RETURN_IF_ERROR(call)     \
  do {                                             \
    const cudaError_t kvcache_gpu_error_ = (call); \
    if (kvcache_gpu_error_ != cudaSuccess) {       \
      return CudaError(#call, kvcache_gpu_error_); \
    }                                              \
  } while (0)

cudaMemcpyKind ToCuda(CopyKind kind) {
  switch (kind) {
    case CopyKind::kHostToDevice:
      return cudaMemcpyHostToDevice;
    case CopyKind::kDeviceToHost:
      return cudaMemcpyDeviceToHost;
    case CopyKind::kDeviceToDevice:
      return cudaMemcpyDeviceToDevice;
  }
  return cudaMemcpyDefault;
}

class CudaDeviceMemory final : public DeviceMemory {
 public:
  explicit CudaDeviceMemory(int device) : device_(device) {}

  ~CudaDeviceMemory() override {
    MutexLock lock(&mu_);
    if (!probed_ || !info_.usable) return;
    cudaSetDevice(device_);
    for (auto& [id, stream] : streams_) cudaStreamDestroy(stream);
    if (sync_stream_ != nullptr) cudaStreamDestroy(sync_stream_);
    for (auto& [base, bytes] : host_ranges_.ranges()) {
      cudaHostUnregister(reinterpret_cast<void*>(base));
    }
    for (auto& [id, mapping] : mappings_) cudaIpcCloseMemHandle(mapping.base);
    for (auto& [id, arena] : arenas_) cudaFree(arena.base);
  }

  DeviceInfo Probe() override {
    MutexLock lock(&mu_);
    ProbeLocked();
    return info_;
  }

  GpuStatus AllocateArena(uint64_t bytes, Arena* out) override {
    if (bytes == 0) return GpuStatus::Error(GpuCode::kInvalidArgument, "arena of 0 bytes");
    if (GpuStatus s = Enter(); !s.ok()) return s;
    void* base = nullptr;
    KVCACHE_GPU_CUDA_RETURN_IF_ERROR(cudaMalloc(&base, bytes));
    MutexLock lock(&mu_);
    const ArenaId id = next_id_++;
    arenas_[id] = {static_cast<std::byte*>(base), bytes};
    ranges_.Add(base, bytes);
    *out = {id, static_cast<std::byte*>(base), bytes};
    return GpuStatus::Ok();
  }

  GpuStatus FreeArena(ArenaId id) override {
    if (GpuStatus s = Enter(); !s.ok()) return s;
    std::byte* base = nullptr;
    {
      MutexLock lock(&mu_);
      auto it = arenas_.find(id);
      if (it == arenas_.end()) {
        return GpuStatus::Error(GpuCode::kNotFound, "no arena " + std::to_string(id));
      }
      base = it->second.base;
      ranges_.Remove(base);
      arenas_.erase(it);
    }
    KVCACHE_GPU_CUDA_RETURN_IF_ERROR(cudaFree(base));
    return GpuStatus::Ok();
  }

  GpuStatus Copy(CopyKind kind, void* dst, const void* src, uint64_t bytes) override {
    if (GpuStatus s = Enter(); !s.ok()) return s;
    cudaStream_t stream = nullptr;
    {
      MutexLock lock(&mu_);
      if (GpuStatus s = ranges_.CheckCopy(kind, dst, src, bytes); !s.ok()) return s;
      if (sync_stream_ == nullptr) {
        KVCACHE_GPU_CUDA_RETURN_IF_ERROR(
            cudaStreamCreateWithFlags(&sync_stream_, cudaStreamNonBlocking));
      }
      stream = sync_stream_;
    }
    if (bytes == 0) return GpuStatus::Ok();
    KVCACHE_GPU_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(dst, src, bytes, ToCuda(kind), stream));
    KVCACHE_GPU_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream));
    return GpuStatus::Ok();
  }

  GpuStatus CreateStream(StreamId* out) override {
    if (GpuStatus s = Enter(); !s.ok()) return s;
    cudaStream_t stream = nullptr;
    KVCACHE_GPU_CUDA_RETURN_IF_ERROR(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
    MutexLock lock(&mu_);
    *out = next_id_++;
    streams_[*out] = stream;
    return GpuStatus::Ok();
  }

  GpuStatus DestroyStream(StreamId id) override {
    if (GpuStatus s = Enter(); !s.ok()) return s;
    cudaStream_t stream = nullptr;
    {
      MutexLock lock(&mu_);
      auto it = streams_.find(id);
      if (it == streams_.end()) return UnknownStream(id);
      stream = it->second;
      streams_.erase(it);
    }
    KVCACHE_GPU_CUDA_RETURN_IF_ERROR(cudaStreamDestroy(stream));
    return GpuStatus::Ok();
  }

  GpuStatus CopyAsync(CopyKind kind, void* dst, const void* src, uint64_t bytes,
                      StreamId id) override {
    if (GpuStatus s = Enter(); !s.ok()) return s;
    cudaStream_t stream = nullptr;
    {
      MutexLock lock(&mu_);
      auto it = streams_.find(id);
      if (it == streams_.end()) return UnknownStream(id);
      stream = it->second;
      if (GpuStatus s = ranges_.CheckCopy(kind, dst, src, bytes); !s.ok()) return s;
    }
    if (bytes == 0) return GpuStatus::Ok();
    KVCACHE_GPU_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(dst, src, bytes, ToCuda(kind), stream));
    return GpuStatus::Ok();
  }

  GpuStatus Synchronize(StreamId id) override {
    if (GpuStatus s = Enter(); !s.ok()) return s;
    cudaStream_t stream = nullptr;
    {
      MutexLock lock(&mu_);
      auto it = streams_.find(id);
      if (it == streams_.end()) return UnknownStream(id);
      stream = it->second;
    }
    KVCACHE_GPU_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream));
    return GpuStatus::Ok();
  }

  GpuStatus ExportArena(ArenaId id, ArenaIpcHandle* out) override {
    if (GpuStatus s = Enter(); !s.ok()) return s;
    Arena arena;
    {
      MutexLock lock(&mu_);
      auto it = arenas_.find(id);
      if (it == arenas_.end()) {
        return GpuStatus::Error(GpuCode::kNotFound, "no arena " + std::to_string(id));
      }
      arena = {id, it->second.base, it->second.bytes};
    }
    cudaIpcMemHandle_t handle;
    KVCACHE_GPU_CUDA_RETURN_IF_ERROR(cudaIpcGetMemHandle(&handle, arena.base));
    *out = ArenaIpcHandle{};
    std::memcpy(out->opaque.data(), &handle, sizeof(handle));
    out->arena_bytes = arena.bytes;
    return GpuStatus::Ok();
  }

  GpuStatus OpenArena(const ArenaIpcHandle& handle, ArenaMapping* out) override {
    if (handle.arena_bytes == 0) {
      return GpuStatus::Error(GpuCode::kInvalidArgument, "arena handle of 0 bytes");
    }
    if (GpuStatus s = Enter(); !s.ok()) return s;
    cudaIpcMemHandle_t cuda_handle;
    std::memcpy(&cuda_handle, handle.opaque.data(), sizeof(cuda_handle));
    void* base = nullptr;
    KVCACHE_GPU_CUDA_RETURN_IF_ERROR(
        cudaIpcOpenMemHandle(&base, cuda_handle, cudaIpcMemLazyEnablePeerAccess));
    MutexLock lock(&mu_);
    const MappingId id = next_id_++;
    mappings_[id] = {static_cast<std::byte*>(base), handle.arena_bytes};
    ranges_.Add(base, handle.arena_bytes);
    *out = {id, static_cast<std::byte*>(base), handle.arena_bytes};
    return GpuStatus::Ok();
  }

  GpuStatus CloseArena(MappingId id) override {
    if (GpuStatus s = Enter(); !s.ok()) return s;
    std::byte* base = nullptr;
    {
      MutexLock lock(&mu_);
      auto it = mappings_.find(id);
      if (it == mappings_.end()) {
        return GpuStatus::Error(GpuCode::kNotFound, "no mapping " + std::to_string(id));
      }
      base = it->second.base;
      ranges_.Remove(base);
      mappings_.erase(it);
    }
    KVCACHE_GPU_CUDA_RETURN_IF_ERROR(cudaIpcCloseMemHandle(base));
    return GpuStatus::Ok();
  }

  GpuStatus RegisterHost(void* data, uint64_t bytes) override {
    if (GpuStatus s = Enter(); !s.ok()) return s;
    // Held across the call: two overlapping registrations must not both pass the check.
    MutexLock lock(&host_mu_);
    {
      MutexLock ranges_lock(&mu_);
      if (GpuStatus s = host_ranges_.Check(data, bytes); !s.ok()) return s;
    }
    KVCACHE_GPU_CUDA_RETURN_IF_ERROR(cudaHostRegister(data, bytes, cudaHostRegisterDefault));
    MutexLock ranges_lock(&mu_);
    host_ranges_.Add(data, bytes);
    return GpuStatus::Ok();
  }

  GpuStatus UnregisterHost(void* data) override {
    if (GpuStatus s = Enter(); !s.ok()) return s;
    MutexLock lock(&host_mu_);
    {
      MutexLock ranges_lock(&mu_);
      if (GpuStatus s = host_ranges_.Remove(data); !s.ok()) return s;
    }
    KVCACHE_GPU_CUDA_RETURN_IF_ERROR(cudaHostUnregister(data));
    return GpuStatus::Ok();
  }

  uint64_t registered_host_bytes() override {
    MutexLock lock(&mu_);
    return host_ranges_.total_bytes();
  }

 private:
  struct Range {
    std::byte* base;
    uint64_t bytes;
  };

  // Fills info_ once.
  void ProbeLocked() KVCACHE_GPU_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (probed_) return;
    probed_ = true;
    info_ = DeviceInfo{};
    info_.kind = "cuda";
    info_.device = device_;
    cudaRuntimeGetVersion(&info_.runtime_version);
    cudaDriverGetVersion(&info_.driver_version);
    int count = 0;
    const cudaError_t error = cudaGetDeviceCount(&count);
    if (error != cudaSuccess || count == 0) {
      cudaGetLastError();
      if (error == cudaErrorInsufficientDriver && info_.driver_version == 0) {
        info_.reason = "no CUDA device (no CUDA driver installed)";
      } else if (error == cudaErrorInsufficientDriver) {
        info_.reason = "CUDA driver too old: driver supports CUDA " +
                       std::to_string(info_.driver_version) + ", runtime needs " +
                       std::to_string(info_.runtime_version);
      } else if (error == cudaErrorNoDevice || count == 0) {
        info_.reason = "no CUDA device";
      } else {
        info_.reason = CudaError("cudaGetDeviceCount", error).message;
      }
      return;
    }
    if (device_ < 0 || device_ >= count) {
      info_.reason = "CUDA device " + std::to_string(device_) + " does not exist (" +
                     std::to_string(count) + " devices)";
      return;
    }
    cudaDeviceProp prop;
    if (cudaError_t e = cudaGetDeviceProperties(&prop, device_); e != cudaSuccess) {
      info_.reason = CudaError("cudaGetDeviceProperties", e).message;
      return;
    }
    info_.name = prop.name;
    info_.compute_capability = prop.major * 10 + prop.minor;
    if (!prop.unifiedAddressing) {
      info_.reason = "CUDA device " + std::to_string(device_) + " lacks unified addressing";
      return;
    }
    if (cudaError_t e = cudaSetDevice(device_); e != cudaSuccess) {
      info_.reason = CudaError("cudaSetDevice", e).message;
      return;
    }
    size_t free_bytes = 0, total_bytes = 0;
    if (cudaError_t e = cudaMemGetInfo(&free_bytes, &total_bytes); e != cudaSuccess) {
      info_.reason = CudaError("cudaMemGetInfo", e).message;
      return;
    }
    info_.free_bytes = free_bytes;
    info_.total_bytes = total_bytes;
    info_.usable = true;
  }

  // UNAVAILABLE unless the device is usable; makes it current on the calling thread.
  GpuStatus Enter() {
    {
      MutexLock lock(&mu_);
      ProbeLocked();
      if (!info_.usable) return GpuStatus::Error(GpuCode::kUnavailable, info_.reason);
    }
    KVCACHE_GPU_CUDA_RETURN_IF_ERROR(cudaSetDevice(device_));
    return GpuStatus::Ok();
  }

  static GpuStatus UnknownStream(StreamId stream) {
    return GpuStatus::Error(GpuCode::kNotFound, "no stream " + std::to_string(stream));
  }

  const int device_;
  // Serialises RegisterHost / UnregisterHost, each a check and a CUDA call
  // (taken before mu_, never after). It guards no field: host_ranges_ is mu_'s.
  Mutex host_mu_ KVCACHE_GPU_ACQUIRED_BEFORE(mu_);
  Mutex mu_;
  bool probed_ KVCACHE_GPU_GUARDED_BY(mu_) = false;
  DeviceInfo info_ KVCACHE_GPU_GUARDED_BY(mu_);
  uint64_t next_id_ KVCACHE_GPU_GUARDED_BY(mu_) = 1;
  cudaStream_t sync_stream_ KVCACHE_GPU_GUARDED_BY(mu_) = nullptr;
  std::unordered_map<ArenaId, Range> arenas_ KVCACHE_GPU_GUARDED_BY(mu_);
  std::unordered_map<MappingId, Range> mappings_ KVCACHE_GPU_GUARDED_BY(mu_);
  std::unordered_map<StreamId, cudaStream_t> streams_ KVCACHE_GPU_GUARDED_BY(mu_);
  internal::DeviceRanges ranges_ KVCACHE_GPU_GUARDED_BY(mu_);
  internal::HostRanges host_ranges_ KVCACHE_GPU_GUARDED_BY(mu_);
};

}  // namespace

std::unique_ptr<DeviceMemory> NewCudaDeviceMemory(int device) {
  return std::make_unique<CudaDeviceMemory>(device);
}

}  // namespace kvcache::gpu
