// TierManager: the moves of blocks between the cache's levels (docs/tiers.md,
// docs/core-reshape.md step 3).
//
// It holds:
//   Migrate         one pass of the migrator: demotes the host policy's
//                   coldest blocks to level 0 while the host is past its
//                   high watermark, down to its low one, and each lower
//                   level's to the next the same way; drops GPU copies past
//                   the GPU tier's own watermark
//   DemoteOne       one demotion, for the migrator and for an append that
//                   finds the host pool full (Cache::MakeRoomForSpace), with
//                   the lower tier's admission (a frequency gate and a
//                   write-rate budget) and its eviction for a full write
//   ReadBack        a plan's lower-tier blocks read back, verified, and
//                   promoted into host memory where the pool has room
//   Prefetch / StartPrefetch
//                   that read-back ahead of a fetch, on the prefetch threads
//   RunRead         a fetch's read-back on the fetch-read threads, so that
//                   no thread serving requests waits on the disk
//   PlaceOnDevice   a prefix's blocks copied into the GPU tier and leased,
//                   for same-host workers (device_placement.cc)
//   DrainMoves      the migration log every move of the cache is recorded in
//
// It reaches the index through CacheAccess, by the move protocol
// (block_move.h): a victim is picked and claimed under the cache's lock,
// written to the lower tier with no lock held, and committed under the lock
// only if the block is still the one claimed; a read-back claims the blocks
// it reads the same way. The levels below host memory are an ordered list
// (CacheAccess::lower_levels); a node keeps one copy slot per level
// (lower_copies.h) and each level's policy ranks the blocks whose top copy
// it holds (the Cache's). The GPU tier's copies are the cache's too (a side
// map beside the nodes, DeviceCopies); placing and dropping them is here.
//
// Thread-safety: thread-safe. The move log and the write budget have a lock
// of their own, taken after the cache's and never held during I/O.
#ifndef KVCACHE_SERVER_CORE_TIER_MANAGER_H_
#define KVCACHE_SERVER_CORE_TIER_MANAGER_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "server/common/mutex.h"
#include "server/common/token_bucket.h"
#include "server/core/cache_access.h"
#include "server/core/cache_stats.h"
#include "server/core/cache_types.h"
#include "server/core/tier_workers.h"
#include "server/core/tiered_block.h"

namespace kvcache {

class TierManager {
 public:
  // REQUIRES: `access`'s cache outlives this. `log_moves`: whether the cache
  // has more than one level (one level moves nothing and drains no log).
  TierManager(CacheAccess access, const TierOptions& options, bool log_moves);
  ~TierManager();
  TierManager(const TierManager&) = delete;
  TierManager& operator=(const TierManager&) = delete;

  // Level 0 below host memory (null: the cache has one level), the level
  // whose copies a checkpoint re-attaches.
  Tier* lower_tier() const;
  // The GPU tier above host memory (null: none), for its arenas and kind.
  DeviceTier* device_tier() const { return access_.device_tier(); }

  // One pass of the migrator: each lower level with a level below it that
  // is past lower_high_watermark demotes its coldest blocks to the next one
  // until it is below lower_low_watermark (deepest first, so each makes room
  // for the one above); when the host's committed bytes are past its high
  // watermark (with a lower level), it demotes blocks to level 0 until they
  // are below the low one; at most max_demotions_per_pass blocks from each.
  // When the GPU tier is past its own watermark, drops its least recently
  // used unleased copies down to its low one. The daemon calls it from a
  // thread of its own (it writes to the SSD).
  MigrationResult Migrate();
  // Whether the host tier (with a lower level), a lower level with one below
  // it, or the GPU tier is past its high watermark (Migrate has work).
  bool NeedsMigration() const;

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
  // block, written to level 0 outside the lock when the admission takes it,
  // else evicted (a block some level has already is only dropped from the
  // host). Sets *bytes to the host bytes freed and *refused when the
  // admission refused it. `reason` goes to the move log. REQUIRES: a lower
  // level.
  DemoteOutcome DemoteOne(uint64_t* bytes, bool* refused, const char* reason);
  // Frees one block's room in lower level `level` by demotion to the next:
  // the coldest unpinned block whose top copy is there, read and written to
  // level + 1 outside the lock (only dropped from `level` when a deeper
  // level has it). Sets *bytes to the bytes moved. A copy that fails its
  // checksum on the way is dropped (kRaced); a write the next level refuses
  // leaves the block where it was (kRaced). REQUIRES: level + 1 <
  // lower_levels().
  DemoteOutcome DemoteLowerOne(size_t level, uint64_t* bytes);

  // What ReadBack reads, and into what.
  enum class ReadFor : uint8_t {
    kFetch,     // every block without a host copy: the caller serves host bytes
    kDevice,    // only blocks with neither a host nor a device copy
    kPromotion  // into pool memory only: stops at the first block with no room
  };
  // Reads the blocks of `blocks` (of `index`, pinned by the caller) that
  // `read_for` needs into host copies, each from its top lower copy: pool memory while the pool has
  // room (promoted: the block's host copy again, when it is still the block read), else the heap,
  // for this caller only, up to max_fetch_heap_bytes. Returns how many blocks from the first are
  // readable; a block whose copy fails its checksum is dropped from the cache (with the blocks
  // below it), never served. REQUIRES: a lower level; the cache's lock not held.
  size_t ReadBack(const PrefixIndex* index, std::vector<TieredBlock>& blocks, ReadFor read_for);

  // Reads the lower-tier blocks of `tokens`' cached prefix back into host
  // memory (promotes them while the host has room), as a fetch would. With
  // kBestEffort it queues the work and returns false at once (true when the
  // cache has no lower tier); with kWait it returns once the work is done
  // (true) or `timeout` passed (false; the work goes on). A zero `timeout`
  // waits as long as the work takes. Counted in CacheStats::prefetch.
  bool Prefetch(const ModelKey& model, std::span<const Token> tokens, bool accept_lossy,
                PrefetchMode mode, absl::Duration timeout);
  // Queues that read-back (as kBestEffort does) and returns its ticket, for a
  // caller that waits without blocking a thread (WorkTicket::OnDone;
  // a gRPC PREFETCH_WAIT lookup). Null when the cache has no lower tier or
  // the prefetch queue is full (counted as dropped).
  std::shared_ptr<WorkTicket> StartPrefetch(const ModelKey& model, std::span<const Token> tokens,
                                            bool accept_lossy);
  // Counts a waiter that stopped waiting before its prefetch was done.
  void CountLatePrefetch();

  // Copies the exact blocks of `tokens`' cached prefix that the GPU tier
  // does not hold yet into it (reading lower-only blocks back first,
  // verified) and leases the whole placed prefix for `lease_ttl` (zero: the
  // default), so that its device copies stay where DevicePlacement says
  // until ReleaseLease or the expiry, whatever the tier does meanwhile. Room
  // is made by dropping the least recently used device copies no lease
  // holds; when none is left the placement stops there (unplaced_tokens).
  // FAILED_PRECONDITION without a GPU tier; NOT_FOUND for an unknown model;
  // INVALID_ARGUMENT for too many tokens or a ttl past max_lease_ttl;
  // RESOURCE_EXHAUSTED when the lease would pass max_leases or
  // max_lease_tokens (nothing is leased then, but copies placed stay).
  // (device_placement.cc)
  absl::StatusOr<DevicePlacement> PlaceOnDevice(const ModelKey& model,
                                                std::span<const Token> tokens,
                                                absl::Duration lease_ttl = absl::ZeroDuration());

  // Runs `run` on a fetch-read thread; when the queue is full, or without a
  // lower tier, runs it on the caller's thread. A job still queued when the
  // cache shuts down runs `drop` instead.
  void RunRead(TierWorkers::Job run, TierWorkers::Job drop);

  // The I/O threads' counters (zero without a lower tier).
  WorkStats prefetch_stats() const;
  WorkStats fetch_read_stats() const;
  // Finishes the running reads and drops the queued ones (their `drop`s
  // run); their jobs use the cache, so the cache calls it first thing in
  // its destructor.
  void StopWorkers();

 private:
  // The frequency gate and the write-rate budget.
  bool Admit(const IndexNode& node, uint64_t bytes, absl::Time now);
  // Writes `payload` to lower level `level`, making room there while it
  // reports it is full (a few blocks at most): by demotion to the next
  // level when there is one (DemoteLowerOne), else by FreeLowerLevel.
  absl::StatusOr<StoredRef> WriteLower(size_t level, uint64_t key, const BlockPayload& payload);
  bool HostNeedsMigration() const;
  // The GPU tier: whether it is past its high watermark; the pass that drops
  // its copies down to the low one (returns how many it dropped); a write
  // that drops copies for room (a bounded number of times).
  bool DeviceNeedsMigration() const;
  uint64_t MigrateDevice();
  absl::StatusOr<StoredRef> WriteDevice(uint64_t key, const BlockPayload& payload);
  // Whether level `level`'s allocated bytes are past `watermark` x its
  // capacity.
  bool LowerNeedsMigration(size_t level, double watermark) const;
  // The migrator's passes over the host and over one lower level.
  void MigrateHost(MigrationResult* result);
  void MigrateLower(size_t level, MigrationResult* result);
  // Reads `reads` (of blocks[which[k]], each from its block's level) one
  // batch per level.
  void ReadEachLevel(const std::vector<TieredBlock>& blocks, const std::vector<size_t>& which,
                     std::vector<StoredRead>& reads);

  const CacheAccess access_;
  const TierOptions options_;
  const bool log_moves_;
  // Background promotions, and the lower-tier reads of fetches; null
  // without a lower tier.
  std::unique_ptr<TierWorkers> prefetcher_;
  std::unique_ptr<TierWorkers> fetch_readers_;
  mutable Mutex mu_;
  std::vector<MoveRecord> pending_moves_ ABSL_GUARDED_BY(mu_);
  uint64_t moves_unlogged_ ABSL_GUARDED_BY(mu_) = 0;
  TokenBucket lower_writes_ ABSL_GUARDED_BY(mu_);  // options_.lower_write_bytes_per_second
};

}  // namespace kvcache

#endif  // KVCACHE_SERVER_CORE_TIER_MANAGER_H_
