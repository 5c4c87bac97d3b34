// The checkpoint container on a real directory: round trips, references and
// retention, format versions, the writer's lifecycle.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "server/checkpoint/checkpoint_directory.h"
#include "server/checkpoint/checkpoint_format.h"
#include "server/checkpoint/checkpoint_test_util.h"
#include "server/checkpoint/fault_injecting_file_system.h"
#include "server/checkpoint/manifest.h"

namespace kvcache::checkpoint {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using testing::ReadsBackAs;
using testing::SomeRecords;
using testing::TestBytes;
using testing::TestDirectory;
using testing::TestRecord;
using testing::WriteCheckpoint;

constexpr size_t kMiB = size_t{1} << 20;

std::string ReadText(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

TEST(CheckpointFileTest, RoundTripOfManyRecords) {
  TestDirectory dir;
  FileSystem* fs = DefaultFileSystem();
  std::vector<TestRecord> records = SomeRecords(1, 500);
  records.push_back({7, {}, true});                              // empty, compress asked
  records.push_back({8, TestBytes(1, 8 * kMiB), true});          // 8 MiB incompressible
  records.push_back({9, TestBytes(2, 8 * kMiB, true), true});    // 8 MiB compressible
  records.push_back({10, TestBytes(3, 8 * kMiB, true), false});  // 8 MiB kept raw
  const std::vector<RecordLocation> locations = WriteCheckpoint(fs, dir.path(), 1, records);
  ASSERT_EQ(locations.size(), records.size());
  EXPECT_TRUE(ReadsBackAs(fs, dir.path(), 1, records));

  // Each record's location is where the reader finds it, sequentially and by offset.
  auto reader = CheckpointReader::Open(fs, dir.path(), 1);
  ASSERT_TRUE(reader.ok()) << reader.status();
  EXPECT_EQ((*reader)->info().record_count, records.size());
  EXPECT_EQ((*reader)->info().summary["records"], records.size());
  Record record;
  for (size_t i = 0; i < records.size(); ++i) {
    ASSERT_TRUE((*reader)->Next(&record).value());
    EXPECT_EQ(record.location, locations[i]);
  }
  EXPECT_FALSE((*reader)->Next(&record).value());
  EXPECT_FALSE((*reader)->Next(&record).value());
  for (size_t i : {size_t{0}, size_t{250}, records.size() - 2, records.size() - 1}) {
    ASSERT_TRUE((*reader)->ReadRecordAt(locations[i], &record).ok());
    EXPECT_EQ(record.type, records[i].type);
    EXPECT_EQ(record.bytes, records[i].bytes);
  }
}

TEST(CheckpointFileTest, CompressesOnlyWhenSmaller) {
  TestDirectory dir;
  FileSystem* fs = DefaultFileSystem();
  const std::vector<std::byte> random = TestBytes(1, kMiB);
  const std::vector<std::byte> text = TestBytes(2, kMiB, /*compressible=*/true);
  auto size_with = [&](const std::vector<std::byte>& bytes, bool compress, int level,
                       uint64_t sequence) -> uint64_t {
    WriterOptions options;
    options.zstd_level = level;
    auto writer = CheckpointWriter::Create(fs, dir.path(), sequence, options);
    EXPECT_TRUE(writer.ok());
    EXPECT_TRUE((*writer)->Append(1, bytes, compress).ok());
    auto info = (*writer)->Commit(nlohmann::json::object(), {});
    EXPECT_TRUE(info.ok()) << info.status();
    return info.ok() ? info->data_bytes : 0;
  };
  const uint64_t overhead = kDataHeaderBytes + 2 * kFrameHeaderBytes + 8;
  EXPECT_EQ(size_with(random, true, 1, 1), overhead + kMiB);  // zstd did not help: raw
  EXPECT_EQ(size_with(text, false, 1, 2), overhead + kMiB);   // not asked
  EXPECT_EQ(size_with(text, true, 0, 3), overhead + kMiB);    // level 0: never
  EXPECT_LT(size_with(text, true, 1, 4), overhead + kMiB / 2);
  EXPECT_TRUE(ReadsBackAs(fs, dir.path(), 4, {{1, text, true}}));
}

TEST(CheckpointFileTest, ManifestIsReadableJson) {
  TestDirectory dir;
  FileSystem* fs = DefaultFileSystem();
  WriterOptions options;
  int64_t now = 1'700'000'000'000;
  options.now_unix_ms = [&] { return now += 250; };
  auto writer = CheckpointWriter::Create(fs, dir.path(), 42, options);
  ASSERT_TRUE(writer.ok());
  ASSERT_TRUE((*writer)->Append(3, TestBytes(1, 1000), true).ok());
  auto info = (*writer)->Commit({{"blocks", 12}, {"tenant", "a"}}, {});
  ASSERT_TRUE(info.ok()) << info.status();
  const nlohmann::json j = nlohmann::json::parse(ReadText(dir.File(ManifestFileName(42))));
  EXPECT_EQ(j["format_version"], 2);
  EXPECT_EQ(j["checkpoint_id"].get<std::string>().size(), 32u);
  EXPECT_EQ(j["sequence"], 42);
  EXPECT_EQ(j["created_unix_ms"], 1'700'000'000'250);
  EXPECT_EQ(j["write_duration_ms"], 250);
  EXPECT_EQ(j["data_file"], "ckpt-00000000000000000042.data");
  EXPECT_EQ(j["data_bytes"], std::filesystem::file_size(dir.File(DataFileName(42))));
  EXPECT_EQ(j["record_count"], 1);
  EXPECT_EQ(j["summary"]["blocks"], 12);
  EXPECT_EQ(j["references"], nlohmann::json::array());
  EXPECT_EQ(j["manifest_hmac"].get<std::string>().size(), 64u);
  EXPECT_FALSE(std::filesystem::exists(dir.File(ManifestTempFileName(42))));
}

TEST(CheckpointFileTest, ReferencesAcrossCheckpoints) {
  TestDirectory dir;
  FileSystem* fs = DefaultFileSystem();
  const std::vector<TestRecord> base = SomeRecords(1, 30);
  const std::vector<RecordLocation> locations = WriteCheckpoint(fs, dir.path(), 1, base);
  ASSERT_EQ(locations.size(), base.size());

  // Checkpoint 2 writes one record anew and refers to record 17 of checkpoint 1.
  auto encode = [](const RecordLocation& l) {
    std::vector<std::byte> b(16);
    PutU64(b.data(), l.sequence);
    PutU64(b.data() + 8, l.offset);
    return b;
  };
  constexpr uint8_t kReference = 200;
  const std::vector<TestRecord> incremental = {{1, TestBytes(99, 5000), true},
                                               {kReference, encode(locations[17]), false}};
  ASSERT_EQ(WriteCheckpoint(fs, dir.path(), 2, incremental, {1}).size(), 2u);

  auto reader = CheckpointReader::Open(fs, dir.path(), 2);
  ASSERT_TRUE(reader.ok()) << reader.status();
  EXPECT_THAT((*reader)->info().references, ElementsAre(1));
  Record record, target;
  int followed = 0;
  while (true) {
    absl::StatusOr<bool> more = (*reader)->Next(&record);
    ASSERT_TRUE(more.ok()) << more.status();
    if (!*more) break;
    if (record.type != kReference) continue;
    const RecordLocation l{GetU64(record.bytes.data()), GetU64(record.bytes.data() + 8)};
    ASSERT_TRUE((*reader)->ReadRecordAt(l, &target).ok());
    EXPECT_EQ(target.type, base[17].type);
    EXPECT_EQ(target.bytes, base[17].bytes);
    EXPECT_EQ(target.location, locations[17]);
    ++followed;
  }
  EXPECT_EQ(followed, 1);
  // Twice more, through the cached handle, and a location of another record.
  ASSERT_TRUE((*reader)->ReadRecordAt(locations[3], &target).ok());
  EXPECT_EQ(target.bytes, base[3].bytes);

  // A sequence not in the references, and an offset that is not a frame.
  absl::Status s = (*reader)->ReadRecordAt({3, locations[0].offset}, &target);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  EXPECT_THAT(s.message(), HasSubstr("does not reference checkpoint 3"));
  s = (*reader)->ReadRecordAt({1, locations[3].offset + 1}, &target);
  EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss) << s;
}

TEST(CheckpointFileTest, CommitRefusesBadReferences) {
  TestDirectory dir;
  FileSystem* fs = DefaultFileSystem();
  auto writer = CheckpointWriter::Create(fs, dir.path(), 5);
  ASSERT_TRUE(writer.ok());
  auto info = (*writer)->Commit(nlohmann::json::object(), {4});
  EXPECT_EQ(info.status().code(), absl::StatusCode::kFailedPrecondition) << info.status();
  EXPECT_FALSE(std::filesystem::exists(dir.File(DataFileName(5))));
  writer = CheckpointWriter::Create(fs, dir.path(), 5);
  ASSERT_TRUE(writer.ok());
  info = (*writer)->Commit(nlohmann::json::object(), {5});
  EXPECT_EQ(info.status().code(), absl::StatusCode::kInvalidArgument) << info.status();
}

TEST(CheckpointFileTest, PruneKeepsReferencedCheckpoints) {
  TestDirectory dir;
  FileSystem* fs = DefaultFileSystem();
  CheckpointDirectory directory(fs, dir.path(), CheckpointKey{});
  std::vector<RecordLocation> first = WriteCheckpoint(fs, dir.path(), 1, SomeRecords(1));
  ASSERT_FALSE(first.empty());
  ASSERT_FALSE(WriteCheckpoint(fs, dir.path(), 2, SomeRecords(2)).empty());
  ASSERT_FALSE(WriteCheckpoint(fs, dir.path(), 3, SomeRecords(3), {1}).empty());
  ASSERT_FALSE(WriteCheckpoint(fs, dir.path(), 4, SomeRecords(4), {1, 3}).empty());
  ASSERT_FALSE(WriteCheckpoint(fs, dir.path(), 5, SomeRecords(5)).empty());
  // An incomplete leftover (a writer that "crashed").
  { std::ofstream(dir.File(DataFileName(6))) << "partial"; }
  EXPECT_EQ(directory.NextSequence().value(), 7u);

  auto pruned = directory.Prune(2);  // keeps 5 and 4, and 3 and 1 that 4 references
  ASSERT_TRUE(pruned.ok()) << pruned.status();
  EXPECT_THAT(pruned->kept, ElementsAre(1, 3, 4, 5));
  EXPECT_THAT(pruned->deleted, ElementsAre(2, 6));
  EXPECT_TRUE(std::filesystem::exists(dir.File(DataFileName(1))));
  EXPECT_FALSE(std::filesystem::exists(dir.File(DataFileName(2))));
  EXPECT_FALSE(std::filesystem::exists(dir.File(ManifestFileName(2))));
  EXPECT_FALSE(std::filesystem::exists(dir.File(DataFileName(6))));

  auto reader = CheckpointReader::Open(fs, dir.path(), 4);
  ASSERT_TRUE(reader.ok());
  Record record;
  ASSERT_TRUE((*reader)->ReadRecordAt(first[7], &record).ok());
  EXPECT_EQ(record.bytes, SomeRecords(1)[7].bytes);

  pruned = directory.Prune(1);  // only 5 now
  ASSERT_TRUE(pruned.ok());
  EXPECT_THAT(pruned->kept, ElementsAre(5));
  EXPECT_THAT(pruned->deleted, ElementsAre(1, 3, 4));
  EXPECT_EQ(directory.Prune(0).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(CheckpointFileTest, ListClassifiesCheckpoints) {
  TestDirectory dir;
  FileSystem* fs = DefaultFileSystem();
  FaultInjectingFileSystem faulty(fs);
  CheckpointDirectory directory(fs, dir.path(), CheckpointKey{});
  EXPECT_TRUE(directory.List().value().empty());  // no directory yet
  EXPECT_EQ(directory.NextSequence().value(), 1u);
  EXPECT_EQ(directory.NewestComplete().status().code(), absl::StatusCode::kNotFound);
  ASSERT_FALSE(WriteCheckpoint(fs, dir.path(), 1, SomeRecords(1)).empty());
  ASSERT_FALSE(WriteCheckpoint(fs, dir.path(), 2, SomeRecords(2), {1}).empty());
  ASSERT_FALSE(WriteCheckpoint(fs, dir.path(), 3, SomeRecords(3)).empty());
  { std::ofstream(dir.File(ManifestTempFileName(4))) << "{"; }
  ASSERT_TRUE(faulty.CorruptByte(dir.File(ManifestFileName(1)), 20).ok());
  auto list = directory.List();
  ASSERT_TRUE(list.ok());
  ASSERT_EQ(list->size(), 4u);
  EXPECT_EQ((*list)[0].state, CheckpointState::kCorrupt);
  EXPECT_THAT((*list)[0].reason, HasSubstr("manifest MAC mismatch"));
  EXPECT_EQ((*list)[1].state, CheckpointState::kCorrupt);
  EXPECT_THAT((*list)[1].reason, HasSubstr("references checkpoint 1, which is corrupt"));
  EXPECT_EQ((*list)[2].state, CheckpointState::kComplete);
  EXPECT_EQ((*list)[2].record_count, 20u);
  EXPECT_EQ((*list)[3].state, CheckpointState::kIncomplete);
  EXPECT_EQ(directory.NewestComplete().value().sequence, 3u);
  EXPECT_EQ(directory.NextSequence().value(), 5u);
  auto report = directory.Verify(3);
  ASSERT_TRUE(report.ok());
  EXPECT_TRUE(report->status.ok()) << report->status;
  EXPECT_EQ(report->records_read, 20u);
  EXPECT_EQ(directory.Verify(2).value().status.code(), absl::StatusCode::kDataLoss);
}

// A checkpoint whose manifest or data header names a format version newer
// than this kvcached's.
TEST(CheckpointFileTest, NewerFormatVersionIsRefused) {
  TestDirectory dir;
  FileSystem* fs = DefaultFileSystem();
  FaultInjectingFileSystem faulty(fs);
  CheckpointDirectory directory(fs, dir.path(), CheckpointKey{});
  ASSERT_FALSE(WriteCheckpoint(fs, dir.path(), 1, SomeRecords(1)).empty());
  ASSERT_FALSE(WriteCheckpoint(fs, dir.path(), 2, SomeRecords(2)).empty());
  ASSERT_FALSE(WriteCheckpoint(fs, dir.path(), 3, SomeRecords(3)).empty());

  // 2: a manifest of the next version (with a valid MAC).
  const std::string manifest_path = dir.File(ManifestFileName(2));
  Manifest m = DecodeManifest(ReadText(manifest_path), 2, CheckpointKey{}, "test").value();
  m.format_version = kFormatVersion + 1;
  {
    std::ofstream(manifest_path, std::ios::binary | std::ios::trunc)
        << EncodeManifest(m, CheckpointKey{});
  }
  // 3: a manifest and a data header of the next version (with a valid MAC and
  // header checksum).
  const std::string manifest3 = dir.File(ManifestFileName(3));
  Manifest m3 = DecodeManifest(ReadText(manifest3), 3, CheckpointKey{}, "test").value();
  m3.format_version = kFormatVersion + 1;
  {
    std::ofstream(manifest3, std::ios::binary | std::ios::trunc)
        << EncodeManifest(m3, CheckpointKey{});
  }
  const std::string data_path = dir.File(DataFileName(3));
  std::string data = ReadText(data_path);
  std::vector<std::byte> header(kDataHeaderBytes);
  std::memcpy(header.data(), data.data(), kDataHeaderBytes);
  PutU16(&header[4], kFormatVersion + 1);
  PutU64(&header[56], XXH3_64bits(header.data(), 56));
  std::memcpy(data.data(), header.data(), kDataHeaderBytes);
  { std::ofstream(data_path, std::ios::binary | std::ios::trunc) << data; }

  for (uint64_t sequence : {2, 3}) {
    auto reader = CheckpointReader::Open(fs, dir.path(), sequence);
    EXPECT_EQ(reader.status().code(), absl::StatusCode::kFailedPrecondition) << reader.status();
    EXPECT_THAT(reader.status().message(),
                HasSubstr(absl::StrCat("checkpoint format version ", kFormatVersion + 1,
                                       ", this kvcached reads up to ", kFormatVersion)));
  }
  auto list = directory.List().value();
  EXPECT_EQ(list[1].state, CheckpointState::kUnsupported);
  EXPECT_EQ(list[2].state, CheckpointState::kUnsupported);
  EXPECT_EQ(directory.NewestComplete().value().sequence, 1u);
  auto pruned = directory.Prune(1);
  ASSERT_TRUE(pruned.ok());
  EXPECT_TRUE(pruned->deleted.empty());  // never prunes a newer format's files
  EXPECT_TRUE(std::filesystem::exists(data_path));

  // Only an authenticated manifest can claim a newer version: a header alone
  // that does (its manifest says the current one) is corrupt.
  ASSERT_FALSE(WriteCheckpoint(fs, dir.path(), 4, SomeRecords(4)).empty());
  const std::string data4_path = dir.File(DataFileName(4));
  std::string data4 = ReadText(data4_path);
  std::memcpy(data4.data(), header.data(), 8);  // magic and the next version
  std::vector<std::byte> header4(kDataHeaderBytes);
  std::memcpy(header4.data(), data4.data(), kDataHeaderBytes);
  PutU64(&header4[56], XXH3_64bits(header4.data(), 56));
  std::memcpy(data4.data(), header4.data(), kDataHeaderBytes);
  { std::ofstream(data4_path, std::ios::binary | std::ios::trunc) << data4; }
  EXPECT_EQ(CheckpointReader::Open(fs, dir.path(), 4).status().code(), absl::StatusCode::kDataLoss);
}

TEST(CheckpointFileTest, WriterLifecycle) {
  TestDirectory dir;
  FileSystem* fs = DefaultFileSystem();
  {
    auto writer = CheckpointWriter::Create(fs, dir.path(), 1);
    ASSERT_TRUE(writer.ok());
    ASSERT_TRUE((*writer)->Append(1, TestBytes(1, 100), false).ok());
    EXPECT_TRUE(std::filesystem::exists(dir.File(DataFileName(1))));
  }  // destroyed uncommitted: aborted
  EXPECT_FALSE(std::filesystem::exists(dir.File(DataFileName(1))));

  auto writer = CheckpointWriter::Create(fs, dir.path(), 1);
  ASSERT_TRUE(writer.ok());
  ASSERT_TRUE((*writer)->Commit(nlohmann::json::object(), {}).ok());
  EXPECT_EQ((*writer)->Append(1, {}, false).status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ((*writer)->Commit(nlohmann::json::object(), {}).status().code(),
            absl::StatusCode::kFailedPrecondition);
  (*writer)->Abort();  // no-op after commit
  EXPECT_TRUE(testing::ReadsBackAs(fs, dir.path(), 1, {}));
  EXPECT_EQ(CheckpointWriter::Create(fs, dir.path(), 1).status().code(),
            absl::StatusCode::kAlreadyExists);
  WriterOptions bad;
  bad.zstd_level = 30;
  EXPECT_THAT(CheckpointWriter::Create(fs, dir.path(), 2, bad).status().message(),
              HasSubstr("zstd_level"));
}

}  // namespace
}  // namespace kvcache::checkpoint
