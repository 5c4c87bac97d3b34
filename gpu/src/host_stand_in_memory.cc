// The host-memory stand-in for a GPU: memfd-backed arenas, memcpy copies, and "IPC" handles
// that name the exporting process's memfd (/proc/<pid>/fd/<fd>).
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <string>
#include <unordered_map>
#include <unordered_set>

#include "device_ranges.h"
#include "kvcache/gpu/device_memory.h"
#include "kvcache/gpu/mutex.h"

namespace kvcache::gpu {
namespace {

// Layout of ArenaIpcHandle::opaque for the stand-in.
struct StandInHandle {
  char magic[16];  // kMagic
  int64_t pid;     // exporting process
  int32_t fd;      // the arena's memfd in that process
  int32_t reserved;
  uint64_t arena_id;
  uint64_t mapped_bytes;  // page-rounded size of the memfd
};
static_assert(sizeof(StandInHandle) <= ArenaIpcHandle::kOpaqueBytes);
constexpr char kMagic[16] = "kvcache-standin";

GpuStatus Errno(const std::string& what) {
  return GpuStatus::Error(GpuCode::kInternal, what + ": " + std::strerror(errno));
}

uint64_t RoundToPage(uint64_t bytes) {
  const uint64_t page = static_cast<uint64_t>(sysconf(_SC_PAGESIZE));
  return (bytes + page - 1) / page * page;
}

class HostStandInMemory final : public DeviceMemory {
 public:
  explicit HostStandInMemory(const HostStandInOptions& options) : options_(options) {}

  ~HostStandInMemory() override {
    for (auto& [id, mapping] : mappings_) munmap(mapping.base, mapping.mapped_bytes);
    for (auto& [id, arena] : arenas_) {
      munmap(arena.base, arena.mapped_bytes);
      close(arena.fd);
    }
  }

  DeviceInfo Probe() override {
    DeviceInfo info;
    info.usable = options_.usable;
    info.reason = options_.usable ? "" : options_.unusable_reason;
    info.kind = "host-stand-in";
    info.name = "host memory";
    info.total_bytes = options_.device_bytes;
    MutexLock lock(&mu_);
    info.free_bytes = options_.device_bytes - used_bytes_;
    return info;
  }

  GpuStatus AllocateArena(uint64_t bytes, Arena* out) override {
    if (GpuStatus s = CheckUsable(); !s.ok()) return s;
    if (bytes == 0) return GpuStatus::Error(GpuCode::kInvalidArgument, "arena of 0 bytes");
    const uint64_t mapped = RoundToPage(bytes);
    {
      MutexLock lock(&mu_);
      if (mapped > options_.device_bytes - used_bytes_) {
        return GpuStatus::Error(GpuCode::kResourceExhausted,
                                "stand-in device out of memory: " + std::to_string(mapped) +
                                    " bytes asked, " +
                                    std::to_string(options_.device_bytes - used_bytes_) + " free");
      }
      used_bytes_ += mapped;
    }
    const int fd = memfd_create("kvcache-gpu-standin", MFD_CLOEXEC);
    void* base = MAP_FAILED;
    if (fd >= 0 && ftruncate(fd, static_cast<off_t>(mapped)) == 0) {
      base = mmap(nullptr, mapped, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    }
    if (base == MAP_FAILED) {
      GpuStatus s = Errno("stand-in arena of " + std::to_string(mapped) + " bytes");
      if (fd >= 0) close(fd);
      MutexLock lock(&mu_);
      used_bytes_ -= mapped;
      return s;
    }
    MutexLock lock(&mu_);
    const ArenaId id = next_id_++;
    arenas_[id] = {static_cast<std::byte*>(base), bytes, mapped, fd};
    ranges_.Add(base, bytes);
    *out = {id, static_cast<std::byte*>(base), bytes};
    return GpuStatus::Ok();
  }

  GpuStatus FreeArena(ArenaId id) override {
    MutexLock lock(&mu_);
    auto it = arenas_.find(id);
    if (it == arenas_.end()) {
      return GpuStatus::Error(GpuCode::kNotFound, "no arena " + std::to_string(id));
    }
    ranges_.Remove(it->second.base);
    munmap(it->second.base, it->second.mapped_bytes);
    close(it->second.fd);
    used_bytes_ -= it->second.mapped_bytes;
    arenas_.erase(it);
    return GpuStatus::Ok();
  }

  GpuStatus Copy(CopyKind kind, void* dst, const void* src, uint64_t bytes) override {
    if (GpuStatus s = CheckUsable(); !s.ok()) return s;
    {
      MutexLock lock(&mu_);
      if (GpuStatus s = ranges_.CheckCopy(kind, dst, src, bytes); !s.ok()) return s;
    }
    // Copies run outside the lock, as device copies would; the caller keeps the ranges alive.
    if (bytes > 0) std::memmove(dst, src, bytes);
    return GpuStatus::Ok();
  }

  GpuStatus CreateStream(StreamId* out) override {
    if (GpuStatus s = CheckUsable(); !s.ok()) return s;
    MutexLock lock(&mu_);
    *out = next_id_++;
    streams_.insert(*out);
    return GpuStatus::Ok();
  }

  GpuStatus DestroyStream(StreamId stream) override {
    MutexLock lock(&mu_);
    if (streams_.erase(stream) == 0) return UnknownStream(stream);
    return GpuStatus::Ok();
  }

  GpuStatus CopyAsync(CopyKind kind, void* dst, const void* src, uint64_t bytes,
                      StreamId stream) override {
    if (GpuStatus s = CheckStream(stream); !s.ok()) return s;
    return Copy(kind, dst, src, bytes);
  }

  GpuStatus Synchronize(StreamId stream) override { return CheckStream(stream); }

  GpuStatus ExportArena(ArenaId id, ArenaIpcHandle* out) override {
    if (GpuStatus s = CheckUsable(); !s.ok()) return s;
    MutexLock lock(&mu_);
    auto it = arenas_.find(id);
    if (it == arenas_.end()) {
      return GpuStatus::Error(GpuCode::kNotFound, "no arena " + std::to_string(id));
    }
    StandInHandle h{};
    std::memcpy(h.magic, kMagic, sizeof(kMagic));
    h.pid = getpid();
    h.fd = it->second.fd;
    h.arena_id = id;
    h.mapped_bytes = it->second.mapped_bytes;
    *out = ArenaIpcHandle{};
    std::memcpy(out->opaque.data(), &h, sizeof(h));
    out->arena_bytes = it->second.bytes;
    return GpuStatus::Ok();
  }

  GpuStatus OpenArena(const ArenaIpcHandle& handle, ArenaMapping* out) override {
    if (GpuStatus s = CheckUsable(); !s.ok()) return s;
    StandInHandle h;
    std::memcpy(&h, handle.opaque.data(), sizeof(h));
    if (std::memcmp(h.magic, kMagic, sizeof(kMagic)) != 0 || handle.arena_bytes == 0 ||
        handle.arena_bytes > h.mapped_bytes) {
      return GpuStatus::Error(GpuCode::kInvalidArgument, "not a host stand-in arena handle");
    }
    const std::string path = "/proc/" + std::to_string(h.pid) + "/fd/" + std::to_string(h.fd);
    const int fd = open(path.c_str(), O_RDWR | O_CLOEXEC);
    if (fd < 0) return Errno("opening stand-in arena " + path);
    struct stat st;
    void* base = MAP_FAILED;
    if (fstat(fd, &st) == 0 && static_cast<uint64_t>(st.st_size) == h.mapped_bytes) {
      base = mmap(nullptr, h.mapped_bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    } else {
      errno = EINVAL;  // the fd number now names something else: the exporter freed the arena
    }
    GpuStatus failed = base == MAP_FAILED ? Errno("mapping stand-in arena " + path) : GpuStatus{};
    close(fd);  // the mapping keeps the pages
    if (!failed.ok()) return failed;
    MutexLock lock(&mu_);
    const MappingId id = next_id_++;
    mappings_[id] = {static_cast<std::byte*>(base), handle.arena_bytes, h.mapped_bytes};
    ranges_.Add(base, handle.arena_bytes);
    *out = {id, static_cast<std::byte*>(base), handle.arena_bytes};
    return GpuStatus::Ok();
  }

  GpuStatus CloseArena(MappingId mapping) override {
    MutexLock lock(&mu_);
    auto it = mappings_.find(mapping);
    if (it == mappings_.end()) {
      return GpuStatus::Error(GpuCode::kNotFound, "no mapping " + std::to_string(mapping));
    }
    ranges_.Remove(it->second.base);
    munmap(it->second.base, it->second.mapped_bytes);
    mappings_.erase(it);
    return GpuStatus::Ok();
  }

  GpuStatus RegisterHost(void* data, uint64_t bytes) override {
    if (GpuStatus s = CheckUsable(); !s.ok()) return s;
    MutexLock lock(&mu_);
    if (GpuStatus s = host_ranges_.Check(data, bytes); !s.ok()) return s;
    host_ranges_.Add(data, bytes);
    return GpuStatus::Ok();
  }

  GpuStatus UnregisterHost(void* data) override {
    MutexLock lock(&mu_);
    return host_ranges_.Remove(data);
  }

  uint64_t registered_host_bytes() override {
    MutexLock lock(&mu_);
    return host_ranges_.total_bytes();
  }

 private:
  struct ArenaRecord {
    std::byte* base;
    uint64_t bytes;
    uint64_t mapped_bytes;
    int fd;
  };
  struct MappingRecord {
    std::byte* base;
    uint64_t bytes;
    uint64_t mapped_bytes;
  };

  GpuStatus CheckUsable() const {
    if (options_.usable) return GpuStatus::Ok();
    return GpuStatus::Error(GpuCode::kUnavailable, options_.unusable_reason);
  }
  GpuStatus CheckStream(StreamId stream) {
    if (GpuStatus s = CheckUsable(); !s.ok()) return s;
    MutexLock lock(&mu_);
    if (streams_.count(stream) == 0) return UnknownStream(stream);
    return GpuStatus::Ok();
  }
  static GpuStatus UnknownStream(StreamId stream) {
    return GpuStatus::Error(GpuCode::kNotFound, "no stream " + std::to_string(stream));
  }

  const HostStandInOptions options_;
  Mutex mu_;
  uint64_t next_id_ KVCACHE_GPU_GUARDED_BY(mu_) = 1;
  uint64_t used_bytes_ KVCACHE_GPU_GUARDED_BY(mu_) = 0;
  std::unordered_map<ArenaId, ArenaRecord> arenas_ KVCACHE_GPU_GUARDED_BY(mu_);
  std::unordered_map<MappingId, MappingRecord> mappings_ KVCACHE_GPU_GUARDED_BY(mu_);
  std::unordered_set<StreamId> streams_ KVCACHE_GPU_GUARDED_BY(mu_);
  internal::DeviceRanges ranges_ KVCACHE_GPU_GUARDED_BY(mu_);
  internal::HostRanges host_ranges_ KVCACHE_GPU_GUARDED_BY(mu_);
};

}  // namespace

const char* CopyKindName(CopyKind kind) {
  switch (kind) {
    case CopyKind::kHostToDevice:
      return "host-to-device";
    case CopyKind::kDeviceToHost:
      return "device-to-host";
    case CopyKind::kDeviceToDevice:
      return "device-to-device";
  }
  return "unknown";
}

std::unique_ptr<DeviceMemory> NewHostStandInMemory(const HostStandInOptions& options) {
  return std::make_unique<HostStandInMemory>(options);
}

}  // namespace kvcache::gpu
