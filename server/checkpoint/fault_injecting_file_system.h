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
// Crashes. CrashAfter(n) lets the next n changing calls (NewWritableFile,
// Append, Sync, Rename, Delete, CreateDir, SyncDir) happen; from the one after
// on, the process is "dead": every changing call fails with UNAVAILABLE
// "crashed (injected)" and changes nothing (reads still work, for the test).
// LoseUnsyncedWrites() then leaves on disk what a power loss at that moment
// could leave, the worst case: every file written through this file system
// keeps only the bytes its last Sync() made durable (none when never synced);
// a file created, and a rename made, since the last SyncDir() of its folder
// are undone (deletes are taken as durable). It ends the crash: the file
// system works again, as after a reboot. Only what this file system wrote is
// tracked, from its construction on.
//
// Thread-safe. The wrapped file system must outlive this one and every file
// it opened.
#ifndef KVCACHE_SERVER_CHECKPOINT_FAULT_INJECTING_FILE_SYSTEM_H_
#define KVCACHE_SERVER_CHECKPOINT_FAULT_INJECTING_FILE_SYSTEM_H_

#include <cstdint>
#include <map>
#include <optional>
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

  // Crash after the next `changes` changing calls (see above).
  void CrashAfter(uint32_t changes);
  // Whether a crash has happened (a changing call was refused).
  bool crashed() const;
  // Applies the crash to the files (see above) and clears it.
  absl::Status LoseUnsyncedWrites();

  // Whether an operation of `kind` on `path` fails now (counts the call).
  // Used by the files this file system opens.
  bool ShouldFail(FaultKind kind, const std::string& path);
  // For changing calls: UNAVAILABLE once crashed (or when this call is the
  // one past CrashAfter's count), else OK and counted. Used by its files.
  absl::Status Change(absl::string_view op, const std::string& path);
  // Durability bookkeeping of the files this file system opens.
  void Appended(const std::string& path, uint64_t bytes);
  void Synced(const std::string& path);

  absl::StatusOr<std::unique_ptr<WritableFile>> NewWritableFile(const std::string& path) override;
  absl::StatusOr<std::unique_ptr<ReadableFile>> NewReadableFile(const std::string& path) override {
    return base_->NewReadableFile(path);
  }
  absl::Status Rename(const std::string& from, const std::string& to) override;
  absl::Status Delete(const std::string& path) override;
  absl::Status CreateDir(const std::string& path) override;
  absl::StatusOr<std::vector<std::string>> ListDir(const std::string& path) override {
    return base_->ListDir(path);
  }
  absl::Status SyncDir(const std::string& path) override;
  bool Exists(const std::string& path) override { return base_->Exists(path); }

 private:
  struct Armed {
    Fault fault;
    uint32_t seen = 0;
  };
  // A file written through this file system since it was created or opened.
  struct Written {
    uint64_t size = 0;       // bytes appended
    uint64_t durable = 0;    // of which the last Sync() made durable
    bool new_entry = false;  // created, and its folder not synced since
  };
  struct PendingRename {
    std::string from;
    std::string to;
  };

  absl::StatusOr<std::vector<std::byte>> ReadAll(const std::string& path);
  absl::Status WriteAll(const std::string& path, std::span<const std::byte> bytes);

  FileSystem* const base_;
  mutable absl::Mutex mu_;
  std::vector<Armed> faults_ ABSL_GUARDED_BY(mu_);
  uint32_t fired_ ABSL_GUARDED_BY(mu_) = 0;
  std::optional<uint32_t> changes_left_ ABSL_GUARDED_BY(mu_);  // set by CrashAfter
  bool crashed_ ABSL_GUARDED_BY(mu_) = false;
  std::map<std::string, Written> written_ ABSL_GUARDED_BY(mu_);
  std::vector<PendingRename> renames_ ABSL_GUARDED_BY(mu_);  // since their folder's SyncDir
};

}  // namespace kvcache::checkpoint

#endif  // KVCACHE_SERVER_CHECKPOINT_FAULT_INJECTING_FILE_SYSTEM_H_
