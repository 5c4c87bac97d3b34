// How the daemon's configuration (kvcache.v1.ServerConfig, docs/configuration.md)
// becomes the options of the modules kvcached assembles: the cache, its host
// pool, its importance policy and eviction policies, the socket paths.
//
// Pure translation: no I/O and no logging. The config is already validated
// (server/config/config.h, ValidateConfig), so nothing here fails; what the
// config cannot say (the daemon's secret, calibrated weights, the tiers that
// opened) is filled in by the caller.
#ifndef KVCACHE_SERVER_DAEMON_CONFIG_TRANSLATION_H_
#define KVCACHE_SERVER_DAEMON_CONFIG_TRANSLATION_H_

#include <memory>
#include <string>

#include "kvcache/v1/config.pb.h"
#include "server/common/clock.h"
#include "server/core/cache.h"
#include "server/core/eviction_policy.h"
#include "server/core/slab_pool.h"

namespace kvcache {

// `value`, or "" when it is "none" (kDisabled: an address or socket turned off).
std::string Enabled(const std::string& value);

// listen.shm_socket, or the gRPC socket's path + ".shm" when it is unset;
// empty when disabled.
std::string ShmSocketPath(const v1::ListenConfig& listen);

ImportanceOptions ImportanceFromConfig(const v1::ImportanceConfig& c);

// The eviction policy cache.eviction_policy names (validated: lru or lru_k).
std::unique_ptr<EvictionPolicy> EvictionPolicyFromConfig(const v1::CacheConfig& c, Clock* clock);

// The host tier's slab pool.
SlabPoolOptions HostPoolOptionsFromConfig(const v1::HostTierConfig& host);

// The cache's options from limits, host_tier, ssd_tier, gpu_tier, security and
// importance. Left to the caller: block_hash_keys (the daemon's secret) and
// importance.initial_weights (the calibration file).
CacheOptions CacheOptionsFromConfig(const v1::ServerConfig& config);

}  // namespace kvcache

#endif  // KVCACHE_SERVER_DAEMON_CONFIG_TRANSLATION_H_
