// Authenticated checkpoints (docs/checkpoint-format.md, "Authentication"):
// only a reader holding the key a checkpoint was written under reads it back;
// any byte changed in any of its files, a file planted or a frame moved in
// from another checkpoint is refused with DATA_LOSS; an older, unauthenticated
// format is refused too.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "server/checkpoint/checkpoint_directory.h"
#include "server/checkpoint/checkpoint_format.h"
#include "server/checkpoint/checkpoint_test_util.h"
#include "server/checkpoint/manifest.h"
#include "xxhash.h"

namespace kvcache::checkpoint {
namespace {

using ::testing::HasSubstr;
using testing::ReadAll;
using testing::SomeRecords;
using testing::TestDirectory;
using testing::TestRecord;

CheckpointKey Key(uint8_t fill) {
  CheckpointKey key;
  key.fill(fill);
  return key;
}

std::string ReadText(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

void WriteText(const std::string& path, const std::string& text) {
  std::ofstream(path, std::ios::binary | std::ios::trunc) << text;
}

// Writes and commits checkpoint `sequence` of `records` under `key`.
void Write(const std::string& dir, uint64_t sequence, const std::vector<TestRecord>& records,
           const CheckpointKey& key, std::vector<uint64_t> references = {}) {
  WriterOptions options;
  options.mac_key = key;
  auto writer = CheckpointWriter::Create(DefaultFileSystem(), dir, sequence, options);
  ASSERT_TRUE(writer.ok()) << writer.status();
  for (const TestRecord& r : records) {
    ASSERT_TRUE((*writer)->Append(r.type, r.bytes, r.compress).ok());
  }
  ASSERT_TRUE((*writer)->Commit({{"records", records.size()}}, std::move(references)).ok());
}

// Reads every record of checkpoint `sequence` under `key`.
absl::Status ReadUnder(const std::string& dir, uint64_t sequence, const CheckpointKey& key) {
  auto reader = CheckpointReader::Open(DefaultFileSystem(), dir, sequence, {.mac_key = key});
  if (!reader.ok()) return reader.status();
  Record record;
  while (true) {
    absl::StatusOr<bool> more = (*reader)->Next(&record);
    if (!more.ok()) return more.status();
    if (!*more) return absl::OkStatus();
  }
}

TEST(CheckpointAuthTest, AnotherKeyDoesNotReadIt) {
  TestDirectory dir;
  ASSERT_NO_FATAL_FAILURE(Write(dir.path(), 1, SomeRecords(1), Key(0xa1)));
  EXPECT_TRUE(ReadUnder(dir.path(), 1, Key(0xa1)).ok());
  const absl::Status other = ReadUnder(dir.path(), 1, Key(0xb2));
  EXPECT_EQ(other.code(), absl::StatusCode::kDataLoss) << other;
  EXPECT_THAT(other.message(), HasSubstr("MAC mismatch"));
  // The directory under the other key: corrupt, not complete.
  CheckpointDirectory directory(DefaultFileSystem(), dir.path(), Key(0xb2));
  auto list = directory.List().value();
  ASSERT_EQ(list.size(), 1u);
  EXPECT_EQ(list[0].state, CheckpointState::kCorrupt);
  EXPECT_EQ(directory.NewestComplete().status().code(), absl::StatusCode::kNotFound);
}

// Every single byte of the manifest and of the data file, flipped one at a
// time, makes the checkpoint unreadable.
TEST(CheckpointAuthTest, AByteFlippedAnywhereIsRefused) {
  TestDirectory dir;
  const CheckpointKey key = Key(0x5c);
  std::vector<TestRecord> records = SomeRecords(1, 6);
  ASSERT_NO_FATAL_FAILURE(Write(dir.path(), 1, records, key));
  for (const std::string& name : {ManifestFileName(1), DataFileName(1)}) {
    const std::string path = dir.File(name);
    const std::string original = ReadText(path);
    ASSERT_GT(original.size(), 100u);
    for (size_t i = 0; i < original.size(); ++i) {
      std::string damaged = original;
      damaged[i] = static_cast<char>(damaged[i] ^ 0x01);
      WriteText(path, damaged);
      const absl::Status s = ReadUnder(dir.path(), 1, key);
      ASSERT_EQ(s.code(), absl::StatusCode::kDataLoss) << name << " byte " << i << ": " << s;
    }
    WriteText(path, original);
    ASSERT_TRUE(ReadUnder(dir.path(), 1, key).ok());
  }
}

TEST(CheckpointAuthTest, APlantedCheckpointIsRefused) {
  TestDirectory dir;
  const CheckpointKey key = Key(0x11);
  ASSERT_NO_FATAL_FAILURE(Write(dir.path(), 1, SomeRecords(1), key));
  ASSERT_NO_FATAL_FAILURE(Write(dir.path(), 2, SomeRecords(2), key, {1}));
  // Whoever writes a checkpoint without the key (here under their own).
  ASSERT_NO_FATAL_FAILURE(Write(dir.path(), 3, SomeRecords(3), Key(0x66)));
  EXPECT_EQ(ReadUnder(dir.path(), 3, key).code(), absl::StatusCode::kDataLoss);
  CheckpointDirectory directory(DefaultFileSystem(), dir.path(), key);
  EXPECT_EQ(directory.NewestComplete().value().sequence, 2u);

  // A data file of another checkpoint under the same key, renamed into place
  // (its sequence patched, its header checksum fixed): its id differs.
  const std::string data1 = ReadText(dir.File(DataFileName(1)));
  std::string planted = data1;
  std::vector<std::byte> header(kDataHeaderBytes);
  std::memcpy(header.data(), planted.data(), kDataHeaderBytes);
  PutU64(&header[8], 2);
  PutU64(&header[56], XXH3_64bits(header.data(), 56));
  std::memcpy(planted.data(), header.data(), kDataHeaderBytes);
  const std::string data2 = ReadText(dir.File(DataFileName(2)));
  WriteText(dir.File(DataFileName(2)), planted);
  absl::Status s = ReadUnder(dir.path(), 2, key);
  EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss) << s;

  // Frames of checkpoint 1 copied over checkpoint 2's, header and size kept:
  // each frame's tag binds it to its checkpoint.
  std::string spliced = data1.substr(0, std::min(data1.size(), data2.size()));
  std::memcpy(spliced.data(), data2.data(), kDataHeaderBytes);
  spliced.resize(data2.size(), '\0');
  WriteText(dir.File(DataFileName(2)), spliced);
  s = ReadUnder(dir.path(), 2, key);
  EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss) << s;
  EXPECT_THAT(s.message(), HasSubstr("MAC mismatch"));
}

// Version 1 had no MAC: refused as DATA_LOSS (corrupt, so a restart falls back
// and pruning removes it), not as a newer version.
TEST(CheckpointAuthTest, AnOlderUnauthenticatedVersionIsDataLoss) {
  TestDirectory dir;
  const CheckpointKey key = Key(0x42);
  ASSERT_NO_FATAL_FAILURE(Write(dir.path(), 1, SomeRecords(1), key));
  ASSERT_NO_FATAL_FAILURE(Write(dir.path(), 2, SomeRecords(2), key));
  const std::string manifest_path = dir.File(ManifestFileName(1));
  Manifest m = DecodeManifest(ReadText(manifest_path), 1, key, "test").value();
  m.format_version = 1;
  WriteText(manifest_path, EncodeManifest(m, key));
  absl::Status s = ReadUnder(dir.path(), 1, key);
  EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss) << s;
  EXPECT_THAT(s.message(), HasSubstr("format version 1 is not authenticated"));

  const std::string data_path = dir.File(DataFileName(2));
  std::string data = ReadText(data_path);
  std::vector<std::byte> header(kDataHeaderBytes);
  std::memcpy(header.data(), data.data(), kDataHeaderBytes);
  PutU16(&header[4], 1);
  PutU64(&header[56], XXH3_64bits(header.data(), 56));
  std::memcpy(data.data(), header.data(), kDataHeaderBytes);
  WriteText(data_path, data);
  s = ReadUnder(dir.path(), 2, key);
  EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss) << s;
  EXPECT_THAT(s.message(), HasSubstr("format version 1 is not authenticated"));

  CheckpointDirectory directory(DefaultFileSystem(), dir.path(), key);
  auto list = directory.List().value();
  ASSERT_EQ(list.size(), 2u);
  EXPECT_EQ(list[0].state, CheckpointState::kCorrupt);
  EXPECT_EQ(list[1].state, CheckpointState::kCorrupt);
}

TEST(CheckpointAuthTest, FrameTagsDependOnKeyIdSequenceAndOffset) {
  const CheckpointId id{1, 2, 3};
  CheckpointId other_id = id;
  other_id[15] = 9;
  const std::vector<std::byte> stored(100, std::byte{7});
  const FrameHeader h{.stored_bytes = 100, .uncompressed_bytes = 100, .type = 3, .index = 4};
  const uint64_t tag = FrameMac(Key(1), id, 5).Tag(h, 64, stored);
  EXPECT_EQ(FrameMac(Key(1), id, 5).Tag(h, 64, stored), tag);
  EXPECT_NE(FrameMac(Key(2), id, 5).Tag(h, 64, stored), tag);
  EXPECT_NE(FrameMac(Key(1), other_id, 5).Tag(h, 64, stored), tag);
  EXPECT_NE(FrameMac(Key(1), id, 6).Tag(h, 64, stored), tag);
  EXPECT_NE(FrameMac(Key(1), id, 5).Tag(h, 88, stored), tag);
  FrameHeader h2 = h;
  h2.index = 5;
  EXPECT_NE(FrameMac(Key(1), id, 5).Tag(h2, 64, stored), tag);
}

}  // namespace
}  // namespace kvcache::checkpoint
