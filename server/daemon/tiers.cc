#include "server/daemon/tiers.h"

#include <spdlog/spdlog.h>

#include "absl/strings/str_cat.h"
#include "server/config/tier_list.h"
#include "server/daemon/config_translation.h"
#include "server/tier/gpu_device_tier.h"
#include "server/tier/ssd_tier.h"

namespace kvcache {

absl::StatusOr<std::shared_ptr<Tier>> SsdTierFromConfig(const v1::SsdTierConfig& c) {
  if (c.path().empty()) return nullptr;
  SsdStoreOptions options{.path = c.path(),
                          .capacity_bytes = c.capacity_bytes(),
                          .region_bytes = c.region_bytes(),
                          .direct_io = c.direct_io(),
                          .engine = c.io_engine() == "io_uring"  ? SsdIoEngine::kIoUring
                                    : c.io_engine() == "threads" ? SsdIoEngine::kThreadPool
                                                                 : SsdIoEngine::kAuto,
                          .io_threads = c.io_threads(),
                          .staging_cache_bytes = c.staging_cache_bytes(),
                          .epoch = static_cast<uint64_t>(absl::ToUnixNanos(absl::Now()))};
  absl::StatusOr<std::shared_ptr<Tier>> store = OpenSsdTier(options);
  if (!store.ok()) {
    if (c.on_open_failure() == "skip") {
      spdlog::error("ssd tier: {}; running without it (ssd_tier.on_open_failure is skip)",
                    store.status().ToString());
      return nullptr;
    }
    return absl::Status(store.status().code(),
                        absl::StrCat("ssd tier at ", c.path(), ": ", store.status().message()));
  }
  const SsdStoreStats s = SsdStatsOf(**store);
  spdlog::info("ssd tier: {} bytes at {}, {} I/O, engine {}", s.capacity_bytes, c.path(),
               s.direct_io ? "direct" : "buffered (the file system refused O_DIRECT)", s.engine);
  return store;
}

absl::StatusOr<std::vector<Cache::LowerLevel>> LowerLevelsFromConfig(const v1::ServerConfig& config,
                                                                     Clock* clock) {
  std::vector<Cache::LowerLevel> levels;
  for (const std::string& kind : TierListOf(config)) {
    if (kind == "host") continue;
    absl::StatusOr<std::shared_ptr<Tier>> tier =
        absl::InvalidArgumentError(absl::StrCat("tiers: \"", kind, "\" is not a level"));
    if (kind == "ssd") tier = SsdTierFromConfig(config.ssd_tier());
    if (!tier.ok()) return tier.status();
    if (*tier == nullptr) continue;  // skipped: logged by its opener
    levels.push_back({*std::move(tier), EvictionPolicyFromConfig(config.cache(), clock)});
  }
  return levels;
}

absl::StatusOr<std::shared_ptr<DeviceTier>> GpuTierFromConfig(const v1::GpuTierConfig& c) {
  if (c.kind().empty()) return nullptr;
  absl::StatusOr<std::shared_ptr<DeviceTier>> tier =
      OpenGpuDeviceTier({.kind = c.kind(),
                         .device = static_cast<int>(c.device()),
                         .capacity_bytes = c.capacity_bytes(),
                         .arena_bytes = c.arena_bytes(),
                         .slab_bytes = c.slab_bytes(),
                         .min_block_bytes = c.min_block_bytes()});
  if (!tier.ok()) {
    if (c.on_unavailable() == "skip") {
      spdlog::error("{}; running without it (gpu_tier.on_unavailable is skip)",
                    tier.status().ToString());
      return nullptr;
    }
    return tier.status();
  }
  spdlog::info("gpu tier: {} bytes of {} ({}), slabs of {} bytes", c.capacity_bytes(), c.kind(),
               (*tier)->device_description(), c.slab_bytes());
  return tier;
}

}  // namespace kvcache
