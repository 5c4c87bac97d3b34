// CheckpointReader: reads one committed checkpoint back
// (docs/checkpoint-format.md).
//
// Open() checks the manifest (its MAC and format version), that the data
// file has the size the manifest says, and the data header. Next() then walks
// the records in order with large buffered reads, verifying each frame's
// MAC tag and decompressing; at the end it checks the end record's count and
// the XXH3-64 of the whole data file against the manifest. ReadRecordAt()
// reads one record by location, in this checkpoint or in one it references
// (incremental checkpoints), keeping the referenced data files open.
//
// Errors: FAILED_PRECONDITION "checkpoint format version N, this kvcached
// reads up to M" for a newer format (never misread); DATA_LOSS for an older,
// unauthenticated format or a MAC written under another key; DATA_LOSS naming
// the file and the offset for any MAC or checksum mismatch, truncation, missing end record or
// malformed field; NOT_FOUND when the checkpoint has no manifest; the file
// system's status for I/O errors. After an error Next() keeps returning it.
//
// Not thread-safe: one thread uses a reader. The FileSystem must outlive it.
#ifndef KVCACHE_SERVER_CHECKPOINT_CHECKPOINT_READER_H_
#define KVCACHE_SERVER_CHECKPOINT_CHECKPOINT_READER_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "server/checkpoint/checkpoint_files.h"
#include "server/checkpoint/checkpoint_types.h"
#include "server/checkpoint/file_system.h"

namespace kvcache::checkpoint {

struct ReaderOptions {
  size_t read_chunk_bytes = size_t{4} << 20;  // one sequential read; grows for larger frames
  // The key the checkpoint's MACs were made under; the daemon's is
  // DaemonSecret::Derive("checkpoint-mac"). A checkpoint written under
  // another key is DATA_LOSS.
  CheckpointKey mac_key{};
};

class CheckpointReader {
 public:
  static absl::StatusOr<std::unique_ptr<CheckpointReader>> Open(FileSystem* fs, std::string dir,
                                                                uint64_t sequence,
                                                                ReaderOptions options = {});
  CheckpointReader(const CheckpointReader&) = delete;
  CheckpointReader& operator=(const CheckpointReader&) = delete;

  // The manifest's facts (state kComplete).
  const CheckpointInfo& info() const { return info_; }

  // Reads the next record into `record` (its bytes buffer is reused) and
  // returns true; returns false once every record was read and the end record
  // and the data-file checksum checked out.
  absl::StatusOr<bool> Next(Record* record);

  // Reads the record whose frame is at `location`: location.sequence is this
  // checkpoint's or one listed in its references (INVALID_ARGUMENT otherwise,
  // or when the offset holds the end record). Independent of Next()'s position.
  absl::Status ReadRecordAt(const RecordLocation& location, Record* record);

 private:
  CheckpointReader(FileSystem* fs, std::string dir, OpenedCheckpoint opened, ReaderOptions options);
  // Makes buffer_[pos_, pos_ + n) hold the next n file bytes, or fewer at EOF;
  // returns how many it holds.
  absl::StatusOr<size_t> Fill(size_t n);
  absl::StatusOr<bool> ReadNext(Record* record);
  absl::Status CheckEnd(const FrameHeader& header, std::span<const std::byte> stored,
                        uint64_t offset);

  FileSystem* const fs_;
  const std::string dir_;
  OpenedCheckpoint self_;
  const ReaderOptions options_;
  CheckpointInfo info_;
  ZstdDCtxPtr zstd_;
  // Sequential state: buffer_[pos_, end) are file bytes from offset_.
  std::vector<std::byte> buffer_;
  size_t pos_ = 0;
  uint64_t offset_ = 0;     // file offset of buffer_[pos_]
  uint64_t file_read_ = 0;  // file bytes already loaded into buffer_
  uint32_t next_index_ = 0;
  XxhStatePtr file_hash_;  // XXH3-64 of the whole data file so far
  bool done_ = false;
  absl::Status error_;
  // ReadRecordAt: the referenced checkpoints opened so far.
  absl::flat_hash_map<uint64_t, std::unique_ptr<OpenedCheckpoint>> referenced_;
  std::vector<std::byte> scratch_;
};

}  // namespace kvcache::checkpoint

#endif  // KVCACHE_SERVER_CHECKPOINT_CHECKPOINT_READER_H_
