// kvcache::DeviceSession: a worker's side of the daemon's GPU tier
// (docs/tiers.md, "The GPU tier").
//
// A worker on the daemon's host opens one session over its own DeviceMemory
// (kvcache::gpu: CUDA, or the host-memory stand-in, the same kind as the
// daemon's gpu_tier.kind). Open() maps every arena the daemon exported, once;
// the mappings are the session's and are closed when it is destroyed.
// FetchToDevice() asks the daemon to place the exact cached prefix of a
// sequence in its GPU tier (leased while the copies run), copies each block
// device to device into the caller's buffer (block i at i * block_bytes:
// the layout a Fetch writes), and releases the lease. An arena the daemon
// added since is mapped on first use.
//
// Verification: the daemon checked every block's bytes against its XXH3-64
// checksum when it copied them into the device, and its copies stay put
// while the lease holds them. The device-to-device copy itself is not hashed
// on the device; with DeviceFetchOptions::verify the session copies what it
// wrote back to the host and checks every block (DATA_LOSS on a mismatch).
//
// Thread-safe: several threads may fetch through one session. The Client and
// the DeviceMemory must outlive it.
#ifndef KVCACHE_CLIENT_DEVICE_SESSION_H_
#define KVCACHE_CLIENT_DEVICE_SESSION_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string_view>

#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "kvcache/client.h"
#include "kvcache/gpu/arena_mappings.h"
#include "kvcache/gpu/device_memory.h"

namespace kvcache {

struct DeviceFetchOptions {
  // Copy the blocks back to the host and check each one's checksum.
  bool verify = false;
  // How long the daemon keeps the placed blocks leased if this worker dies
  // mid-copy (zero: the daemon's default lease ttl).
  absl::Duration lease_ttl = absl::ZeroDuration();
};

struct DeviceFetchResult {
  uint64_t matched_tokens = 0;   // tokens whose KV is now in the caller's buffer
  uint64_t unplaced_tokens = 0;  // cached after those, not placed (GPU tier full): Fetch them
  uint64_t withheld_tokens = 0;  // cached lossy after the exact ones (never placed)
  uint32_t blocks = 0;
  uint32_t copied_into_tier = 0;  // of blocks, the daemon copied into its GPU tier for this call
};

class DeviceSession {
 public:
  // FAILED_PRECONDITION when the daemon has no GPU tier or its kind is not
  // `device`'s; the device layer's error when an arena cannot be mapped.
  static absl::StatusOr<std::unique_ptr<DeviceSession>> Open(Client* client,
                                                             gpu::DeviceMemory* device);

  // Copies the KV of the exact cached prefix of `tokens` into `out`, a
  // device buffer of `device` (a range of one of its arenas). INVALID_ARGUMENT
  // when `out` is smaller than the placed prefix (nothing copied); DATA_LOSS
  // when verify finds a block that does not match. The lease is released in
  // every case.
  absl::StatusOr<DeviceFetchResult> FetchToDevice(std::string_view model_id,
                                                  std::span<const uint32_t> tokens,
                                                  std::span<std::byte> out,
                                                  const DeviceFetchOptions& options = {});

  // Arenas mapped so far.
  size_t mapped_arenas() const { return mappings_.size(); }

 private:
  DeviceSession(Client* client, gpu::DeviceMemory* device)
      : client_(client), device_(device), mappings_(device) {}
  // Maps every arena the daemon lists that is not mapped yet.
  absl::Status MapArenas() ABSL_LOCKS_EXCLUDED(map_mu_);
  absl::StatusOr<DeviceFetchResult> CopyPlaced(const v1::PlaceOnDeviceResponse& placed,
                                               std::span<std::byte> out,
                                               const DeviceFetchOptions& options);

  Client* const client_;
  gpu::DeviceMemory* const device_;
  // One MapArenas at a time. It guards a sequence, not a field: mappings_
  // locks itself, and fetches resolve through it without map_mu_.
  absl::Mutex map_mu_;
  gpu::ArenaMappings mappings_;
};

}  // namespace kvcache

#endif  // KVCACHE_CLIENT_DEVICE_SESSION_H_
