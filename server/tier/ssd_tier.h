// SsdTier: the SSD tier as the cache sees it, a Tier over an
// SsdStore (ssd_store.h: a preallocated file of checksummed extents).
//
// Each StoredCopy holds its SsdRef, so the extent stays allocated as long as
// the index, a lease or a read in flight holds the copy. Reads are verified
// by the SsdStore (header and XXH3-64 of the payload): a copy that fails is
// DATA_LOSS, which the cache turns into a dropped block.
//
// Persistent: Locate() gives the extent's offset, footprint, sequence and
// epoch; ReattachBatch(), Sync() and retention are SsdStore's (ssd_store.h).
//
// Thread-safe, as SsdStore.
#ifndef KVCACHE_SERVER_TIER_SSD_TIER_H_
#define KVCACHE_SERVER_TIER_SSD_TIER_H_

#include <memory>

#include "absl/status/statusor.h"
#include "server/core/tier.h"
#include "server/tier/ssd_store.h"

namespace kvcache {

// Opens the SSD tier. Errors as SsdStore::Open.
absl::StatusOr<std::shared_ptr<Tier>> OpenSsdTier(const SsdStoreOptions& options);

// The SsdStore's own statistics (engine, direct I/O, regions), for the
// start-up log and the metrics; REQUIRES: `store` came from OpenSsdTier.
SsdStoreStats SsdStatsOf(const Tier& store);

// Where a copy lives in the file (tests and tools that inspect the file);
// REQUIRES: `copy` came from an OpenSsdTier store.
const SsdExtent& SsdExtentOf(const StoredCopy& copy);

}  // namespace kvcache

#endif  // KVCACHE_SERVER_TIER_SSD_TIER_H_
