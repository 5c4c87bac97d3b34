#include "server/checkpoint/fault_injecting_file_system.h"

#include <cerrno>
#include <utility>

#include "absl/strings/str_cat.h"

namespace kvcache::checkpoint {
namespace {

class FaultyWritableFile final : public WritableFile {
 public:
  FaultyWritableFile(FaultInjectingFileSystem* fs, std::unique_ptr<WritableFile> base,
                     std::string path)
      : fs_(fs), base_(std::move(base)), path_(std::move(path)) {}

  absl::Status Append(std::span<const std::byte> data) override {
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
    return base_->Append(data);
  }

  absl::Status Sync() override {
    if (fs_->ShouldFail(FaultKind::kSyncFails, path_)) {
      return ErrnoToStatus(EIO, "fdatasync (injected)", path_);
    }
    return base_->Sync();
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
  absl::StatusOr<std::unique_ptr<WritableFile>> base = base_->NewWritableFile(path);
  if (!base.ok()) return base.status();
  return std::make_unique<FaultyWritableFile>(this, *std::move(base), path);
}

absl::Status FaultInjectingFileSystem::Rename(const std::string& from, const std::string& to) {
  if (ShouldFail(FaultKind::kRenameFails, from)) {
    return ErrnoToStatus(EIO, absl::StrCat("rename to ", to, " (injected) of"), from);
  }
  return base_->Rename(from, to);
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
  if (absl::Status s = (*file)->Append(bytes); !s.ok()) return s;
  if (absl::Status s = (*file)->Sync(); !s.ok()) return s;
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
