// Restorer: puts the newest complete checkpoint back into a Cache at
// start-up (docs/checkpoints.md).
//
// Every file it reads is authenticated under `mac_key` (docs/checkpoint-format.md,
// "Authentication"): a checkpoint written under another key, planted or
// edited counts as corrupt, as does one whose manifest summary has keys of the
// wrong JSON types (checked before use, never thrown).
//
// Two steps. Prepare() runs before the daemon serves: it opens the newest
// checkpoint that opens (a corrupt or unreadable one is logged and the one
// before it is tried; a format version this kvcached cannot read is refused,
// never misread) and re-attaches every lower-tier copy the checkpoint lists,
// in batches, before anything else can write to that tier. Run() then
// replays the records while the daemon already serves (a block not restored
// yet is a miss, never wrong KV): models first registered, then blocks,
// parents before children, each host payload verified against its checksum
// before it is inserted. A block the cache already holds (a worker appended
// it meanwhile) is kept as it is; a block whose parent is gone, whose copy
// is lost or fails its checksum is skipped, and so is what hangs below it.
// When the host tier is full, the restore demotes to the lower tier as an
// append would (Cache::AllocateRestoredPayload); a block that still finds no
// room is restored with its lower copy only, or skipped when it has none. A record that fails
// mid-way (truncation, a MAC or checksum) stops that checkpoint; the restore then continues from
// the previous complete one (what was restored stays; lower copies it lists that were not
// re-attached are lost, since the tier is serving by then).
//
// Thread-safe: progress() may be called from any thread while Run() runs.
#ifndef KVCACHE_SERVER_CHECKPOINT_RESTORER_H_
#define KVCACHE_SERVER_CHECKPOINT_RESTORER_H_

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/time/time.h"
#include "server/checkpoint/checkpoint_mac.h"
#include "server/checkpoint/file_system.h"
#include "server/checkpoint/records.h"
#include "server/common/mutex.h"
#include "server/core/cache.h"
#include "server/core/checkpoint_source.h"

namespace kvcache::checkpoint {

class CheckpointReader;

enum class RestoreState : uint8_t { kOff, kReattaching, kRestoring, kDone, kFailed, kStopped };
std::string_view RestoreStateName(RestoreState state);

struct RestoreProgress {
  RestoreState state = RestoreState::kOff;
  uint64_t sequence = 0;  // the checkpoint being (or last) restored
  uint64_t records_done = 0;
  uint64_t records_total = 0;
  uint64_t restored_blocks = 0;
  uint64_t restored_bytes = 0;      // host payload bytes
  uint64_t reattached_copies = 0;   // lower-tier copies re-attached
  uint64_t reattach_failures = 0;   // lower-tier copies that did not verify
  uint64_t present_blocks = 0;      // cached already
  uint64_t orphan_blocks = 0;       // parent not restored
  uint64_t lost_blocks = 0;         // no copy left (lower copy lost, no room, corrupt)
  uint64_t corrupt_payloads = 0;    // failed their checksum
  uint64_t skipped_blocks = 0;      // unknown model, mismatch
  uint64_t failed_checkpoints = 0;  // checkpoints that could not be (fully) read
  std::string error;                // the last such failure
  absl::Duration duration;
};

class Restorer {
 public:
  // REQUIRES: cache and fs outlive the restorer. `mac_key`: what the
  // checkpoints' MACs are checked under; one written under another key is
  // refused (DATA_LOSS) and the one before it tried.
  Restorer(Cache* cache, FileSystem* fs, std::string dir, const CheckpointKey& mac_key);
  ~Restorer();

  // Opens the checkpoint to restore and re-attaches its lower-tier copies.
  // OK when there is nothing to restore (state kOff). An error only for a
  // checkpoint this kvcached must not read (a newer format version):
  // FAILED_PRECONDITION with the message; the daemon refuses to start then
  // rather than start empty and overwrite it.
  absl::Status Prepare();
  // Replays the checkpoint (see above). Returns when done, or soon after
  // `stop` is set (state kStopped).
  void Run(const std::atomic<bool>& stop);

  RestoreProgress progress() const;
  // Where the host payloads restored are in the checkpoint files (for
  // Checkpointer::SeedPayloads); empty after the first call. REQUIRES: Run()
  // returned.
  PayloadMap TakePayloads() { return std::move(payloads_); }
  // Whether Run() finished (done, failed, or nothing to restore): from then
  // on checkpoints may be taken without losing what was not restored.
  bool finished() const;

 private:
  struct Pending;
  // Opens checkpoint `sequence` and checks the types of its manifest
  // summary's keys (DATA_LOSS when one is wrong).
  absl::StatusOr<std::unique_ptr<CheckpointReader>> OpenReader(uint64_t sequence) const;
  // Restores from `reader` until its end, an error (returned) or `stop`.
  absl::Status Replay(CheckpointReader& reader, const std::atomic<bool>& stop);
  void Count(RestoreOutcome outcome, uint64_t bytes);
  absl::Status ReattachLower(CheckpointReader& reader);

  Cache* const cache_;
  CheckpointSource target_;  // what the restore puts blocks back through
  FileSystem* const fs_;
  const std::string dir_;
  const CheckpointKey mac_key_;
  std::unique_ptr<CheckpointReader> reader_;
  std::vector<uint64_t> fallbacks_;  // older complete checkpoints, newest first
  // Re-attached lower copies by model and lookup hash.
  absl::flat_hash_map<ModelKey, absl::flat_hash_map<uint64_t, StoredRef>> lower_;
  PayloadMap payloads_;  // of the restored blocks
  absl::Time started_;
  mutable Mutex mu_;
  RestoreProgress progress_ ABSL_GUARDED_BY(mu_);
};

}  // namespace kvcache::checkpoint

#endif  // KVCACHE_SERVER_CHECKPOINT_RESTORER_H_
