#include "server/core/host_tier.h"

#include <cstring>
#include <optional>
#include <span>

#include "absl/strings/str_cat.h"

namespace kvcache {

absl::StatusOr<StoredRef> HostTier::Write(uint64_t key, const BlockPayload& payload) {
  absl::StatusOr<Allocation> a = pool_->Allocate(payload.size());
  if (!a.ok()) {
    if (absl::IsResourceExhausted(a.status())) {
      failed_writes_.fetch_add(1, std::memory_order_relaxed);
      return absl::ResourceExhaustedError(
          absl::StrCat("host tier is full: no room for a block of ", payload.size(), " bytes"));
    }
    return absl::InvalidArgumentError(
        absl::StrCat("a block of ", payload.size(),
                     " bytes can never fit the host tier: ", a.status().message()));
  }
  StagingBlock copy(pool_.get(), *a, payload.size());
  std::memcpy(copy.data().data(), payload.data().data(), payload.size());
  writes_.fetch_add(1, std::memory_order_relaxed);
  write_bytes_.fetch_add(payload.size(), std::memory_order_relaxed);
  return std::move(copy).Seal(key, payload.seal());
}

absl::Status HostTier::Read(const StoredCopy& copy, std::span<std::byte> out) {
  const std::optional<std::span<const std::byte>> bytes = copy.in_place_bytes();
  if (!bytes.has_value()) {
    return absl::InvalidArgumentError("not a host copy: read it through its own tier");
  }
  if (out.size() != bytes->size()) {
    return absl::InvalidArgumentError(
        absl::StrCat("read buffer of ", out.size(), " bytes for a copy of ", bytes->size()));
  }
  std::memcpy(out.data(), bytes->data(), out.size());
  reads_.fetch_add(1, std::memory_order_relaxed);
  read_bytes_.fetch_add(out.size(), std::memory_order_relaxed);
  if (Checksum(out) != copy.seal().checksum) {
    checksum_failures_.fetch_add(1, std::memory_order_relaxed);
    return absl::DataLossError(
        absl::StrCat("host copy of block ", copy.key(), " does not match its checksum"));
  }
  return absl::OkStatus();
}

TierStats HostTier::GetStats() const {
  const SlabPoolStats pool = pool_->GetStats();
  TierStats s;
  s.kind = "host";
  s.capacity_bytes = pool.capacity_bytes;
  s.allocated_bytes = pool.allocated_bytes;
  s.payload_bytes = pool.allocated_bytes;
  s.live_copies = pool.live_allocations;
  s.writes = writes_.load(std::memory_order_relaxed);
  s.write_bytes = write_bytes_.load(std::memory_order_relaxed);
  s.failed_writes = failed_writes_.load(std::memory_order_relaxed);
  s.reads = reads_.load(std::memory_order_relaxed);
  s.read_bytes = read_bytes_.load(std::memory_order_relaxed);
  s.checksum_failures = checksum_failures_.load(std::memory_order_relaxed);
  return s;
}

}  // namespace kvcache
