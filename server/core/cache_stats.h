// CacheStats: a point-in-time snapshot of what the cache holds and did.
// The Admin RPC and the metrics module both read it; neither reaches into
// the cache's internals, and the core links no metrics library.
#ifndef KVCACHE_SERVER_CORE_CACHE_STATS_H_
#define KVCACHE_SERVER_CORE_CACHE_STATS_H_

#include <cstdint>
#include <string>
#include <vector>

#include "server/core/layout.h"
#include "server/core/slab_pool.h"

namespace kvcache {

struct ModelStats {
  ModelKey model;
  ModelLayout layout;
  uint64_t blocks = 0;
  uint64_t tokens = 0;
  uint64_t bytes = 0;
  uint64_t hit_tokens = 0;   // counted by Lookup
  uint64_t miss_tokens = 0;  // whole-block tokens Lookup did not find
  uint64_t appended_blocks = 0;
  uint64_t deduplicated_blocks = 0;
  uint64_t evicted_blocks = 0;  // by capacity, explicit eviction or expiry
};

struct CacheStats {
  std::vector<ModelStats> models;
  SlabPoolStats host_pool;
  uint64_t blocks = 0;
  uint64_t payload_bytes = 0;
  uint64_t active_leases = 0;
  uint64_t capacity_evictions = 0;
  uint64_t rejected_appends = 0;
};

}  // namespace kvcache

#endif  // KVCACHE_SERVER_CORE_CACHE_STATS_H_
