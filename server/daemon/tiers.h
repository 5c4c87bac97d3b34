// The tiers kvcached opens at start-up from its config: the levels below
// host memory that `tiers` lists (the SSD tier, ssd_tier) and the GPU tier
// (gpu_tier). Each is optional; a tier that is configured but cannot be
// opened stops the start, or is skipped with an error logged when its
// on_open_failure / on_unavailable says "skip".
#ifndef KVCACHE_SERVER_DAEMON_TIERS_H_
#define KVCACHE_SERVER_DAEMON_TIERS_H_

#include <memory>
#include <vector>

#include "absl/status/statusor.h"
#include "kvcache/v1/config.pb.h"
#include "server/common/clock.h"
#include "server/core/cache.h"
#include "server/core/device_tier.h"
#include "server/core/tier.h"

namespace kvcache {

// The SSD tier of ssd_tier, or null when it is off. An error when it cannot be
// opened and on_open_failure is "refuse".
absl::StatusOr<std::shared_ptr<Tier>> SsdTierFromConfig(const v1::SsdTierConfig& c);

// The levels below host memory that the config's `tiers` lists
// (TierListOf), opened in its order, each ranked by the configured eviction
// policy; a level whose store is skipped (on_open_failure "skip") is left
// out. An error when one cannot be opened and its on_open_failure is
// "refuse". REQUIRES: `config` passed ValidateConfig.
absl::StatusOr<std::vector<Cache::LowerLevel>> LowerLevelsFromConfig(const v1::ServerConfig& config,
                                                                     Clock* clock);

// The GPU tier of gpu_tier, or null when it is off. An error when its device
// is not usable and on_unavailable is "refuse".
absl::StatusOr<std::shared_ptr<DeviceTier>> GpuTierFromConfig(const v1::GpuTierConfig& c);

}  // namespace kvcache

#endif  // KVCACHE_SERVER_DAEMON_TIERS_H_
