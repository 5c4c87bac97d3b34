#include "kvcache/device_session.h"

#include <cstring>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"

namespace kvcache {
namespace {

absl::Status FromGpu(const gpu::GpuStatus& s) {
  if (s.ok()) return absl::OkStatus();
  return absl::Status(static_cast<absl::StatusCode>(s.code), s.message);
}

// The daemon's gpu_tier.kind for a device layer's DeviceInfo::kind.
std::string TierKindOf(const std::string& device_kind) {
  return device_kind == "host-stand-in" ? std::string("host_stand_in") : device_kind;
}

}  // namespace

absl::StatusOr<std::unique_ptr<DeviceSession>> DeviceSession::Open(Client* client,
                                                                   gpu::DeviceMemory* device) {
  const gpu::DeviceInfo info = device->Probe();
  if (!info.usable) return absl::FailedPreconditionError("this worker's device: " + info.reason);
  absl::StatusOr<v1::GetDeviceArenasResponse> arenas = client->GetDeviceArenas();
  if (!arenas.ok()) return arenas.status();
  if (arenas->device_kind().empty()) {
    return absl::FailedPreconditionError("the daemon has no GPU tier (gpu_tier.kind is off)");
  }
  if (arenas->device_kind() != TierKindOf(info.kind)) {
    return absl::FailedPreconditionError(
        absl::StrCat("the daemon's GPU tier is ", arenas->device_kind(),
                     "; this worker's device is ", TierKindOf(info.kind)));
  }
  std::unique_ptr<DeviceSession> session(new DeviceSession(client, device));
  if (absl::Status s = session->MapArenas(); !s.ok()) return s;
  return session;
}

absl::Status DeviceSession::MapArenas() {
  absl::MutexLock lock(&map_mu_);
  absl::StatusOr<v1::GetDeviceArenasResponse> arenas = client_->GetDeviceArenas();
  if (!arenas.ok()) return arenas.status();
  for (const v1::DeviceArena& a : arenas->arenas()) {
    gpu::ExportedArena e{.arena = a.arena()};
    if (a.ipc_handle().size() != sizeof(e.handle)) {
      return absl::InternalError(absl::StrCat("arena ", a.arena(), ": an IPC handle of ",
                                              a.ipc_handle().size(), " bytes, not ",
                                              sizeof(e.handle)));
    }
    std::memcpy(&e.handle, a.ipc_handle().data(), sizeof(e.handle));
    if (absl::Status s = FromGpu(mappings_.Map(e)); !s.ok()) return s;
  }
  return absl::OkStatus();
}

absl::StatusOr<DeviceFetchResult> DeviceSession::FetchToDevice(std::string_view model_id,
                                                               std::span<const uint32_t> tokens,
                                                               std::span<std::byte> out,
                                                               const DeviceFetchOptions& options) {
  absl::StatusOr<v1::PlaceOnDeviceResponse> placed =
      client_->PlaceOnDevice(model_id, tokens, options.lease_ttl);
  if (!placed.ok()) return placed.status();
  absl::StatusOr<DeviceFetchResult> result = CopyPlaced(*placed, out, options);
  if (placed->lease_id() != 0) {
    // The lease only kept the copies in place; an error releasing it (the
    // daemon went away) changes nothing the caller has.
    (void)client_->ReleaseLease(placed->lease_id());
  }
  return result;
}

absl::StatusOr<DeviceFetchResult> DeviceSession::CopyPlaced(const v1::PlaceOnDeviceResponse& placed,
                                                            std::span<std::byte> out,
                                                            const DeviceFetchOptions& options) {
  DeviceFetchResult result{.matched_tokens = placed.matched_tokens(),
                           .unplaced_tokens = placed.unplaced_tokens(),
                           .withheld_tokens = placed.withheld_tokens(),
                           .blocks = static_cast<uint32_t>(placed.blocks_size()),
                           .copied_into_tier = placed.copied_blocks()};
  if (placed.blocks().empty()) return result;
  const uint64_t block_bytes = placed.blocks(0).bytes();
  const uint64_t needed = block_bytes * placed.blocks_size();
  if (out.size() < needed) {
    return absl::InvalidArgumentError(absl::StrCat("the output buffer holds ", out.size(),
                                                   " bytes; the placed prefix needs ", needed));
  }
  // Resolve every block first (mapping arenas added since), then copy.
  std::vector<std::byte*> sources(placed.blocks_size());
  for (int i = 0; i < placed.blocks_size(); ++i) {
    const v1::DeviceBlock& b = placed.blocks(i);
    if (b.bytes() != block_bytes || b.index() != static_cast<uint32_t>(i)) {
      return absl::DataLossError(absl::StrCat("the daemon placed block ", b.index(), " of ",
                                              b.bytes(), " bytes at position ", i));
    }
    gpu::GpuStatus s = mappings_.Resolve(b.arena(), b.offset(), b.bytes(), &sources[i]);
    if (s.code == gpu::GpuCode::kNotFound) {
      if (absl::Status mapped = MapArenas(); !mapped.ok()) return mapped;
      s = mappings_.Resolve(b.arena(), b.offset(), b.bytes(), &sources[i]);
    }
    if (!s.ok()) return FromGpu(s);
  }
  gpu::StreamId stream = 0;
  if (absl::Status s = FromGpu(device_->CreateStream(&stream)); !s.ok()) return s;
  absl::Status copied;
  for (int i = 0; i < placed.blocks_size() && copied.ok(); ++i) {
    copied =
        FromGpu(device_->CopyAsync(gpu::CopyKind::kDeviceToDevice, out.data() + i * block_bytes,
                                   sources[i], block_bytes, stream));
  }
  if (copied.ok()) copied = FromGpu(device_->Synchronize(stream));
  (void)device_->DestroyStream(stream);
  if (!copied.ok()) return copied;
  if (options.verify) {
    std::vector<std::byte> host(block_bytes);
    for (int i = 0; i < placed.blocks_size(); ++i) {
      if (absl::Status s = FromGpu(device_->Copy(gpu::CopyKind::kDeviceToHost, host.data(),
                                                 out.data() + i * block_bytes, block_bytes));
          !s.ok()) {
        return s;
      }
      if (BlockChecksum(host) != placed.blocks(i).checksum()) {
        return absl::DataLossError(
            absl::StrCat("block ", i, " copied from the GPU tier does not match its checksum"));
      }
    }
  }
  return result;
}

}  // namespace kvcache
