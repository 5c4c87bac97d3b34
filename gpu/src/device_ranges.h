// DeviceRanges: the device address ranges (arenas and mappings) a DeviceMemory knows, so every
// copy can check that its device side lies wholly inside one of them. Not thread-safe: the
// owner guards it with its own mutex.
#ifndef KVCACHE_GPU_SRC_DEVICE_RANGES_H_
#define KVCACHE_GPU_SRC_DEVICE_RANGES_H_

#include <cstdint>
#include <iterator>
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

// The host ranges a DeviceMemory page-locked (RegisterHost), so that a range is registered once,
// never overlapping another, and unregistered by the address it was registered with. Not
// thread-safe, as DeviceRanges.
class HostRanges {
 public:
  // INVALID_ARGUMENT for a null or empty range, or one overlapping a registered range.
  GpuStatus Check(const void* data, uint64_t bytes) const {
    if (data == nullptr || bytes == 0) {
      return GpuStatus::Error(GpuCode::kInvalidArgument, "register of a null or empty host range");
    }
    const uintptr_t begin = reinterpret_cast<uintptr_t>(data);
    auto next = ranges_.lower_bound(begin);
    if (next != ranges_.end() && next->first < begin + bytes) return Overlap(bytes);
    if (next != ranges_.begin() && std::prev(next)->first + std::prev(next)->second > begin) {
      return Overlap(bytes);
    }
    return GpuStatus::Ok();
  }
  void Add(const void* data, uint64_t bytes) {
    ranges_[reinterpret_cast<uintptr_t>(data)] = bytes;
    total_bytes_ += bytes;
  }
  // NOT_FOUND unless `data` starts a registered range.
  GpuStatus Remove(const void* data) {
    auto it = ranges_.find(reinterpret_cast<uintptr_t>(data));
    if (it == ranges_.end()) {
      return GpuStatus::Error(GpuCode::kNotFound, "no registered host range starts there");
    }
    total_bytes_ -= it->second;
    ranges_.erase(it);
    return GpuStatus::Ok();
  }
  const std::map<uintptr_t, uint64_t>& ranges() const { return ranges_; }
  uint64_t total_bytes() const { return total_bytes_; }

 private:
  static GpuStatus Overlap(uint64_t bytes) {
    return GpuStatus::Error(
        GpuCode::kInvalidArgument,
        "host range of " + std::to_string(bytes) + " bytes overlaps one registered already");
  }

  std::map<uintptr_t, uint64_t> ranges_;  // base -> bytes
  uint64_t total_bytes_ = 0;
};

}  // namespace kvcache::gpu::internal

#endif  // KVCACHE_GPU_SRC_DEVICE_RANGES_H_
