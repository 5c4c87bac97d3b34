#include "server/checkpoint/file_system.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <system_error>
#include <utility>

#include "absl/strings/str_cat.h"

namespace kvcache::checkpoint {
namespace {

class PosixWritableFile final : public WritableFile {
 public:
  PosixWritableFile(int fd, std::string path) : fd_(fd), path_(std::move(path)) {}
  ~PosixWritableFile() override {
    if (fd_ >= 0) ::close(fd_);
  }

  absl::Status Append(std::span<const std::byte> data) override {
    const std::byte* p = data.data();
    size_t left = data.size();
    while (left > 0) {
      const ssize_t n = ::write(fd_, p, left);
      if (n < 0) {
        if (errno == EINTR) continue;
        return ErrnoToStatus(errno, "write", path_);
      }
      p += n;
      left -= static_cast<size_t>(n);
    }
    return absl::OkStatus();
  }

  absl::Status Sync() override {
    if (::fdatasync(fd_) != 0) return ErrnoToStatus(errno, "fdatasync", path_);
    return absl::OkStatus();
  }

  absl::Status Close() override {
    const int fd = std::exchange(fd_, -1);
    if (::close(fd) != 0) return ErrnoToStatus(errno, "close", path_);
    return absl::OkStatus();
  }

 private:
  int fd_;
  std::string path_;
};

class PosixReadableFile final : public ReadableFile {
 public:
  PosixReadableFile(int fd, std::string path) : fd_(fd), path_(std::move(path)) {}
  ~PosixReadableFile() override { ::close(fd_); }

  absl::StatusOr<size_t> Read(uint64_t offset, std::span<std::byte> out) const override {
    size_t done = 0;
    while (done < out.size()) {
      const ssize_t n =
          ::pread(fd_, out.data() + done, out.size() - done, static_cast<off_t>(offset + done));
      if (n < 0) {
        if (errno == EINTR) continue;
        return ErrnoToStatus(errno, "pread", path_);
      }
      if (n == 0) break;
      done += static_cast<size_t>(n);
    }
    return done;
  }

  absl::StatusOr<uint64_t> Size() const override {
    struct stat st;
    if (::fstat(fd_, &st) != 0) return ErrnoToStatus(errno, "fstat", path_);
    return static_cast<uint64_t>(st.st_size);
  }

 private:
  int fd_;
  std::string path_;
};

class PosixFileSystem final : public FileSystem {
 public:
  absl::StatusOr<std::unique_ptr<WritableFile>> NewWritableFile(const std::string& path) override {
    const int fd =
        ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC | O_NOFOLLOW, 0600);
    if (fd < 0) return ErrnoToStatus(errno, "open for writing", path);
    // 0600 whatever the umask, and also for a file that existed (a leftover).
    if (::fchmod(fd, 0600) != 0) {
      const int err = errno;
      ::close(fd);
      return ErrnoToStatus(err, "fchmod 0600", path);
    }
    return std::make_unique<PosixWritableFile>(fd, path);
  }

  absl::StatusOr<std::unique_ptr<ReadableFile>> NewReadableFile(const std::string& path) override {
    const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) return ErrnoToStatus(errno, "open for reading", path);
    return std::make_unique<PosixReadableFile>(fd, path);
  }

  absl::Status Rename(const std::string& from, const std::string& to) override {
    if (::rename(from.c_str(), to.c_str()) != 0) {
      return ErrnoToStatus(errno, absl::StrCat("rename to ", to, " of"), from);
    }
    return absl::OkStatus();
  }

  absl::Status Delete(const std::string& path) override {
    if (::unlink(path.c_str()) != 0) return ErrnoToStatus(errno, "unlink", path);
    return absl::OkStatus();
  }

  absl::Status CreateDir(const std::string& path) override {
    // Each missing folder, parents first, is created 0700 and chmod'ed so,
    // whatever the umask; existing ones are left as they are.
    std::filesystem::path built;
    for (const std::filesystem::path& part : std::filesystem::path(path)) {
      built /= part;
      if (part.empty() || part == "/" || part == "." || part == "..") continue;
      if (::mkdir(built.c_str(), 0700) == 0) {
        if (::chmod(built.c_str(), 0700) != 0)
          return ErrnoToStatus(errno, "chmod 0700", built.string());
        continue;
      }
      if (errno == EEXIST) {
        struct stat st;
        if (::stat(built.c_str(), &st) == 0 && S_ISDIR(st.st_mode)) continue;
        return ErrnoToStatus(ENOTDIR, "mkdir", built.string());
      }
      return ErrnoToStatus(errno, "mkdir", built.string());
    }
    return absl::OkStatus();
  }

  absl::StatusOr<std::vector<std::string>> ListDir(const std::string& path) override {
    DIR* dir = ::opendir(path.c_str());
    if (dir == nullptr) return ErrnoToStatus(errno, "opendir", path);
    std::vector<std::string> names;
    errno = 0;
    while (const dirent* entry = ::readdir(dir)) {
      const absl::string_view name = entry->d_name;
      if (name != "." && name != "..") names.emplace_back(name);
    }
    const int err = errno;
    ::closedir(dir);
    if (err != 0) return ErrnoToStatus(err, "readdir", path);
    return names;
  }

  absl::Status SyncDir(const std::string& path) override {
    const int fd = ::open(path.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd < 0) return ErrnoToStatus(errno, "open directory", path);
    const int rc = ::fsync(fd);
    const int err = errno;
    ::close(fd);
    if (rc != 0) return ErrnoToStatus(err, "fsync directory", path);
    return absl::OkStatus();
  }

  bool Exists(const std::string& path) override { return ::access(path.c_str(), F_OK) == 0; }
};

}  // namespace

absl::Status CheckPrivateDirectory(const std::string& path) {
  struct stat st;
  if (::stat(path.c_str(), &st) != 0) return ErrnoToStatus(errno, "stat", path);
  if (!S_ISDIR(st.st_mode)) {
    return absl::FailedPreconditionError(absl::StrCat(path, " is not a directory"));
  }
  if (st.st_uid != ::geteuid()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "checkpoint folder ", path, " belongs to uid ", st.st_uid, ", not to uid ", ::geteuid(),
        " that kvcached runs as: whoever owns it can read and plant checkpoints (chown it to "
        "the daemon's user, or choose another checkpoint.dir)"));
  }
  if ((st.st_mode & 0077) != 0) {
    char mode[8];
    std::snprintf(mode, sizeof(mode), "%04o", static_cast<unsigned>(st.st_mode & 07777));
    return absl::FailedPreconditionError(absl::StrCat(
        "checkpoint folder ", path, " has mode ", mode,
        ": others than its owner may enter it, and checkpoints hold every tenant's prompts and "
        "KV (chmod 700 ",
        path, ")"));
  }
  return absl::OkStatus();
}

FileSystem* DefaultFileSystem() {
  static PosixFileSystem* const fs = new PosixFileSystem();
  return fs;
}

absl::Status ErrnoToStatus(int err, absl::string_view op, absl::string_view path) {
  std::string message = absl::StrCat(op, " ", path, ": ", std::strerror(err), " (errno ", err, ")");
  switch (err) {
    case ENOSPC:
    case EDQUOT:
      return absl::ResourceExhaustedError(message);
    case ENOENT:
      return absl::NotFoundError(message);
    default:
      return absl::UnavailableError(message);
  }
}

std::string JoinPath(absl::string_view dir, absl::string_view name) {
  if (dir.empty()) return std::string(name);
  if (dir.back() == '/') return absl::StrCat(dir, name);
  return absl::StrCat(dir, "/", name);
}

}  // namespace kvcache::checkpoint
