// RemoteStore: blocks of KV in a Redis Cluster shared by many daemons, one
// key per block (RemoteKeyChain), its value sealed (ValueSealer) and holding
// the block's checksum and bytes together, so that Redis's own eviction
// removes a block whole or not at all.
//
//   value plaintext = "KVRB" | version (1 byte, 1) | 3 zero bytes |
//                     checksum (XXH3-64 of the bytes, 8, little-endian) |
//                     bytes
//
// Writes are queued and written by a thread of the store's own, batched and
// pipelined per master; nothing that queues one waits for Redis. The queue
// holds at most write_queue_blocks blocks: past it a write is dropped and
// counted (the block simply is not shared). Reads are pipelined too, and
// bounded by the node timeouts. Whatever goes wrong on the way (a node down,
// a slot moving, a value absent, evicted, changed or sealed with another
// secret, a checksum that does not match) is a miss, counted by cause,
// never an error and never wrong bytes.
//
// A circuit breaker: after breaker_failures batches in a row that reached no
// node, the store stops trying for breaker_cooldown (writes are dropped,
// reads miss at once), then lets the next batch try again. And a batch that
// meets failure after failure stops at its deadline (batch_deadline).
//
// Thread-safe: any thread may Put and Get (reads share one connection set
// under a lock; the writer thread has its own). Neither is opened before it
// is needed, so a daemon starts whether or not the cluster is up.
#ifndef KVCACHE_SERVER_REMOTE_REMOTE_STORE_H_
#define KVCACHE_SERVER_REMOTE_REMOTE_STORE_H_

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "server/common/mutex.h"
#include "server/remote/cluster_client.h"
#include "server/remote/value_seal.h"

namespace kvcache {

struct RemoteStoreOptions {
  ClusterClientOptions cluster;
  uint32_t write_queue_blocks = 1024;  // >= 1
  uint32_t write_batch_blocks = 32;    // values per pipelined batch, >= 1
  uint32_t breaker_failures = 3;       // >= 1
  absl::Duration breaker_cooldown = absl::Seconds(1);
  // How long one batch (a Get, or a batch of writes) may take in all, its
  // redirects, reconnections and slot-map reads included: past it, no new
  // step starts and what is left misses (ClusterClient::Run). Positive.
  absl::Duration batch_deadline = absl::Seconds(1);
};

// One block read back: its bytes, verified against the checksum stored
// with them.
struct RemoteBlock {
  uint64_t checksum = 0;
  std::vector<std::byte> bytes;
};

class RemoteStore {
 public:
  struct Stats {
    uint64_t writes_queued = 0;
    uint64_t writes_done = 0;          // acknowledged by Redis
    uint64_t writes_dropped_full = 0;  // the queue was full (or the store stopped)
    uint64_t writes_dropped_open = 0;  // the breaker was open
    uint64_t writes_failed = 0;        // Redis refused or could not be reached
    uint64_t written_bytes = 0;        // sealed values
    uint64_t reads = 0;                // blocks asked for
    uint64_t hits = 0;
    uint64_t misses_absent = 0;       // no such key
    uint64_t misses_unreadable = 0;   // did not open, or not a block value
    uint64_t misses_checksum = 0;     // opened, but its bytes do not match its checksum
    uint64_t misses_unavailable = 0;  // the node could not be reached, or the breaker was open
    uint64_t read_bytes = 0;          // of hits
    uint64_t breaker_opens = 0;
    uint64_t write_queue = 0;   // blocks queued now
    bool breaker_open = false;  // now
  };

  // Starts the writer. The store connects when it is first used (once for
  // reads, once for the writer: ClusterClient::Connect), and again after a
  // failed attempt at each later use the breaker lets through: a cluster
  // that cannot be reached yet costs misses and dropped writes until it can.
  // INVALID_ARGUMENT for options out of range or no seed.
  static absl::StatusOr<std::unique_ptr<RemoteStore>> Start(const RemoteStoreOptions& options,
                                                            const DaemonSecret& shared);
  // Connects for reads now, unless connected; why not when the cluster
  // cannot be reached (for a start-up log line; the store works on).
  absl::Status Connect();
  ~RemoteStore();  // the writer stops; blocks still queued are dropped (counted)
  RemoteStore(const RemoteStore&) = delete;
  RemoteStore& operator=(const RemoteStore&) = delete;

  // Queues the write of block `key` of namespace `ns`. False (counted) when
  // it was dropped: the queue is full or the breaker open.
  bool Put(std::string ns, std::string key, uint64_t checksum, std::vector<std::byte> bytes);

  // Waits until every write queued before the call is done or dropped
  // (tests, shutdown).
  void Flush();

  // Reads blocks `keys` of namespace `ns`: result i is block i, or nullopt
  // for a miss.
  std::vector<std::optional<RemoteBlock>> Get(std::string_view ns,
                                              std::span<const std::string> keys);

  // The same read in two steps, for a caller that takes the blocks one at a
  // time and need not hold them all opened at once: ReadSealed reads the
  // batch (pipelined, as Get) and leaves each value sealed; Open opens one.
  class SealedBlocks {
   public:
    size_t size() const { return replies_.size(); }
    // Whether value i came back with the size a block of `block_bytes`
    // seals to (whether it opens is Open's to say).
    bool Holds(size_t i, uint64_t block_bytes) const;

   private:
    friend class RemoteStore;
    std::string ns_;
    std::vector<std::string> keys_;
    std::vector<absl::StatusOr<RespValue>> replies_;
  };
  // Counts the reads, and the misses known without opening (absent,
  // unavailable).
  SealedBlocks ReadSealed(std::string_view ns, std::span<const std::string> keys);
  // Opens value i of `blocks` into `*bytes` (resized to the block, its
  // capacity reused) and checks it: the block's checksum, or nullopt for a
  // miss. Counts the hit or the miss unless `count` is false (a block opened
  // again).
  std::optional<uint64_t> Open(const SealedBlocks& blocks, size_t i, std::vector<std::byte>* bytes,
                               bool count = true);
  // The checksum value i of `blocks` claims, before it is opened (NOT
  // authenticated: ValueSealer::Peek; Open confirms it or misses), or
  // nullopt when it is not a block value of this store. Counts nothing.
  std::optional<uint64_t> PeekChecksum(const SealedBlocks& blocks, size_t i) const;

  Stats stats() const;

 private:
  struct Write {
    std::string ns;
    std::string key;
    uint64_t checksum = 0;
    std::vector<std::byte> bytes;
  };
  RemoteStore(const RemoteStoreOptions& options, const DaemonSecret& shared);
  absl::Status ConnectReaderLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(read_mu_);

  void WriteLoop();
  // Whether a batch may try Redis now (the breaker closed, or its cool-down
  // over).
  bool MayTry() const;
  // A batch's outcome, for the breaker: whether any command reached a node.
  void Reached(bool any);
  // The value of `w`, sealed.
  std::string ValueOf(const Write& w) const;
  // What one read found; on a hit, `*bytes` and `*checksum` are the block's.
  enum class ReadOutcome : uint8_t { kHit, kAbsent, kUnreadable, kChecksum, kUnavailable };
  ReadOutcome OpenValue(const SealedBlocks& blocks, size_t i, std::vector<std::byte>* bytes,
                        uint64_t* checksum) const;
  void Count(ReadOutcome outcome, uint64_t bytes);

  const RemoteStoreOptions options_;
  const ValueSealer sealer_;

  Mutex read_mu_;
  std::unique_ptr<ClusterClient> reader_ ABSL_GUARDED_BY(read_mu_);  // null until connected
  std::unique_ptr<ClusterClient> writer_;  // the writer thread's alone; null until connected

  mutable Mutex mu_;
  std::condition_variable_any changed_;  // queue_ or in_flight_ changed, or stopping_
  std::deque<Write> queue_ ABSL_GUARDED_BY(mu_);
  size_t in_flight_ ABSL_GUARDED_BY(mu_) = 0;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  Stats stats_ ABSL_GUARDED_BY(mu_);
  uint32_t failures_in_a_row_ ABSL_GUARDED_BY(mu_) = 0;
  absl::Time open_until_ ABSL_GUARDED_BY(mu_) = absl::InfinitePast();
  std::thread writer_thread_;
};

}  // namespace kvcache

#endif  // KVCACHE_SERVER_REMOTE_REMOTE_STORE_H_
