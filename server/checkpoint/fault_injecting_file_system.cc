#include "server/checkpoint/fault_injecting_file_system.h"

#include <cerrno>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "server/common/status_macros.h"

namespace kvcache::checkpoint {
namespace {

class FaultyWritableFile final : public WritableFile {
 public:
  FaultyWritableFile(FaultInjectingFileSystem* fs, std::unique_ptr<WritableFile> base,
                     std::string path)
      : fs_(fs), base_(std::move(base)), path_(std::move(path)) {}

  absl::Status Append(std::span<const std::byte> data) override {
    KVCACHE_RETURN_IF_ERROR(fs_->Change("write", path_));
    if (fs_->ShouldFail(FaultKind::kShortWrite, path_)) {
      (void)base_->Append(data.first(data.size() / 2));
      return absl::UnavailableError(absl::StrCat("write ", path_, ": short write, ",
                                                 data.size() / 2, " of ", data.size(),
                                                 " bytes written (injected)"));
    }
    if (fs_->ShouldFail(FaultKind::kNoSpace, path_)) {
      return ErrnoToStatus(ENOSPC, "write (injected)", path_);
    }
    if (fs_->ShouldFail(FaultKind::kIoError, path_)) {
      return ErrnoToStatus(EIO, "write (injected)", path_);
    }
    absl::Status s = base_->Append(data);
    if (s.ok()) fs_->Appended(path_, data.size());
    return s;
  }

  absl::Status Sync() override {
    KVCACHE_RETURN_IF_ERROR(fs_->Change("fdatasync", path_));
    if (fs_->ShouldFail(FaultKind::kSyncFails, path_)) {
      return ErrnoToStatus(EIO, "fdatasync (injected)", path_);
    }
    absl::Status s = base_->Sync();
    if (s.ok()) fs_->Synced(path_);
    return s;
  }

  absl::Status Close() override { return base_->Close(); }

 private:
  FaultInjectingFileSystem* const fs_;
  std::unique_ptr<WritableFile> base_;
  const std::string path_;
};

}  // namespace

void FaultInjectingFileSystem::AddFault(Fault fault) {
  absl::MutexLock lock(&mu_);
  faults_.push_back(Armed{std::move(fault)});
}

void FaultInjectingFileSystem::ClearFaults() {
  absl::MutexLock lock(&mu_);
  faults_.clear();
}

uint32_t FaultInjectingFileSystem::fired() const {
  absl::MutexLock lock(&mu_);
  return fired_;
}

bool FaultInjectingFileSystem::ShouldFail(FaultKind kind, const std::string& path) {
  absl::MutexLock lock(&mu_);
  for (auto it = faults_.begin(); it != faults_.end(); ++it) {
    if (it->fault.kind != kind || path.find(it->fault.path_contains) == std::string::npos) {
      continue;
    }
    if (++it->seen == it->fault.nth) {
      faults_.erase(it);
      ++fired_;
      return true;
    }
  }
  return false;
}

absl::StatusOr<std::unique_ptr<WritableFile>> FaultInjectingFileSystem::NewWritableFile(
    const std::string& path) {
  KVCACHE_RETURN_IF_ERROR(Change("open for writing", path));
  const bool existed = base_->Exists(path);
  absl::StatusOr<std::unique_ptr<WritableFile>> base = base_->NewWritableFile(path);
  if (!base.ok()) return base.status();
  {
    absl::MutexLock lock(&mu_);
    Written& w = written_[path];
    w = Written{.new_entry = !existed || w.new_entry};
  }
  return std::make_unique<FaultyWritableFile>(this, *std::move(base), path);
}

absl::Status FaultInjectingFileSystem::Rename(const std::string& from, const std::string& to) {
  KVCACHE_RETURN_IF_ERROR(Change("rename", from));
  if (ShouldFail(FaultKind::kRenameFails, from)) {
    return ErrnoToStatus(EIO, absl::StrCat("rename to ", to, " (injected) of"), from);
  }
  absl::Status s = base_->Rename(from, to);
  if (!s.ok()) return s;
  absl::MutexLock lock(&mu_);
  if (auto it = written_.find(from); it != written_.end()) {
    Written w = it->second;
    written_.erase(it);
    written_[to] = w;
  }
  renames_.push_back({from, to});
  return absl::OkStatus();
}

absl::Status FaultInjectingFileSystem::Delete(const std::string& path) {
  KVCACHE_RETURN_IF_ERROR(Change("unlink", path));
  absl::Status s = base_->Delete(path);
  absl::MutexLock lock(&mu_);
  written_.erase(path);
  return s;
}

absl::Status FaultInjectingFileSystem::CreateDir(const std::string& path) {
  KVCACHE_RETURN_IF_ERROR(Change("mkdir", path));
  return base_->CreateDir(path);
}

namespace {
std::string FolderOf(const std::string& path) {
  const size_t slash = path.rfind('/');
  return slash == std::string::npos ? std::string() : path.substr(0, slash);
}
std::string WithoutTrailingSlash(std::string dir) {
  while (dir.size() > 1 && dir.back() == '/') dir.pop_back();
  return dir;
}
}  // namespace

absl::Status FaultInjectingFileSystem::SyncDir(const std::string& path) {
  KVCACHE_RETURN_IF_ERROR(Change("fsync directory", path));
  absl::Status s = base_->SyncDir(path);
  if (!s.ok()) return s;
  const std::string dir = WithoutTrailingSlash(path);
  absl::MutexLock lock(&mu_);
  for (auto& [file, w] : written_) {
    if (FolderOf(file) == dir) w.new_entry = false;
  }
  std::erase_if(renames_, [&](const PendingRename& r) { return FolderOf(r.to) == dir; });
  return absl::OkStatus();
}

void FaultInjectingFileSystem::CrashAfter(uint32_t changes) {
  absl::MutexLock lock(&mu_);
  changes_left_ = changes;
}

bool FaultInjectingFileSystem::crashed() const {
  absl::MutexLock lock(&mu_);
  return crashed_;
}

absl::Status FaultInjectingFileSystem::Change(absl::string_view op, const std::string& path) {
  absl::MutexLock lock(&mu_);
  if (!crashed_ && changes_left_.has_value()) {
    if (*changes_left_ == 0) {
      crashed_ = true;
    } else {
      --*changes_left_;
    }
  }
  if (crashed_) return absl::UnavailableError(absl::StrCat(op, " ", path, ": crashed (injected)"));
  return absl::OkStatus();
}

void FaultInjectingFileSystem::Appended(const std::string& path, uint64_t bytes) {
  absl::MutexLock lock(&mu_);
  written_[path].size += bytes;
}

void FaultInjectingFileSystem::Synced(const std::string& path) {
  absl::MutexLock lock(&mu_);
  Written& w = written_[path];
  w.durable = w.size;
}

absl::Status FaultInjectingFileSystem::LoseUnsyncedWrites() {
  std::vector<PendingRename> renames;
  std::map<std::string, Written> written;
  {
    absl::MutexLock lock(&mu_);
    renames.swap(renames_);
    written.swap(written_);
    changes_left_.reset();
    crashed_ = false;
  }
  // Renames not made durable go back, newest first; what they moved keeps
  // its bookkeeping under the old name.
  for (auto it = renames.rbegin(); it != renames.rend(); ++it) {
    if (!base_->Exists(it->to)) continue;  // deleted since (deletes are durable)
    KVCACHE_RETURN_IF_ERROR(base_->Rename(it->to, it->from));
    if (auto w = written.find(it->to); w != written.end()) {
      Written moved = w->second;
      written.erase(w);
      written[it->from] = moved;
    }
  }
  for (const auto& [path, w] : written) {
    if (!base_->Exists(path)) continue;
    if (w.new_entry) {
      KVCACHE_RETURN_IF_ERROR(base_->Delete(path));
    } else if (w.durable < w.size) {
      KVCACHE_RETURN_IF_ERROR(Truncate(path, w.durable));
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<std::vector<std::byte>> FaultInjectingFileSystem::ReadAll(const std::string& path) {
  absl::StatusOr<std::unique_ptr<ReadableFile>> file = base_->NewReadableFile(path);
  if (!file.ok()) return file.status();
  absl::StatusOr<uint64_t> size = (*file)->Size();
  if (!size.ok()) return size.status();
  std::vector<std::byte> bytes(*size);
  absl::StatusOr<size_t> n = (*file)->Read(0, bytes);
  if (!n.ok()) return n.status();
  bytes.resize(*n);
  return bytes;
}

absl::Status FaultInjectingFileSystem::WriteAll(const std::string& path,
                                                std::span<const std::byte> bytes) {
  absl::StatusOr<std::unique_ptr<WritableFile>> file = base_->NewWritableFile(path);
  if (!file.ok()) return file.status();
  KVCACHE_RETURN_IF_ERROR((*file)->Append(bytes));
  KVCACHE_RETURN_IF_ERROR((*file)->Sync());
  return (*file)->Close();
}

absl::Status FaultInjectingFileSystem::CorruptByte(const std::string& path, uint64_t offset,
                                                   uint8_t mask) {
  absl::StatusOr<std::vector<std::byte>> bytes = ReadAll(path);
  if (!bytes.ok()) return bytes.status();
  if (offset >= bytes->size()) {
    return absl::OutOfRangeError(
        absl::StrCat("CorruptByte: offset ", offset, " past the end of ", path));
  }
  (*bytes)[offset] ^= std::byte{mask};
  return WriteAll(path, *bytes);
}

absl::Status FaultInjectingFileSystem::Truncate(const std::string& path, uint64_t size) {
  absl::StatusOr<std::vector<std::byte>> bytes = ReadAll(path);
  if (!bytes.ok()) return bytes.status();
  if (size > bytes->size()) {
    return absl::OutOfRangeError(absl::StrCat("Truncate: ", path, " is shorter than ", size));
  }
  return WriteAll(path, std::span<const std::byte>(*bytes).first(size));
}

}  // namespace kvcache::checkpoint
