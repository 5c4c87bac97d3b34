// MemoryFileSystem: checkpoint files held in memory for the fuzz targets
// (server/checkpoint/file_system.h). Reads, listing, renames and deletes are
// real; writing is refused (the targets only read what they were given).
// Not thread-safe.
#ifndef KVCACHE_TESTS_FUZZ_MEMORY_FILE_SYSTEM_H_
#define KVCACHE_TESTS_FUZZ_MEMORY_FILE_SYSTEM_H_

#include <algorithm>
#include <cstring>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "server/checkpoint/file_system.h"

namespace kvcache::checkpoint {

class MemoryFileSystem final : public FileSystem {
 public:
  // Path -> bytes. Paths are "<dir>/<name>", one directory level.
  std::map<std::string, std::string> files;

  absl::StatusOr<std::unique_ptr<WritableFile>> NewWritableFile(const std::string&) override {
    return absl::UnimplementedError("read-only");
  }
  absl::StatusOr<std::unique_ptr<ReadableFile>> NewReadableFile(const std::string& path) override {
    auto it = files.find(path);
    if (it == files.end()) return absl::NotFoundError(path);
    return std::unique_ptr<ReadableFile>(new File(&it->second));
  }
  absl::Status Rename(const std::string& from, const std::string& to) override {
    auto it = files.find(from);
    if (it == files.end()) return absl::NotFoundError(from);
    std::string bytes = std::move(it->second);
    files.erase(it);
    files[to] = std::move(bytes);
    return absl::OkStatus();
  }
  absl::Status Delete(const std::string& path) override {
    return files.erase(path) != 0 ? absl::OkStatus() : absl::NotFoundError(path);
  }
  absl::Status CreateDir(const std::string&) override { return absl::OkStatus(); }
  absl::StatusOr<std::vector<std::string>> ListDir(const std::string&) override {
    std::vector<std::string> names;
    for (const auto& [path, bytes] : files) names.push_back(path.substr(path.rfind('/') + 1));
    return names;
  }
  absl::Status SyncDir(const std::string&) override { return absl::OkStatus(); }
  bool Exists(const std::string& path) override {
    if (files.count(path) != 0) return true;
    const std::string prefix = path + "/";
    return std::any_of(files.begin(), files.end(), [&](const auto& f) {
      return f.first.compare(0, prefix.size(), prefix) == 0;
    });
  }

 private:
  class File final : public ReadableFile {
   public:
    explicit File(const std::string* bytes) : bytes_(bytes) {}
    absl::StatusOr<size_t> Read(uint64_t offset, std::span<std::byte> out) const override {
      if (offset >= bytes_->size()) return 0;
      const size_t n = std::min<uint64_t>(out.size(), bytes_->size() - offset);
      if (n > 0) std::memcpy(out.data(), bytes_->data() + offset, n);
      return n;
    }
    absl::StatusOr<uint64_t> Size() const override { return bytes_->size(); }

   private:
    const std::string* bytes_;
  };
};

}  // namespace kvcache::checkpoint

#endif  // KVCACHE_TESTS_FUZZ_MEMORY_FILE_SYSTEM_H_
