// MappedRegion: a worker's shared-memory region, mapped into the daemon.
//
// A worker creates a memfd, seals it against shrinking and hands its
// descriptor to the daemon (shm.proto, AttachRegion). Map() checks that the
// file is a regular shared-memory file at least as long as the worker says,
// and that it carries F_SEAL_SHRINK: a file that could shrink under the
// mapping would make the daemon's next copy fault (SIGBUS). The daemon maps
// only the worker's memory, never its own pool, into anything a worker sees.
//
// The mapping lives as long as the last shared_ptr: a request copying into or
// out of a region keeps it mapped even if the worker detaches it meanwhile.
//
// Thread-safety: immutable after Map(); Range() may be called concurrently.
// The bytes themselves are shared with another process and can change at any
// time: readers hash what they copied, never the region itself.
#ifndef KVCACHE_SERVER_SHM_MAPPED_REGION_H_
#define KVCACHE_SERVER_SHM_MAPPED_REGION_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>

#include "absl/status/statusor.h"

namespace kvcache {

class MappedRegion {
 public:
  // Maps `bytes` bytes of `fd` (which the caller keeps and closes).
  // INVALID_ARGUMENT: bytes is 0 or larger than max_bytes, or the file is
  // shorter; FAILED_PRECONDITION: not a regular file, not sealed with
  // F_SEAL_SHRINK, or not writable; INTERNAL when mmap fails.
  static absl::StatusOr<std::shared_ptr<MappedRegion>> Map(int fd, uint64_t bytes,
                                                           uint64_t max_bytes);
  ~MappedRegion();
  MappedRegion(const MappedRegion&) = delete;
  MappedRegion& operator=(const MappedRegion&) = delete;

  uint64_t size() const { return size_; }

  // Bytes [offset, offset + length) of the region; OUT_OF_RANGE when they
  // do not lie inside it (overflow-safe).
  absl::StatusOr<std::span<std::byte>> Range(uint64_t offset, uint64_t length) const;

 private:
  MappedRegion(std::byte* base, uint64_t size) : base_(base), size_(size) {}

  std::byte* const base_;
  const uint64_t size_;
};

}  // namespace kvcache

#endif  // KVCACHE_SERVER_SHM_MAPPED_REGION_H_
