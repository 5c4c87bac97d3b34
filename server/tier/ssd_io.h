// The SSD store's I/O layer: opening the file (O_DIRECT with a buffered
// fallback), aligned bounce buffers, and the two I/O engines (io_uring and a
// pread/pwrite thread pool) behind one small interface. Internal to
// server/tier.
//
// The system calls that decide which mode the store runs in (open, io_uring
// set-up) go through SsdSyscalls, so tests can make a file system refuse
// O_DIRECT or a kernel refuse io_uring.
#ifndef KVCACHE_SERVER_TIER_SSD_IO_H_
#define KVCACHE_SERVER_TIER_SSD_IO_H_

#include <sys/types.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "server/common/mutex.h"
#include "server/tier/ssd_store.h"

namespace kvcache::ssd_internal {

struct SsdSyscalls {
  // open(2).
  int (*open)(const char* path, int flags, mode_t mode);
  // Sets up an io_uring with `entries` on the calling thread's behalf and
  // tears it down again: 0, or -errno (ENOSYS, EPERM under seccomp...).
  int (*probe_io_uring)(unsigned entries);
};
SsdSyscalls RealSyscalls();

// SsdStore::Open with `syscalls` in place of the real ones (defined in
// ssd_store.cc). For tests.
absl::StatusOr<std::unique_ptr<SsdStore>> OpenSsdStore(const SsdStoreOptions& options,
                                                       const SsdSyscalls& syscalls);

// strerror text for an errno value (thread-safe).
std::string ErrnoText(int error);

struct SsdFile {
  int fd = -1;
  bool direct_io = false;
  std::string note;  // why O_DIRECT is off although it was asked for
};

// Opens `path` read-write (creating it), with O_DIRECT when `direct_io` and
// the file system accepts it, and makes sure `capacity_bytes` of it exist:
// a regular file is preallocated (fallocate; ftruncate where unsupported), a
// block device must be at least that large. UNAVAILABLE with errno text, or
// INVALID_ARGUMENT for a device that is too small.
absl::StatusOr<SsdFile> OpenSsdFile(const std::string& path, uint64_t capacity_bytes,
                                    bool direct_io, const SsdSyscalls& syscalls);

// One read or write of a contiguous range. `result` is set by the engine: the
// bytes transferred (less than `len` only at end of file) or -errno.
struct IoOp {
  bool write = false;
  std::byte* buf = nullptr;  // page aligned, `len` bytes
  uint64_t len = 0;          // multiple of 4 KiB
  uint64_t offset = 0;       // multiple of 4 KiB
  int64_t result = 0;
};

class IoEngine {
 public:
  virtual ~IoEngine() = default;
  // Runs every op to completion (retrying partial transfers, EINTR and
  // EAGAIN) and sets each op's result. Thread-safe.
  virtual void Run(std::span<IoOp> ops) = 0;
};

// `threads` threads issuing pread/pwrite on `fd`.
std::unique_ptr<IoEngine> MakeThreadPoolEngine(int fd, uint32_t threads);
// One io_uring per calling thread (made on its first call, up to
// `queue_depth` ops in flight per submit). Threads whose ring cannot be set
// up do their I/O with pread/pwrite themselves.
std::unique_ptr<IoEngine> MakeIoUringEngine(int fd, uint32_t queue_depth);

// Page-aligned bounce buffers (the SSD tier's staging), kept for reuse up to
// `cache_limit_bytes` of idle ones; the rest are freed when given back.
// Thread-safe.
class BufferPool {
 public:
  struct Deleter {
    BufferPool* pool;
    uint64_t bytes;
    void operator()(std::byte* data) const { pool->Return(data, bytes); }
  };
  using Buffer = std::unique_ptr<std::byte[], Deleter>;

  explicit BufferPool(uint64_t cache_limit_bytes) : cache_limit_bytes_(cache_limit_bytes) {}
  ~BufferPool();
  BufferPool(const BufferPool&) = delete;
  BufferPool& operator=(const BufferPool&) = delete;

  // A buffer of exactly `bytes` (a multiple of 4 KiB); nullptr when out of memory.
  Buffer Take(uint64_t bytes);

  // Idle buffers kept for reuse, and buffers taken and not yet given back.
  uint64_t cached_bytes() const;
  uint64_t in_use_bytes() const;

 private:
  void Return(std::byte* data, uint64_t bytes);

  const uint64_t cache_limit_bytes_;
  mutable Mutex mu_;
  absl::flat_hash_map<uint64_t, std::vector<std::byte*>> free_ ABSL_GUARDED_BY(mu_);
  uint64_t cached_bytes_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t in_use_bytes_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace kvcache::ssd_internal

#endif  // KVCACHE_SERVER_TIER_SSD_IO_H_
