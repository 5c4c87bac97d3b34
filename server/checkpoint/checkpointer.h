// Checkpointer: writes one checkpoint of a live Cache (docs/checkpoints.md,
// docs/checkpoint-format.md).
//
// Run() captures every model's block list in one short pass, then takes the
// blocks in batches of `batch_blocks` (each batch under the cache's lock
// briefly, holding references to its copies while it is written), so serving
// goes on throughout. A block evicted between the two is left out, and so are
// the blocks below it when the restore finds no parent. The data file holds,
// per model, a model record and, parents first, a block record per block
// followed by its host payload (zstd-compressed when that saves bytes) or,
// in an incremental checkpoint, a reference to the payload record of an
// earlier checkpoint that holds the same bytes. Compression is probed on the
// first payloads and dropped for the rest when it saves too little. Lower-tier (SSD) copies are
// not copied: their locations go into lower-index records at the end, which
// the manifest lists, so a restart re-attaches them before anything else.
// Before the manifest is committed the lower tier is synced; its freed space
// is retained from one checkpoint to the next, within the lower tier's
// retention budget, so that the copies the newest checkpoint refers to are
// not overwritten (Tier::SetRetention). A failed run tells the lower
// tier (Tier::CheckpointFailed), which frees what it retained for it.
//
// Every `full_every`-th checkpoint (and the first) writes every payload; the
// others write only payloads not in the previous checkpoint's map and refer
// to the rest. After a commit, checkpoints beyond `keep` are pruned (never
// one a kept checkpoint refers to).
//
// Thread-safe: Run() calls are serialised (a second caller waits).
#ifndef KVCACHE_SERVER_CHECKPOINT_CHECKPOINTER_H_
#define KVCACHE_SERVER_CHECKPOINT_CHECKPOINTER_H_

#include <atomic>
#include <cstdint>
#include <string>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "server/checkpoint/checkpoint_mac.h"
#include "server/checkpoint/file_system.h"
#include "server/checkpoint/records.h"
#include "server/common/mutex.h"
#include "server/core/cache.h"

namespace kvcache::checkpoint {

struct CheckpointerOptions {
  std::string dir;
  uint32_t keep = 3;        // complete checkpoints kept
  uint32_t full_every = 8;  // 1: every checkpoint is full
  int zstd_level = 1;       // 0: payloads stored raw
  // Payloads are compressed while the first compression_probe_bytes of a
  // checkpoint's payloads show it saves at least min_compression_saving of
  // their bytes; past that, the rest of the checkpoint is stored raw (KV in
  // fp16 saves about 8% at zstd level 1, at a cost above the disk's speed).
  uint64_t compression_probe_bytes = uint64_t{64} << 20;
  double min_compression_saving = 0.10;
  size_t batch_blocks = 64;
  // Bytes of payload records (as stored: compressed when they are) a
  // checkpoint writes per second at most; it sleeps between batches (holding
  // no block) to keep to it, so that it leaves the disk and memory bandwidth to serving. The
  // first second's worth goes at once. 0: as fast as it can.
  uint64_t max_write_bytes_per_second = 0;
  // What the checkpoints' MACs are made and checked under
  // (docs/checkpoint-format.md): the daemon passes
  // DaemonSecret::Derive("checkpoint-mac"); all-zero only in tests.
  CheckpointKey mac_key{};
};

// What one Run() wrote.
struct CheckpointRun {
  uint64_t sequence = 0;
  bool full = false;
  absl::Duration duration;
  uint64_t data_bytes = 0;
  uint64_t records = 0;
  uint64_t models = 0;
  uint64_t blocks = 0;               // block records
  uint64_t host_payloads = 0;        // payloads written
  uint64_t referenced_payloads = 0;  // payloads referred to in earlier checkpoints
  uint64_t payload_bytes = 0;        // payload bytes written (before compression)
  uint64_t lower_copies = 0;         // lower-tier copies recorded for re-attachment
  uint64_t gone_blocks = 0;  // evicted between capture and write, or only in a volatile lower tier
  bool compression_stopped = false;  // the probe found compression not worth it
  std::vector<uint64_t> references;
};

// Whether a run keeps to max_write_bytes_per_second: a checkpoint taken while
// the daemon serves does; the final one at shutdown, with nothing left to
// serve, runs at full speed.
enum class Pacing : uint8_t { kLimited, kFullSpeed };

class Checkpointer {
 public:
  // REQUIRES: cache and fs outlive the checkpointer. `next_sequence` is the
  // first sequence to write (one past the newest on disk).
  Checkpointer(Cache* cache, FileSystem* fs, CheckpointerOptions options, uint64_t next_sequence);

  // Writes and commits one checkpoint, then prunes. On error nothing of it
  // stays on disk (the writer is aborted) and the previous checkpoints are
  // as they were; the next run is full.
  absl::StatusOr<CheckpointRun> Run(Pacing pacing = Pacing::kLimited) ABSL_LOCKS_EXCLUDED(mu_);

  // The payloads a restore put back and where they are (Restorer): the next
  // checkpoint refers to those unchanged instead of writing the whole cache
  // again after a restart.
  void SeedPayloads(PayloadMap payloads) ABSL_LOCKS_EXCLUDED(mu_);

  // Host memory the writer of the run in progress holds (its buffers and
  // compression context, updated per batch of blocks); 0 between runs.
  uint64_t writer_bytes() const { return writer_bytes_.load(std::memory_order_relaxed); }

 private:
  absl::StatusOr<CheckpointRun> RunLocked(Pacing pacing) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  Cache* const cache_;
  FileSystem* const fs_;
  const CheckpointerOptions options_;
  Mutex mu_;
  uint64_t next_sequence_ ABSL_GUARDED_BY(mu_);
  uint64_t runs_since_full_ ABSL_GUARDED_BY(mu_) = 0;
  bool have_previous_ ABSL_GUARDED_BY(mu_) = false;  // payloads_ describes the last commit
  PayloadMap payloads_ ABSL_GUARDED_BY(mu_);         // payloads by lookup hash, last commit
  uint64_t retention_mark_ ABSL_GUARDED_BY(mu_) = 0;
  std::atomic<uint64_t> writer_bytes_{0};
};

}  // namespace kvcache::checkpoint

#endif  // KVCACHE_SERVER_CHECKPOINT_CHECKPOINTER_H_
