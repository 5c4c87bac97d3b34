// FaultInjectingFileSystem: a FileSystem that forwards to another one and
// fails the operations a test names, so that tests (and the benchmark) can
// check what a writer or reader does when the disk misbehaves.
//
// A Fault names an operation, a path substring and which matching call fails
// (the nth, counted from when the fault was added); it fires once. Faults:
//   kShortWrite  the Append writes the first half of its bytes, then fails
//                (UNAVAILABLE, as a write that stopped part way);
//   kNoSpace     the Append writes nothing and fails with ENOSPC
//                (RESOURCE_EXHAUSTED);
//   kIoError     the Append writes nothing and fails with EIO (UNAVAILABLE);
//   kSyncFails   WritableFile::Sync fails with EIO and syncs nothing;
//   kRenameFails Rename (matched on its source path) fails with EIO.
// CorruptByte() and Truncate() change a file already on disk (through the
// wrapped file system: read it all, write it back), for corruption tests.
//
// Thread-safe. The wrapped file system must outlive this one and every file
// it opened.
#ifndef KVCACHE_SERVER_CHECKPOINT_FAULT_INJECTING_FILE_SYSTEM_H_
#define KVCACHE_SERVER_CHECKPOINT_FAULT_INJECTING_FILE_SYSTEM_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "server/checkpoint/file_system.h"

namespace kvcache::checkpoint {

enum class FaultKind : uint8_t { kShortWrite, kNoSpace, kIoError, kSyncFails, kRenameFails };

struct Fault {
  FaultKind kind = FaultKind::kIoError;
  std::string path_contains;  // matches every path that contains it ("" matches all)
  uint32_t nth = 1;           // the nth matching call fails (1 = the next one)
};

class FaultInjectingFileSystem final : public FileSystem {
 public:
  explicit FaultInjectingFileSystem(FileSystem* base) : base_(base) {}

  void AddFault(Fault fault);
  void ClearFaults();
  // How many faults have fired so far.
  uint32_t fired() const;

  // XORs the byte at `offset` of `path` with `mask` (nonzero).
  // OUT_OF_RANGE when the file is not that long.
  absl::Status CorruptByte(const std::string& path, uint64_t offset, uint8_t mask = 0xff);
  // Cuts `path` to its first `size` bytes (REQUIRES: size <= its size).
  absl::Status Truncate(const std::string& path, uint64_t size);

  // Whether an operation of `kind` on `path` fails now (counts the call).
  // Used by the files this file system opens.
  bool ShouldFail(FaultKind kind, const std::string& path);

  absl::StatusOr<std::unique_ptr<WritableFile>> NewWritableFile(const std::string& path) override;
  absl::StatusOr<std::unique_ptr<ReadableFile>> NewReadableFile(const std::string& path) override {
    return base_->NewReadableFile(path);
  }
  absl::Status Rename(const std::string& from, const std::string& to) override;
  absl::Status Delete(const std::string& path) override { return base_->Delete(path); }
  absl::Status CreateDir(const std::string& path) override { return base_->CreateDir(path); }
  absl::StatusOr<std::vector<std::string>> ListDir(const std::string& path) override {
    return base_->ListDir(path);
  }
  absl::Status SyncDir(const std::string& path) override { return base_->SyncDir(path); }
  bool Exists(const std::string& path) override { return base_->Exists(path); }

 private:
  struct Armed {
    Fault fault;
    uint32_t seen = 0;
  };

  absl::StatusOr<std::vector<std::byte>> ReadAll(const std::string& path);
  absl::Status WriteAll(const std::string& path, std::span<const std::byte> bytes);

  FileSystem* const base_;
  mutable absl::Mutex mu_;
  std::vector<Armed> faults_ ABSL_GUARDED_BY(mu_);
  uint32_t fired_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace kvcache::checkpoint

#endif  // KVCACHE_SERVER_CHECKPOINT_FAULT_INJECTING_FILE_SYSTEM_H_
