// Internal to kvcache_checkpoint: opening one committed checkpoint's files
// and reading one frame at a known offset. The reader and the directory share
// these; callers outside the library use CheckpointReader and
// CheckpointDirectory. Not thread-safe per object; functions are reentrant.
#ifndef KVCACHE_SERVER_CHECKPOINT_CHECKPOINT_FILES_H_
#define KVCACHE_SERVER_CHECKPOINT_CHECKPOINT_FILES_H_

#include <array>
#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "server/checkpoint/checkpoint_format.h"
#include "server/checkpoint/checkpoint_mac.h"
#include "server/checkpoint/checkpoint_types.h"
#include "server/checkpoint/file_system.h"
#include "server/checkpoint/manifest.h"

struct ZSTD_DCtx_s;

namespace kvcache::checkpoint {

struct ZstdDCtxFree {
  void operator()(ZSTD_DCtx_s* ctx) const;
};
using ZstdDCtxPtr = std::unique_ptr<ZSTD_DCtx_s, ZstdDCtxFree>;
ZstdDCtxPtr NewZstdDCtx();

// A committed checkpoint whose manifest (MAC included), data-file size and
// data header checked out. `what` names the data file for error messages;
// `frames` checks its frames' tags.
struct OpenedCheckpoint {
  Manifest manifest;
  DataHeader header;
  std::array<std::byte, kDataHeaderBytes> header_bytes{};  // as on disk
  std::unique_ptr<ReadableFile> data;
  std::unique_ptr<const FrameMac> frames;
  std::string what;
};

// Reads and checks ckpt-<sequence>.manifest (its MAC under `key`), opens the
// data file, checks its size, and its header against the manifest (sequence,
// creation time, checkpoint id). NOT_FOUND without a manifest;
// FAILED_PRECONDITION for a newer format version; DATA_LOSS with the reason
// for a corrupt, unauthenticated or older-format one; the file system's error
// for I/O failures.
absl::StatusOr<OpenedCheckpoint> OpenCheckpointFiles(FileSystem* fs, const std::string& dir,
                                                     uint64_t sequence, const CheckpointKey& key);

// Reads the record frame at `offset` of `checkpoint` into `record` and
// verifies it (bounds, header, tag, decompression). DATA_LOSS naming the
// offset when it is not a valid record frame.
absl::Status ReadFrameAt(const OpenedCheckpoint& checkpoint, uint64_t offset, ZSTD_DCtx_s* zstd,
                         std::vector<std::byte>* scratch, Record* record);

// Fills record->bytes from a frame's stored bytes (copy or zstd) and checks the
// length. DATA_LOSS naming `what` and `offset`.
absl::Status DecodeStored(const FrameHeader& header, std::span<const std::byte> stored,
                          ZSTD_DCtx_s* zstd, absl::string_view what, uint64_t offset,
                          std::vector<std::byte>* out);

}  // namespace kvcache::checkpoint

#endif  // KVCACHE_SERVER_CHECKPOINT_CHECKPOINT_FILES_H_
