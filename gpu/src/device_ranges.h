// DeviceRanges: the device address ranges (arenas and mappings) a DeviceMemory knows, so every
// copy can check that its device side lies wholly inside one of them. Not thread-safe: the
// owner guards it with its own mutex.
#ifndef KVCACHE_GPU_SRC_DEVICE_RANGES_H_
#define KVCACHE_GPU_SRC_DEVICE_RANGES_H_

#include <cstdint>
#include <map>
#include <string>

#include "kvcache/gpu/device_memory.h"
#include "kvcache/gpu/status.h"

namespace kvcache::gpu::internal {

class DeviceRanges {
 public:
  void Add(const void* base, uint64_t bytes) { ranges_[Address(base)] = bytes; }
  void Remove(const void* base) { ranges_.erase(Address(base)); }

  // True when [ptr, ptr + bytes) lies inside one known range.
  bool Contains(const void* ptr, uint64_t bytes) const {
    const uintptr_t address = Address(ptr);
    auto it = ranges_.upper_bound(address);
    if (it == ranges_.begin()) return false;
    --it;
    const uint64_t offset = address - it->first;
    return offset <= it->second && bytes <= it->second - offset;
  }

  // OK, or INVALID_ARGUMENT naming the side of the copy that is outside every arena / mapping.
  GpuStatus CheckCopy(CopyKind kind, const void* dst, const void* src, uint64_t bytes) const {
    if (bytes == 0) return GpuStatus::Ok();
    if (dst == nullptr || src == nullptr) {
      return GpuStatus::Error(GpuCode::kInvalidArgument, "copy with a null pointer");
    }
    const bool device_dst = kind != CopyKind::kDeviceToHost;
    const bool device_src = kind != CopyKind::kHostToDevice;
    if (device_dst && !Contains(dst, bytes)) {
      return GpuStatus::Error(GpuCode::kInvalidArgument,
                              std::string(CopyKindName(kind)) + " copy of " +
                                  std::to_string(bytes) +
                                  " bytes: destination is not inside an arena or mapping");
    }
    if (device_src && !Contains(src, bytes)) {
      return GpuStatus::Error(GpuCode::kInvalidArgument,
                              std::string(CopyKindName(kind)) + " copy of " +
                                  std::to_string(bytes) +
                                  " bytes: source is not inside an arena or mapping");
    }
    return GpuStatus::Ok();
  }

 private:
  static uintptr_t Address(const void* p) { return reinterpret_cast<uintptr_t>(p); }

  std::map<uintptr_t, uint64_t> ranges_;  // base -> bytes
};

}  // namespace kvcache::gpu::internal

#endif  // KVCACHE_GPU_SRC_DEVICE_RANGES_H_
