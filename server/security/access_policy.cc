#include "server/security/access_policy.h"

#include <array>
#include <utility>

namespace kvcache {

namespace {

constexpr auto kPolicy = std::to_array<std::pair<std::string_view, Access>>({
    // kvcache.v1.Cache
    {"RegisterModel", Access::kData},
    {"Lookup", Access::kData},
    {"BatchLookup", Access::kData},
    {"ReleaseLease", Access::kData},
    {"Append", Access::kData},
    {"Fetch", Access::kData},
    {"Evict", Access::kData},
    {"ReportAttention", Access::kData},
    // Device IPC handles map a whole arena, every tenant's blocks in it.
    {"PlaceOnDevice", Access::kDaemon},
    {"GetDeviceArenas", Access::kDaemon},
    // kvcache.v1.Admin
    {"WhoAmI", Access::kAnyRole},
    {"GetServerInfo", Access::kAnyRole},
    {"ListModels", Access::kAnyRole},
    {"GetStats", Access::kAnyRole},
    {"UpdateModelPolicy", Access::kAdmin},
    {"UnregisterModel", Access::kAdmin},
    {"Checkpoint", Access::kDaemon},
    {"ListCheckpoints", Access::kDaemon},
    {"VerifyCheckpoint", Access::kDaemon},
    {"VerifyBlocks", Access::kAdmin},
    {"DumpMemory", Access::kDaemon},
    {"InspectSequence", Access::kAdmin},
    {"SetLogLevel", Access::kDaemon},
    // The status page's per-tenant detail (HTTP, server/status): every
    // tenant's models, prefixes and keys.
    {"StatusPageDetail", Access::kDaemon},
    // The shared-memory data plane (kvcache.v1.ShmRequest ops)
    {"ShmHello", Access::kData},
    {"ShmAttachRegion", Access::kData},
    {"ShmDetachRegion", Access::kData},
    {"ShmLookup", Access::kData},
    {"ShmBatchLookup", Access::kData},
    {"ShmFetchInto", Access::kData},
    {"ShmAppendFrom", Access::kData},
    {"ShmReleaseLease", Access::kData},
});

}  // namespace

std::optional<Access> AccessOf(std::string_view method) {
  for (const auto& [name, access] : kPolicy) {
    if (name == method) return access;
  }
  return std::nullopt;
}

bool RoleAllows(Role role, Access access) {
  switch (access) {
    case Access::kAnyRole:
      return true;
    case Access::kData:
      return role == Role::kWorker || role == Role::kAdmin;
    case Access::kAdmin:
    case Access::kDaemon:
      return role == Role::kAdmin;
  }
  return false;
}

}  // namespace kvcache
