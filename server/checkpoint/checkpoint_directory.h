// CheckpointDirectory: the checkpoints in one directory, for restart and
// retention (docs/checkpoint-format.md).
//
// List() classifies every sequence that has a file in the directory:
// complete (manifest, data size and header check out, and every checkpoint it
// references is complete), incomplete (a writer stopped before committing the
// manifest), corrupt (with the reason) or unsupported (a newer format
// version). It reads manifests and data headers only; Verify() reads every
// record and checks the data file's checksum. So damage inside the frames
// of a checkpoint that lists as complete shows when it is read: a restart
// that meets DATA_LOSS reading the newest complete checkpoint falls back to
// the next older complete one. Prune() deletes old and broken
// checkpoints but never one that a kept checkpoint references.
//
// Holds no state besides the path: methods may be called from any thread, but
// Prune() REQUIRES that no CheckpointWriter is active in the directory (call
// it after a new checkpoint committed) and that no reader reads a checkpoint
// it may delete. The FileSystem must outlive it.
#ifndef KVCACHE_SERVER_CHECKPOINT_CHECKPOINT_DIRECTORY_H_
#define KVCACHE_SERVER_CHECKPOINT_CHECKPOINT_DIRECTORY_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "server/checkpoint/checkpoint_mac.h"
#include "server/checkpoint/checkpoint_types.h"
#include "server/checkpoint/file_system.h"

namespace kvcache::checkpoint {

struct VerifyReport {
  uint64_t sequence = 0;
  absl::Status status;  // OK, or the first problem found (DATA_LOSS naming the offset)
  uint64_t records_read = 0;
  uint64_t record_bytes = 0;  // decompressed bytes of the records read
  uint64_t data_bytes = 0;    // size of the data file
};

struct PruneReport {
  std::vector<uint64_t> kept;     // complete checkpoints left in place, ascending
  std::vector<uint64_t> deleted;  // sequences whose files were deleted, ascending
};

class CheckpointDirectory {
 public:
  // `mac_key`: what the checkpoints' MACs are checked under
  // (ReaderOptions::mac_key); a checkpoint written under another key lists as
  // corrupt, and Prune() deletes it.
  CheckpointDirectory(FileSystem* fs, std::string dir, const CheckpointKey& mac_key)
      : fs_(fs), dir_(std::move(dir)), mac_key_(mac_key) {}

  // Every checkpoint with a file in the directory, ascending by sequence.
  // An empty list when the directory does not exist.
  absl::StatusOr<std::vector<CheckpointInfo>> List() const;

  // The complete checkpoint of the highest sequence; NOT_FOUND when none.
  absl::StatusOr<CheckpointInfo> NewestComplete() const;

  // One more than the highest sequence any checkpoint file names (1 when
  // there are none), so a new writer never reuses a sequence.
  absl::StatusOr<uint64_t> NextSequence() const;

  // Reads every record of checkpoint `sequence` and checks its frames, end
  // record and data-file checksum, and that the checkpoints it references
  // open. Problems go to the report's status; the StatusOr fails only when the
  // directory cannot be listed.
  absl::StatusOr<VerifyReport> Verify(uint64_t sequence) const;

  // Keeps the newest `keep` complete checkpoints and, transitively, the
  // checkpoints they reference; deletes the files of every other checkpoint
  // (older complete ones, corrupt ones, incomplete leftovers) except
  // unsupported (newer-format) ones. INVALID_ARGUMENT when keep is 0. The
  // first delete error stops it and is returned.
  absl::StatusOr<PruneReport> Prune(uint32_t keep) const;

  const std::string& dir() const { return dir_; }

 private:
  absl::Status DeleteCheckpoint(uint64_t sequence) const;

  FileSystem* const fs_;
  const std::string dir_;
  const CheckpointKey mac_key_;
};

}  // namespace kvcache::checkpoint

#endif  // KVCACHE_SERVER_CHECKPOINT_CHECKPOINT_DIRECTORY_H_
