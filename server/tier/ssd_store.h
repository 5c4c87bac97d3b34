// SsdStore: the SSD tier's block store.
//
// The cache demotes cold blocks from host memory to one file (or block device)
// through this store and reads them back on a hit. Each block is written once
// as an extent: a 64-byte header (magic, version, key, payload size, sequence,
// epoch, payload checksum, header checksum; docs/ssd_format.md) followed by
// the payload, the whole rounded up to 4 KiB so that O_DIRECT can write it.
//
// Space: the file is carved into regions of region_bytes. Each extent takes a
// slot of a size class: one 4 KiB page for the header plus a slab-pool step
// (the powers of two from 4 KiB and 1.25/1.5/1.75 times each, multiples of
// 4 KiB), and region_bytes itself, so a block of 2^k payload bytes takes
// 2^k + 4 KiB (a class from the page-rounded size up, RoundedSize()). A
// region serves one class at a time, holds floor(region_bytes / class) slots
// and returns to the free-region list when its last extent is freed. Writes
// take the lowest free slot of the lowest partly used region of their class
// (else the lowest free region), so they stay mostly region-sequential. For
// blocks of S bytes, region_bytes of at least 16 * S keeps the slack of a
// region (region_bytes mod class) under 1/16. Every class in use holds at
// least one region, so capacity_bytes should hold many more regions than the
// number of distinct classes the writers use.
//
// Ownership: Write() returns an SsdRef, a shared reference to an immutable
// SsdExtent; the extent's slot is freed when its last reference drops, so a
// reader holding a reference never reads a slot rewritten under it. The store
// must outlive every extent it handed out. The store never evicts: when no
// slot of a class is free, Write() answers RESOURCE_EXHAUSTED and the caller
// drops references and retries.
//
// Restart (docs/ssd_format.md, "Re-attaching after a restart"): the file
// outlives the process. Each extent remembers the epoch of the store that
// wrote it (SsdStoreOptions::epoch, in its header); (epoch, sequence)
// identifies one write. A store opened on the same file, with a new epoch,
// re-attaches extents of an earlier process with ReattachBatch() before its
// first Write(): their headers are read and checked, their slots become live
// again, and new writes take other slots (sequence numbers continue above
// the highest re-attached one). Freeing a slot and closing the store never
// write to the file, so a store destroyed (or a process killed) leaves every
// extent it wrote as it was. Sync() makes the writes so far durable.
//
// Retention (docs/ssd_format.md, "Retention"): while SetRetention(true) is
// in force, an extent whose last reference drops keeps its slot (retained,
// counted in retained_bytes) if a checkpoint may list it: a checkpoint is
// being taken (between CheckpointStarted() and CheckpointCommitted() or
// CheckpointFailed()), or the extent was re-attached, or it was written
// before the last CheckpointCommitted(). Any other extent is in no
// checkpoint, and its slot is freed at once. CheckpointCommitted(mark) frees
// the slots retained before `mark`; CheckpointFailed() frees those no
// committed checkpoint can list. Retained slots are not free, but they are
// not kept at any price: while retained_bytes is above the retention budget
// (SetRetentionBudget()), a Write() that finds no free slot reuses the oldest
// retained slots first (counted in retained_reused); the checkpoint that
// listed the extent there then fails to re-attach it (its header no longer
// verifies). Within the budget, a Write() that finds no slot answers
// RESOURCE_EXHAUSTED as when the store is full of live extents.
//
// Integrity: Read() verifies everything it returns: the header against the
// extent (magic, version, header checksum, key, size, sequence, and the
// extent's own epoch, which for a re-attached extent is its writer's) and the
// XXH3-64 of the payload bytes that landed in `out` against
// extent.checksum(). A mismatch or a short read is DATA_LOSS (counted in
// checksum_failures); an I/O error is UNAVAILABLE with the errno text. No
// error aborts the process.
//
// I/O engines: io_uring (one ring per calling thread; ReadBatch submits a
// whole batch with one system call) or a pool of io_threads threads issuing
// pread/pwrite. kAuto picks io_uring (see ssd_store.cc for the measurements);
// when io_uring cannot be set up (old kernel, seccomp) the store uses the
// thread pool and says so in SsdStoreStats::engine.
//
// Thread-safe: every method may be called concurrently.
#ifndef KVCACHE_SERVER_TIER_SSD_STORE_H_
#define KVCACHE_SERVER_TIER_SSD_STORE_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace kvcache {

enum class SsdIoEngine : uint8_t { kAuto, kIoUring, kThreadPool };

struct SsdStoreOptions {
  // A regular file (created if missing and preallocated with fallocate to
  // capacity_bytes) or a block device (at least capacity_bytes large).
  std::string path;
  uint64_t capacity_bytes = uint64_t{1} << 30;  // file size; nothing is written past it
  uint64_t region_bytes = uint64_t{16} << 20;   // power of two, 64 KiB .. 1 GiB
  // O_DIRECT. When the file system refuses it (EINVAL at open or on the first
  // aligned read), the store uses buffered I/O: SsdStoreStats::direct_io is
  // false and a line goes to stderr; Open() does not fail.
  bool direct_io = true;
  SsdIoEngine engine = SsdIoEngine::kAuto;
  uint32_t io_threads = 2;    // thread-pool engine: 1 .. 256
  uint32_t queue_depth = 64;  // io_uring ring entries (also ReadBatch's chunk): 1 .. 4096
  // Every read and write goes through a page-aligned bounce buffer (the
  // staging); idle ones are kept for reuse up to this many bytes, the rest
  // freed. 0 .. 1 GiB.
  uint64_t staging_cache_bytes = uint64_t{8} << 20;
  // Written into the header of every extent this store writes (and checked
  // when it is read). Give each process a new one (e.g. one more than the
  // newest epoch its checkpoint references), so that no header an earlier
  // process left can pass for a write of this one.
  uint64_t epoch = 0;

  // INVALID_ARGUMENT naming the field when out of range; capacity_bytes must
  // hold at least one region.
  absl::Status Validate() const;
};

class SsdStore;

// One block's copy on the SSD. Immutable; made only by SsdStore::Write.
// Destroying it (the last SsdRef) returns its slot to the store.
class SsdExtent {
 public:
  ~SsdExtent();
  SsdExtent(const SsdExtent&) = delete;
  SsdExtent& operator=(const SsdExtent&) = delete;

  uint64_t key() const { return key_; }            // the caller's block key, also in the header
  uint64_t size() const { return size_; }          // payload bytes
  uint64_t checksum() const { return checksum_; }  // XXH3-64 of the payload (verified on read)
  uint64_t offset() const { return offset_; }      // byte offset of the extent (header) in the file
  uint64_t footprint() const {
    return footprint_;
  }                                                // bytes of file the extent occupies (its class)
  uint64_t sequence() const { return sequence_; }  // store-wide write number, also in the header
  // The epoch of the store that wrote it (an earlier process's, for a
  // re-attached extent), also in the header.
  uint64_t epoch() const { return epoch_; }

 private:
  friend class SsdStore;
  SsdExtent(SsdStore* store, uint64_t key, uint64_t size, uint64_t checksum, uint64_t offset,
            uint64_t footprint, uint64_t sequence, uint64_t epoch)
      : store_(store),
        key_(key),
        size_(size),
        checksum_(checksum),
        offset_(offset),
        footprint_(footprint),
        sequence_(sequence),
        epoch_(epoch) {}

  SsdStore* const store_;
  const uint64_t key_;
  const uint64_t size_;
  const uint64_t checksum_;
  const uint64_t offset_;
  const uint64_t footprint_;
  const uint64_t sequence_;
  const uint64_t epoch_;
};

using SsdRef = std::shared_ptr<const SsdExtent>;

// One read of a ReadBatch. REQUIRES: out.size() == extent->size(); `extent`
// and `out` stay valid until ReadBatch returns; `status` is not null.
struct SsdReadRequest {
  const SsdExtent* extent = nullptr;
  std::span<std::byte> out;
  absl::Status* status = nullptr;
};

// One extent to re-attach (SsdStore::ReattachBatch): what the extent's
// header must say, and where it is.
struct SsdReattachRequest {
  uint64_t key = 0;
  uint64_t size = 0;      // payload bytes
  uint64_t checksum = 0;  // XXH3-64 of the payload
  uint64_t offset = 0;
  uint64_t footprint = 0;
  uint64_t sequence = 0;
  uint64_t epoch = 0;
  SsdRef extent;        // set on success
  absl::Status status;  // set by ReattachBatch
};

struct SsdStoreStats {
  uint64_t capacity_bytes = 0;  // regions * region_bytes (the usable part of the file)
  uint64_t region_bytes = 0;
  uint64_t reserved_bytes = 0;   // regions serving a class
  uint64_t allocated_bytes = 0;  // footprints of live extents (and writes in flight)
  uint64_t live_extents = 0;
  uint64_t payload_bytes = 0;         // payload bytes of live extents
  uint64_t writes = 0;                // successful writes
  uint64_t write_bytes = 0;           // their payload bytes
  uint64_t reads = 0;                 // reads answered OK
  uint64_t read_bytes = 0;            // their payload bytes
  uint64_t checksum_failures = 0;     // DATA_LOSS answers (mismatch or short read)
  uint64_t failed_writes = 0;         // RESOURCE_EXHAUSTED answers
  uint64_t io_errors = 0;             // UNAVAILABLE answers (errno from the kernel)
  uint64_t retained_bytes = 0;        // footprints of slots kept by retention (not live)
  uint64_t retained_extents = 0;      // slots kept by retention
  uint64_t retained_reused = 0;       // retained slots a Write() reused past the retention budget
  uint64_t reattached = 0;            // extents made live by ReattachBatch
  uint64_t reattach_failures = 0;     // ReattachBatch answers other than OK
  uint64_t staging_cached_bytes = 0;  // idle bounce buffers kept for reuse
  uint64_t staging_in_use_bytes = 0;  // bounce buffers of reads and writes in progress
  bool direct_io = false;             // O_DIRECT in use
  std::string engine;                 // "io_uring" or "thread_pool", plus why when it fell back
};

class SsdStore {
 public:
  // Opens (creating and preallocating if needed) the file at options.path.
  // INVALID_ARGUMENT for bad options; UNAVAILABLE (with errno text) when the
  // file cannot be opened, sized or preallocated.
  static absl::StatusOr<std::unique_ptr<SsdStore>> Open(const SsdStoreOptions& options);
  virtual ~SsdStore() = default;

  // Writes one block (header + payload) and returns its extent once the data
  // is in the page cache or on the device (no fsync). RESOURCE_EXHAUSTED when
  // no slot of the block's class is free and no region is free; nothing is
  // changed then. INVALID_ARGUMENT when payload is empty or larger than
  // region_bytes minus the header. UNAVAILABLE on an I/O error.
  // `checksum` is the caller's XXH3-64 of `payload` (not recomputed here).
  virtual absl::StatusOr<SsdRef> Write(uint64_t key, std::span<const std::byte> payload,
                                       uint64_t checksum) = 0;

  // Reads the block into `out` and verifies it (see the top of this file).
  // INVALID_ARGUMENT when out.size() != extent.size() or the extent belongs to
  // another store. On any error the contents of `out` are unspecified.
  virtual absl::Status Read(const SsdExtent& extent, std::span<std::byte> out) = 0;

  // Many Read()s at once: each request's status is set as Read() would set
  // it. With io_uring, up to queue_depth reads are in flight per submit.
  virtual void ReadBatch(std::span<const SsdReadRequest> requests) = 0;

  virtual SsdStoreStats GetStats() const = 0;

  // The footprint Write() would use for a payload of this many bytes; 0 when
  // Write() would refuse the size.
  virtual uint64_t RoundedSize(uint64_t payload_bytes) const = 0;

  // Re-attaches extents an earlier process wrote to this file. Reads the
  // first 4 KiB of each (through the engine: with io_uring up to queue_depth
  // at once) and, in request order, sets each status:
  //   OK: the header verifies and says exactly the request's key, size,
  //     checksum, footprint, sequence and epoch; the slot is live and
  //     `extent` holds it (epoch() is the request's, not this store's).
  //   DATA_LOSS: a short read, a header that does not decode (never written,
  //     torn, overwritten) or one that says something else (a later write
  //     to the slot, another block). Counted in reattach_failures, not in
  //     checksum_failures.
  //   FAILED_PRECONDITION: the slot is already live (a duplicate), or its
  //     region serves another class (a region takes the class of the first
  //     extent re-attached into it, so a slot overlapping a live one of
  //     another class is refused), or this store has written already.
  //   INVALID_ARGUMENT: not a slot of this layout: size 0 or too large, a
  //     footprint that is not RoundedSize(size), an offset past the capacity
  //     or off the class's slot grid in its region.
  //   UNAVAILABLE: the read failed (errno text).
  // The payload is not read here; every Read() verifies it as for any
  // extent. New writes after this take sequence numbers above the highest
  // one re-attached. REQUIRES: called before the first Write() (later
  // batches answer FAILED_PRECONDITION for every request).
  virtual void ReattachBatch(std::span<SsdReattachRequest> requests) = 0;

  // fdatasync of the file: every write so far is durable. UNAVAILABLE with
  // the errno text when it fails.
  virtual absl::Status Sync() = 0;

  // Retention of freed slots (see the top of this file). Off at start;
  // turning it off frees nothing already retained.
  virtual void SetRetention(bool on) = 0;
  // Retained bytes that writes leave alone: while more is retained, a Write()
  // that finds no free slot reuses the oldest retained slots. Default
  // UINT64_MAX: retained slots are never reused.
  virtual void SetRetentionBudget(uint64_t bytes) = 0;
  // A checkpoint starts: until it commits or fails, every release is
  // retained. Returns its mark (the releases so far; monotonic).
  virtual uint64_t CheckpointStarted() = 0;
  // The checkpoint that started at `mark` committed: frees the slots of
  // releases up to `mark` (it cannot list them). Extents written so far may
  // be in it; a release of one written later, while no checkpoint is being
  // taken, frees its slot at once.
  virtual void CheckpointCommitted(uint64_t mark) = 0;
  // The checkpoint being taken failed: frees the retained slots whose
  // extents no committed checkpoint can list (written after the last
  // CheckpointCommitted() by this store); those of the newest committed
  // checkpoint stay retained.
  virtual void CheckpointFailed() = 0;

 protected:
  SsdStore() = default;
  // Makes an extent that returns to this store through ReleaseExtent().
  SsdRef MakeExtent(uint64_t key, uint64_t size, uint64_t checksum, uint64_t offset,
                    uint64_t footprint, uint64_t sequence, uint64_t epoch) {
    return SsdRef(new SsdExtent(this, key, size, checksum, offset, footprint, sequence, epoch));
  }
  // True when `extent` was made by this store.
  bool Owns(const SsdExtent& extent) const { return extent.store_ == this; }

 private:
  friend class SsdExtent;
  // Called once per extent from ~SsdExtent; frees (or retains) its slot.
  virtual void ReleaseExtent(const SsdExtent& extent) = 0;
};

}  // namespace kvcache

#endif  // KVCACHE_SERVER_TIER_SSD_STORE_H_
