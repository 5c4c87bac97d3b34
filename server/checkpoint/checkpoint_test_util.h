// Helpers shared by the checkpoint tests: a fresh directory per test, test
// bytes, and writing/reading whole checkpoints.
#ifndef KVCACHE_SERVER_CHECKPOINT_CHECKPOINT_TEST_UTIL_H_
#define KVCACHE_SERVER_CHECKPOINT_CHECKPOINT_TEST_UTIL_H_

#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <random>
#include <string>
#include <vector>

#include "server/checkpoint/checkpoint_reader.h"
#include "server/checkpoint/checkpoint_writer.h"

namespace kvcache::checkpoint::testing {

// A directory of its own for the running test, removed when it passes.
class TestDirectory {
 public:
  TestDirectory() {
    const char* tmp = std::getenv("TMPDIR");
    const std::string root = tmp != nullptr && *tmp != '\0' ? tmp : KVCACHE_CHECKPOINT_TEST_DIR;
    const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
    std::string name = std::string(info->test_suite_name()) + "." + info->name();
    for (char& c : name) {
      if (c == '/') c = '_';
    }
    path_ = root + "/checkpoint_test." + std::to_string(getpid()) + "." + name;
    std::filesystem::remove_all(path_);
  }
  ~TestDirectory() {
    if (!::testing::Test::HasFailure()) std::filesystem::remove_all(path_);
  }
  const std::string& path() const { return path_; }
  std::string File(const std::string& name) const { return path_ + "/" + name; }

 private:
  std::string path_;
};

// `size` bytes from `seed`: random (incompressible) or, with `compressible`,
// a short random alphabet that zstd shrinks.
inline std::vector<std::byte> TestBytes(uint64_t seed, size_t size, bool compressible = false) {
  std::vector<std::byte> bytes(size);
  std::mt19937_64 rng(seed * 0x9e3779b97f4a7c15ULL + size);
  for (size_t i = 0; i < size; i += 8) {
    uint64_t v = rng();
    if (compressible) v &= 0x0303030303030303ULL;
    std::memcpy(bytes.data() + i, &v, std::min<size_t>(8, size - i));
  }
  return bytes;
}

struct TestRecord {
  uint8_t type = 0;
  std::vector<std::byte> bytes;
  bool compress = false;
};

// Writes and commits checkpoint `sequence` holding `records`; returns their
// locations (empty and a test failure on error).
inline std::vector<RecordLocation> WriteCheckpoint(FileSystem* fs, const std::string& dir,
                                                   uint64_t sequence,
                                                   const std::vector<TestRecord>& records,
                                                   std::vector<uint64_t> references = {}) {
  auto writer = CheckpointWriter::Create(fs, dir, sequence);
  EXPECT_TRUE(writer.ok()) << writer.status();
  if (!writer.ok()) return {};
  std::vector<RecordLocation> locations;
  for (const TestRecord& r : records) {
    auto location = (*writer)->Append(r.type, r.bytes, r.compress);
    EXPECT_TRUE(location.ok()) << location.status();
    if (!location.ok()) return {};
    locations.push_back(*location);
  }
  auto info = (*writer)->Commit({{"records", records.size()}}, std::move(references));
  EXPECT_TRUE(info.ok()) << info.status();
  if (!info.ok()) return {};
  return locations;
}

// Some records of mixed sizes and kinds for checkpoint `sequence`.
inline std::vector<TestRecord> SomeRecords(uint64_t sequence, int n = 20) {
  std::vector<TestRecord> records;
  for (int i = 0; i < n; ++i) {
    const size_t size = (i % 5 == 0) ? 0 : size_t{1} << (4 + i % 13);
    records.push_back(
        {static_cast<uint8_t>(i), TestBytes(sequence * 1000 + i, size, i % 2 == 0), i % 3 != 0});
  }
  return records;
}

// Reads checkpoint `sequence` fully; the status of the first failure, else
// OK with `out` holding every record.
inline absl::Status ReadAll(FileSystem* fs, const std::string& dir, uint64_t sequence,
                            std::vector<Record>* out) {
  auto reader = CheckpointReader::Open(fs, dir, sequence);
  if (!reader.ok()) return reader.status();
  while (true) {
    Record record;
    absl::StatusOr<bool> more = (*reader)->Next(&record);
    if (!more.ok()) return more.status();
    if (!*more) return absl::OkStatus();
    out->push_back(std::move(record));
  }
}

// Whether checkpoint `sequence` reads back exactly as `records`.
inline ::testing::AssertionResult ReadsBackAs(FileSystem* fs, const std::string& dir,
                                              uint64_t sequence,
                                              const std::vector<TestRecord>& records) {
  std::vector<Record> got;
  if (absl::Status s = ReadAll(fs, dir, sequence, &got); !s.ok()) {
    return ::testing::AssertionFailure() << s;
  }
  if (got.size() != records.size()) {
    return ::testing::AssertionFailure() << got.size() << " records, expected " << records.size();
  }
  for (size_t i = 0; i < got.size(); ++i) {
    if (got[i].type != records[i].type || got[i].bytes != records[i].bytes) {
      return ::testing::AssertionFailure() << "record " << i << " differs";
    }
  }
  return ::testing::AssertionSuccess();
}

}  // namespace kvcache::checkpoint::testing

#endif  // KVCACHE_SERVER_CHECKPOINT_CHECKPOINT_TEST_UTIL_H_
