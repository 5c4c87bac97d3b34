// Tier: a tier below host memory (the SSD tier) that keeps copies of
// sealed blocks, so the cache can hold more than DRAM.
//
// The cache demotes a cold block by writing its payload to the store and
// dropping the host copy; a hit on a demoted block reads it back (and may
// promote it). A StoredCopy is one block's copy in the store: immutable,
// carrying the block's seal (size and checksums). It is shared through
// StoredRef; the store reuses a copy's space only once the last reference
// drops (and, for a retained copy, once retention lets it go), so a
// reader holding a reference never reads space rewritten under it. The prefix
// index holds one reference per demoted block; leases and reads in flight
// hold more.
//
// Persistence (docs/ssd_format.md, "Re-attaching after a restart"): a
// persistent store (persistent() is true: the SSD tier) keeps its copies in a
// file that outlives the process. A checkpoint records, for each copy it
// needs, the copy's key, seal and StoredLocation (Locate()); the next process
// opens the same file with a new epoch and hands those back to ReattachBatch()
// before its first Write(), which makes the copies live again once their
// headers verify. Sync() makes the copies written so far durable, so a
// checkpoint commits only after a Sync(). Retention keeps the space of
// copies a checkpoint may list from being rewritten while that checkpoint may
// be restored, within a budget:
//
//   store.SetRetention(true);                     // once, before checkpointing
//   store.SetRetentionBudget(bytes);              // what writes leave alone
//   const uint64_t mark = store.CheckpointStarted();  // as checkpoint N starts
//   ... write checkpoint N, store.Sync(), commit it ...
//   store.CheckpointCommitted(mark);              // or CheckpointFailed()
//
// Only copies a checkpoint may list are retained (those freed while one is
// being taken, re-attached ones, and those written before the last commit);
// past the budget a write reuses the oldest retained space, and the newest
// checkpoint then fails to re-attach that copy (docs/checkpoints.md, "How
// retention and the SSD tier interact").
//
// A volatile store (MemoryTier) keeps the defaults: not persistent,
// Locate() nullopt, ReattachBatch() UNIMPLEMENTED, Sync() OK, retention a
// no-op.
//
// Integrity: Read() verifies what it read against the copy's checksum and
// answers DATA_LOSS on any mismatch; it never returns unverified bytes as OK.
// The cache drops a block that fails (a miss, counted), never serves it.
//
// Every implementation passes the behaviour suite in
// server/tier/tier_behaviour_test.cc.
//
// Thread-safety: every method may be called concurrently. The store must
// outlive its copies.
#ifndef KVCACHE_SERVER_CORE_TIER_H_
#define KVCACHE_SERVER_CORE_TIER_H_

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "server/core/block.h"
#include "server/core/pin.h"
#include "server/core/stored_copy.h"

namespace kvcache {

struct TierStats {
  std::string kind;  // "ssd", "memory"
  uint64_t capacity_bytes = 0;
  uint64_t allocated_bytes = 0;  // footprints of live copies
  uint64_t payload_bytes = 0;    // sizes of live copies
  uint64_t live_copies = 0;
  uint64_t writes = 0;
  uint64_t write_bytes = 0;
  uint64_t reads = 0;
  uint64_t read_bytes = 0;
  uint64_t checksum_failures = 0;  // reads that answered DATA_LOSS
  uint64_t failed_writes = 0;      // RESOURCE_EXHAUSTED answers
  // Footprints of copies whose last reference dropped while retention was on
  // (not live, not in allocated_bytes, but their space is not reusable until
  // a checkpoint commits or fails, or a write reuses it past the budget).
  uint64_t retained_bytes = 0;
  // Retained spaces a write reused because retention was past its budget:
  // the checkpoint that listed those copies no longer re-attaches them.
  uint64_t retained_reused = 0;
  uint64_t reattached = 0;  // copies made live by ReattachBatch()
  // Host memory the store itself holds outside the host pool: the SSD tier's
  // bounce buffers (idle ones kept for reuse, and those of I/O in progress).
  uint64_t staging_bytes = 0;
};

// Where a copy lives in a persistent store: enough, with its key and seal, to
// re-attach it after a restart. For the SSD tier: the extent's byte offset in
// the file, its footprint (slot size), and the (epoch, sequence) of the write
// that made it, which identifies that write.
struct StoredLocation {
  uint64_t offset = 0;
  uint64_t footprint = 0;
  uint64_t sequence = 0;
  uint64_t epoch = 0;
};

// One copy to re-attach (Tier::ReattachBatch).
struct ReattachRequest {
  uint64_t key = 0;         // the block's chain key, as written
  BlockSeal seal;           // the seal the copy was written with
  StoredLocation location;  // what Locate() said of the copy
  StoredRef copy;           // set by ReattachBatch on success, else null
  absl::Status status;      // set by ReattachBatch
};

// One read of a batch.
struct StoredRead {
  const StoredCopy* copy = nullptr;
  std::span<std::byte> out;  // REQUIRES: out.size() == copy->seal().size
  absl::Status status;       // set by ReadBatch
};

class Tier {
 public:
  virtual ~Tier() = default;

  // Writes a copy of the sealed `payload` under `key`. RESOURCE_EXHAUSTED
  // when there is no room (the caller frees copies and retries; space held by
  // retention within its budget is not room: while those retained bytes are
  // the shortfall the answer is still RESOURCE_EXHAUSTED, and the caller
  // evicts; retained space past the budget is reused first);
  // INVALID_ARGUMENT when the block could never fit.
  virtual absl::StatusOr<StoredRef> Write(uint64_t key, const BlockPayload& payload) = 0;

  // Reads `copy` into `out`, verified: DATA_LOSS when what was read does not
  // match the copy's checksum (or its header). REQUIRES: `copy` came from this
  // store; out.size() == copy.seal().size.
  virtual absl::Status Read(const StoredCopy& copy, std::span<std::byte> out) = 0;

  // Several reads at once (a store may have them all in flight together);
  // sets each one's status.
  virtual void ReadBatch(std::span<StoredRead> reads) {
    for (StoredRead& r : reads) r.status = Read(*r.copy, r.out);
  }

  virtual TierStats GetStats() const = 0;

  // True when copies outlive the process (Locate() and ReattachBatch() work).
  virtual bool persistent() const { return false; }

  // Where `copy` lives, for a checkpoint; nullopt for a volatile store.
  // REQUIRES: `copy` came from this store.
  virtual std::optional<StoredLocation> Locate(const StoredCopy& /*copy*/) const {
    return std::nullopt;
  }

  // Re-attaches copies written by an earlier process to the same file: reads
  // each one's header (the whole batch at once where the store can) and checks
  // it against the request's key, seal.size, seal.checksum and location
  // (footprint, sequence, epoch). Sets each request's status, in request order:
  //   OK: the copy is live again; `copy` holds it (with the request's seal),
  //     and its payload is verified on every Read() as any copy's is.
  //   DATA_LOSS: the header does not match (overwritten, torn, never written).
  //   FAILED_PRECONDITION: the slot conflicts with one already live (the same
  //     slot, an overlapping one, or one in a region serving another size
  //     class; the first copy re-attached into a region decides its class),
  //     or this process already wrote (every request of a batch called after
  //     the first Write()).
  //   INVALID_ARGUMENT: the location is not a slot of this store's layout
  //     (past its capacity, not on a slot boundary, a footprint that is not
  //     the size class of seal.size: region_bytes or capacity changed).
  //   UNAVAILABLE: the header could not be read (I/O error).
  //   UNIMPLEMENTED: the store is not persistent (the default).
  // REQUIRES: called before the first Write() of this store (any Write(),
  // even one refused for want of room).
  virtual void ReattachBatch(std::span<ReattachRequest> requests) {
    for (ReattachRequest& r : requests) {
      r.copy = nullptr;
      r.status = absl::UnimplementedError("this tier is not persistent");
    }
  }

  // Makes every copy written so far durable (fdatasync of the SSD file);
  // UNAVAILABLE when the device says no. OK at once for a volatile store.
  virtual absl::Status Sync() { return absl::OkStatus(); }

  // Retention of freed space. While on, a copy whose last reference drops
  // keeps its space (counted in retained_bytes, no longer live) instead of
  // freeing it, if a checkpoint may list the copy: one is being taken, or
  // the copy was re-attached, or it was written before the last
  // CheckpointCommitted(). Turning it off frees nothing already retained.
  // Off at start; a no-op for a volatile store.
  virtual void SetRetention(bool /*on*/) {}

  // Retained bytes that writes leave alone; past them a write that finds no
  // room reuses the oldest retained space (counted in retained_reused)
  // before answering RESOURCE_EXHAUSTED. Default: no limit (never reused).
  virtual void SetRetentionBudget(uint64_t /*bytes*/) {}

  // A checkpoint starts; until CheckpointCommitted() or CheckpointFailed()
  // every freed copy is retained (the checkpoint may have captured it).
  // Returns a mark of the frees so far (monotonic; 0 for a volatile store).
  virtual uint64_t CheckpointStarted() { return 0; }

  // The checkpoint that started at `mark` committed: frees the space retained
  // by frees before the mark (that checkpoint cannot list them); copies
  // written so far may be in it, so freeing one later retains it.
  virtual void CheckpointCommitted(uint64_t /*mark*/) {}

  // The checkpoint being taken failed: frees the retained space of copies no
  // committed checkpoint can list (written since the last commit); the
  // newest committed checkpoint's stay retained.
  virtual void CheckpointFailed() {}
};

}  // namespace kvcache

#endif  // KVCACHE_SERVER_CORE_TIER_H_
