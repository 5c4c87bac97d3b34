// CheckpointWriter: writes one checkpoint (docs/checkpoint-format.md) into a
// directory: records appended to ckpt-<seq>.data through a buffer, then
// Commit() seals the data file and commits the manifest last (write a .tmp,
// fdatasync, rename, fsync the directory). Until Commit() returns OK the
// checkpoint does not exist for readers; a writer that fails, is aborted or is
// destroyed uncommitted deletes what it wrote (best effort: a crash leaves an
// incomplete leftover that CheckpointDirectory::Prune() removes).
//
// Cost: Append() compresses (when asked, on the calling thread), MACs
// (HMAC-SHA256, docs/checkpoint-format.md) and copies into the buffer; it does file I/O only when
// the buffer fills (one write of buffer_bytes) and takes no lock, so a cache may call it while
// serving, as long as it does not hold its own locks across the call.
//
// Errors are sticky: after an I/O error every later Append() and Commit()
// returns it, and Commit() deletes the files. Errors carry the file system's
// status (RESOURCE_EXHAUSTED for a full disk, UNAVAILABLE for I/O errors).
//
// Not thread-safe: one thread uses a writer. The FileSystem must outlive it.
#ifndef KVCACHE_SERVER_CHECKPOINT_CHECKPOINT_WRITER_H_
#define KVCACHE_SERVER_CHECKPOINT_CHECKPOINT_WRITER_H_

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "nlohmann/json.hpp"
#include "server/checkpoint/checkpoint_format.h"
#include "server/checkpoint/checkpoint_mac.h"
#include "server/checkpoint/checkpoint_types.h"
#include "server/checkpoint/file_system.h"

struct ZSTD_CCtx_s;

namespace kvcache::checkpoint {

struct WriterOptions {
  // zstd level for records appended with compress = true: 1 (fast, default)
  // .. 19, or negative fast levels down to -7; 0 stores every record raw.
  int zstd_level = 1;
  // Bytes gathered before one write to the data file: 4 KiB .. 256 MiB.
  size_t buffer_bytes = size_t{1} << 20;
  // Unix time in ms for created_unix_ms and write_duration_ms; null = the
  // system clock. Tests inject one.
  std::function<int64_t()> now_unix_ms;
  // The key the checkpoint's MACs are made under (manifest and every frame);
  // the daemon's is DaemonSecret::Derive("checkpoint-mac"). Only a reader
  // with the same key restores the checkpoint.
  CheckpointKey mac_key{};

  // INVALID_ARGUMENT naming the field when out of range.
  absl::Status Validate() const;
};

class CheckpointWriter {
 public:
  // Creates `dir` if missing and starts checkpoint `sequence` there.
  // ALREADY_EXISTS when that checkpoint's manifest exists (a leftover data file
  // of the same sequence is overwritten). Use CheckpointDirectory::NextSequence().
  static absl::StatusOr<std::unique_ptr<CheckpointWriter>> Create(FileSystem* fs, std::string dir,
                                                                  uint64_t sequence,
                                                                  WriterOptions options = {});
  ~CheckpointWriter();  // Abort() unless committed
  CheckpointWriter(const CheckpointWriter&) = delete;
  CheckpointWriter& operator=(const CheckpointWriter&) = delete;

  // Appends one record of the caller's `type`. With `compress` (and a
  // zstd_level other than 0) it is stored zstd-compressed when that is
  // smaller, raw otherwise. Returns the frame's location (for references from
  // later checkpoints). INVALID_ARGUMENT when bytes is over 1 GiB (the writer
  // stays usable); FAILED_PRECONDITION after Commit() or Abort().
  absl::StatusOr<RecordLocation> Append(uint8_t type, std::span<const std::byte> bytes,
                                        bool compress);

  // Seals and commits the checkpoint. `summary` must be a JSON object (it goes
  // to the manifest as is). `references`: sequences of other checkpoints whose
  // records this one's point into (any order, duplicates ignored); each must
  // have a manifest in the directory (FAILED_PRECONDITION otherwise) and not be
  // this checkpoint (INVALID_ARGUMENT). On any error the checkpoint's files
  // are deleted and the error returned; the writer is then finished either way.
  absl::StatusOr<CheckpointInfo> Commit(const nlohmann::json& summary,
                                        std::vector<uint64_t> references);

  // Deletes what was written (idempotent; no-op after a successful Commit).
  void Abort();

  uint64_t sequence() const { return sequence_; }
  uint64_t record_count() const { return record_count_; }
  // Bytes of the data file so far (header and frames, buffered ones included).
  uint64_t data_bytes() const { return offset_; }
  // Host memory the writer holds: its write buffer, its compression scratch
  // and the zstd context (docs/operations.md, "Memory").
  uint64_t MemoryBytes() const;

 private:
  struct ZstdFree {
    void operator()(ZSTD_CCtx_s* ctx) const;
  };

  CheckpointWriter(FileSystem* fs, std::string dir, uint64_t sequence, WriterOptions options);
  int64_t Now() const;
  // Appends `bytes` to the data file (buffer, or straight through when large).
  absl::Status Emit(std::span<const std::byte> bytes);
  absl::Status Flush();
  absl::Status WriteFrame(uint8_t type, uint8_t flags, uint32_t uncompressed,
                          std::span<const std::byte> stored);
  absl::Status SealDataFile();
  absl::Status WriteManifest(const nlohmann::json& summary, const std::vector<uint64_t>& refs,
                             CheckpointInfo* info);
  absl::Status Fail(absl::Status status);

  FileSystem* const fs_;
  const std::string dir_;
  const uint64_t sequence_;
  const WriterOptions options_;
  const std::string data_path_;
  int64_t created_unix_ms_ = 0;
  const CheckpointId id_;
  const FrameMac frame_mac_;
  std::unique_ptr<WritableFile> file_;
  std::vector<std::byte> buffer_;
  std::vector<std::byte> scratch_;  // compressed bytes
  std::unique_ptr<ZSTD_CCtx_s, ZstdFree> zstd_;
  XxhStatePtr file_hash_;  // XXH3-64 of the whole data file so far
  uint64_t offset_ = 0;
  uint32_t record_count_ = 0;
  absl::Status error_;  // sticky
  bool finished_ = false;
  bool manifest_renamed_ = false;
};

}  // namespace kvcache::checkpoint

#endif  // KVCACHE_SERVER_CHECKPOINT_CHECKPOINT_WRITER_H_
