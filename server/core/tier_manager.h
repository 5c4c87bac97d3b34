// TierManager: the moves of blocks between the cache's levels (docs/tiers.md,
// docs/core-reshape.md step 3).
//
// It holds the migrator and what the migrator alone uses:
//   Migrate         one pass: demotes the host policy's coldest blocks to the
//                   lower tier while the host is past its high watermark, down
//                   to its low one; drops GPU copies past the GPU tier's own
//                   watermark
//   DemoteOne       one demotion, for the migrator and for an append that
//                   finds the host pool full (Cache::MakeRoomForSpace)
//   the lower tier's admission (a frequency gate and a write-rate budget),
//   the lower tier's eviction for a write that finds it full, and the
//   migration log (DrainMoves) every move of the cache is recorded in.
//
// It reaches the index through CacheAccess, by the move protocol
// (block_move.h): a victim is picked and claimed under the cache's lock,
// written to the lower tier with no lock held, and committed under the lock
// only if the block is still the one claimed. Not here yet (the rest of
// step 3): read-back and promotion on fetch, prefetch, GPU placement and the
// I/O threads, which are still Cache's, and one copy slot per level.
//
// Thread-safety: thread-safe. The move log and the write budget have a lock
// of their own, taken after the cache's and never held during I/O.
#ifndef KVCACHE_SERVER_CORE_TIER_MANAGER_H_
#define KVCACHE_SERVER_CORE_TIER_MANAGER_H_

#include <cstddef>
#include <cstdint>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "server/common/mutex.h"
#include "server/common/token_bucket.h"
#include "server/core/cache_access.h"
#include "server/core/cache_stats.h"
#include "server/core/cache_types.h"

namespace kvcache {

class TierManager {
 public:
  // REQUIRES: `access`'s cache outlives this. `log_moves`: whether the cache
  // has more than one level (one level moves nothing and drains no log).
  TierManager(CacheAccess access, const TierOptions& options, bool log_moves);
  TierManager(const TierManager&) = delete;
  TierManager& operator=(const TierManager&) = delete;

  // One pass of the migrator: when the host's committed bytes are past its
  // high watermark (with a lower tier), demotes blocks until they are below
  // the low one, at most max_demotions_per_pass; when the GPU tier is past
  // its own, drops its least recently used unleased copies down to its low
  // watermark. The daemon calls it from a thread of its own (it writes to
  // the SSD).
  MigrationResult Migrate();
  // Whether the host tier (with a lower tier) or the GPU tier is past its
  // high watermark (Migrate has work).
  bool NeedsMigration() const;
  bool has_lower_tier() const;

  // The tier moves since the last call, oldest first (at most
  // kMaxPendingMoves are kept; older ones are counted in
  // TierCounters::moves_unlogged). The daemon's migrator writes them to the
  // migration log.
  std::vector<MoveRecord> DrainMoves();
  static constexpr size_t kMaxPendingMoves = 65536;
  // Records one move (a no-op with a single level). `to` is "none" for an
  // eviction or a dropped copy; `took` the write or read, when there was one.
  void LogMove(const IndexNode& node, const char* from, const char* to, const char* reason,
               uint64_t bytes, absl::Duration took = absl::ZeroDuration());
  uint64_t moves_unlogged() const;

  // What DemoteOne did.
  enum class DemoteOutcome : uint8_t {
    kNothing,    // no host block can leave (all pinned)
    kDemoted,    // written to the lower tier, host copy dropped
    kCleanDrop,  // the lower tier had it: host copy dropped, nothing written
    kEvicted,    // not admitted (or the write failed): evicted instead
    kRaced,      // the block changed during the write: nothing freed
  };
  // Frees one host block by demotion: the host policy's first unpinned
  // block, written to the lower tier outside the lock when the admission
  // takes it, else evicted. Sets *bytes to the host bytes freed and
  // *refused when the admission refused it. `reason` goes to the move log.
  // REQUIRES: a lower tier.
  DemoteOutcome DemoteOne(uint64_t* bytes, bool* refused, const char* reason);

 private:
  // The frequency gate and the write-rate budget.
  bool Admit(const IndexNode& node, uint64_t bytes, absl::Time now);
  // Writes `payload` to the lower tier, evicting lower-only leaves (a few
  // at most) while it reports it is full.
  absl::StatusOr<StoredRef> WriteLower(uint64_t key, const BlockPayload& payload);
  bool HostNeedsMigration() const;

  const CacheAccess access_;
  const TierOptions options_;
  const bool log_moves_;
  mutable Mutex mu_;
  std::vector<MoveRecord> pending_moves_ ABSL_GUARDED_BY(mu_);
  uint64_t moves_unlogged_ ABSL_GUARDED_BY(mu_) = 0;
  TokenBucket lower_writes_ ABSL_GUARDED_BY(mu_);  // options_.lower_write_bytes_per_second
};

}  // namespace kvcache

#endif  // KVCACHE_SERVER_CORE_TIER_MANAGER_H_
