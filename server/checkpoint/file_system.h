// FileSystem: the file operations checkpoints need, behind an interface so
// that tests can make the disk fail on purpose (as LevelDB's Env).
//
// Errors are absl::Status values whose message names the operation, the path
// and the errno text: ENOSPC and EDQUOT are RESOURCE_EXHAUSTED, ENOENT is
// NOT_FOUND, every other errno is UNAVAILABLE. Nothing throws.
//
// DefaultFileSystem() is POSIX (open/write/fdatasync/pread/rename). It holds
// no state, so one instance serves the whole process.
// FaultInjectingFileSystem (fault_injecting_file_system.h) wraps another.
//
// Thread-safety: a FileSystem may be used from any thread concurrently. A
// WritableFile or ReadableFile is used by one thread at a time; a ReadableFile's
// Read() and Size() are const and may be called concurrently.
#ifndef KVCACHE_SERVER_CHECKPOINT_FILE_SYSTEM_H_
#define KVCACHE_SERVER_CHECKPOINT_FILE_SYSTEM_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace kvcache::checkpoint {

// A file open for appending, created empty (or truncated) by NewWritableFile.
// The destructor closes the file if Close() was not called (errors ignored).
class WritableFile {
 public:
  virtual ~WritableFile() = default;

  // Appends all of `data` (retrying short writes); an error leaves an unknown
  // prefix of `data` in the file.
  virtual absl::Status Append(std::span<const std::byte> data) = 0;
  // fdatasync: what was appended is on the device when this returns OK.
  virtual absl::Status Sync() = 0;
  // REQUIRES: called at most once; no Append or Sync after it.
  virtual absl::Status Close() = 0;
};

// A file open for positioned reads.
class ReadableFile {
 public:
  virtual ~ReadableFile() = default;

  // Reads up to out.size() bytes at `offset` into `out` (retrying short
  // reads); returns how many were read, fewer only at the end of the file.
  virtual absl::StatusOr<size_t> Read(uint64_t offset, std::span<std::byte> out) const = 0;
  virtual absl::StatusOr<uint64_t> Size() const = 0;
};

class FileSystem {
 public:
  virtual ~FileSystem() = default;

  // Creates `path` or truncates it to zero bytes. The POSIX one makes it mode
  // 0600 (whatever the umask, and for a file that existed).
  virtual absl::StatusOr<std::unique_ptr<WritableFile>> NewWritableFile(
      const std::string& path) = 0;
  // NOT_FOUND when `path` does not exist.
  virtual absl::StatusOr<std::unique_ptr<ReadableFile>> NewReadableFile(
      const std::string& path) = 0;
  // Atomically replaces `to` (rename(2)); both in one file system.
  virtual absl::Status Rename(const std::string& from, const std::string& to) = 0;
  // Removes a file; NOT_FOUND when it does not exist.
  virtual absl::Status Delete(const std::string& path) = 0;
  // Creates `path` and its missing parents; OK when it already exists. The
  // POSIX one creates each missing folder mode 0700 (whatever the umask) and
  // leaves existing ones as they are (CheckPrivateDirectory checks them).
  virtual absl::Status CreateDir(const std::string& path) = 0;
  // The names (not paths) of the entries of directory `path`, without "." and
  // "..", in no particular order.
  virtual absl::StatusOr<std::vector<std::string>> ListDir(const std::string& path) = 0;
  // fsync of the directory itself, so that renames and creations in it last.
  virtual absl::Status SyncDir(const std::string& path) = 0;
  // Whether `path` exists (false also when it cannot be checked).
  virtual bool Exists(const std::string& path) = 0;
};

// The POSIX file system. Never null; lives as long as the process.
FileSystem* DefaultFileSystem();

// For the checkpoint folder at start-up (POSIX, not through a FileSystem):
// OK when `path` is a directory that the effective user owns and that nobody
// else may enter, read or write (mode & 0077 == 0). FAILED_PRECONDITION
// naming the path, its mode or owner and the fix otherwise; the stat error
// when it cannot be checked.
absl::Status CheckPrivateDirectory(const std::string& path);

// The status for errno `err` from operation `op` (e.g. "write") on `path`:
// RESOURCE_EXHAUSTED (ENOSPC, EDQUOT), NOT_FOUND (ENOENT) or UNAVAILABLE.
absl::Status ErrnoToStatus(int err, absl::string_view op, absl::string_view path);

// dir + "/" + name (no separator doubled).
std::string JoinPath(absl::string_view dir, absl::string_view name);

}  // namespace kvcache::checkpoint

#endif  // KVCACHE_SERVER_CHECKPOINT_FILE_SYSTEM_H_
