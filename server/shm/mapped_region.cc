#include "server/shm/mapped_region.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>

#include <cerrno>
#include <cstring>

#include "absl/strings/str_cat.h"

namespace kvcache {

absl::StatusOr<std::shared_ptr<MappedRegion>> MappedRegion::Map(int fd, uint64_t bytes,
                                                                uint64_t max_bytes) {
  if (bytes == 0 || bytes > max_bytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("a region of ", bytes, " bytes; it must hold 1 to shm.max_region_bytes (",
                     max_bytes, ") bytes"));
  }
  struct stat st;
  if (::fstat(fd, &st) != 0) {
    return absl::FailedPreconditionError(
        absl::StrCat("cannot stat the region's descriptor: ", std::strerror(errno)));
  }
  if (!S_ISREG(st.st_mode)) {
    return absl::FailedPreconditionError(
        "the region's descriptor is not a regular file; pass a memfd (memfd_create)");
  }
  const int seals = ::fcntl(fd, F_GET_SEALS);
  if (seals < 0 || (seals & F_SEAL_SHRINK) == 0) {
    return absl::FailedPreconditionError(
        "the region's file is not sealed against shrinking; create it with "
        "memfd_create(..., MFD_ALLOW_SEALING) and add F_SEAL_SHRINK (fcntl F_ADD_SEALS), so it "
        "cannot shrink under the daemon's mapping");
  }
  if (static_cast<uint64_t>(st.st_size) < bytes) {
    return absl::InvalidArgumentError(absl::StrCat("the region's file holds ", st.st_size,
                                                   " bytes, fewer than the ", bytes, " declared"));
  }
  void* base = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (base == MAP_FAILED) {
    const int err = errno;
    if (err == EACCES || err == EPERM) {
      return absl::FailedPreconditionError(absl::StrCat(
          "cannot map the region read-write (", std::strerror(err),
          "): the descriptor must be open for reading and writing, without F_SEAL_WRITE"));
    }
    return absl::InternalError(absl::StrCat("cannot map the region: ", std::strerror(err)));
  }
  return std::shared_ptr<MappedRegion>(new MappedRegion(static_cast<std::byte*>(base), bytes));
}

MappedRegion::~MappedRegion() { ::munmap(base_, size_); }

absl::StatusOr<std::span<std::byte>> MappedRegion::Range(uint64_t offset, uint64_t length) const {
  if (offset > size_ || length > size_ - offset) {
    return absl::OutOfRangeError(absl::StrCat("bytes [", offset, ", ", offset, " + ", length,
                                              ") are outside the region of ", size_, " bytes"));
  }
  return std::span<std::byte>(base_ + offset, length);
}

}  // namespace kvcache
