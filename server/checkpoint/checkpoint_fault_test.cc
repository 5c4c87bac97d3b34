// What a failing disk and corrupted files do to checkpoints: a commit that
// fails leaves no complete checkpoint, a corrupted one is detected, and in
// every case the previous checkpoint stays the newest complete and reads fully.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <sstream>

#include "server/checkpoint/checkpoint_directory.h"
#include "server/checkpoint/checkpoint_format.h"
#include "server/checkpoint/checkpoint_test_util.h"
#include "server/checkpoint/fault_injecting_file_system.h"
#include "server/checkpoint/manifest.h"

namespace kvcache::checkpoint {
namespace {

using ::testing::HasSubstr;
using testing::ReadsBackAs;
using testing::SomeRecords;
using testing::TestBytes;
using testing::TestDirectory;
using testing::TestRecord;
using testing::WriteCheckpoint;

class CheckpointFaultTest : public ::testing::Test {
 protected:
  void SetUp() override {
    previous_ = SomeRecords(1, 50);
    ASSERT_EQ(WriteCheckpoint(&fs_, dir_.path(), 1, previous_).size(), previous_.size());
  }

  // Checkpoint 1 reads back whole and verifies.
  void ExpectPreviousReads() {
    EXPECT_TRUE(ReadsBackAs(&fs_, dir_.path(), 1, previous_));
    EXPECT_TRUE(directory_.Verify(1).value().status.ok());
  }

  // Checkpoint 1 is still the newest complete one and reads back whole.
  void ExpectPreviousIntact() {
    auto newest = directory_.NewestComplete();
    ASSERT_TRUE(newest.ok()) << newest.status();
    EXPECT_EQ(newest->sequence, 1u);
    ExpectPreviousReads();
  }

  // Writes checkpoint 2 (6 MiB in 256 KiB records, the first compressed) and
  // commits it: the first error from Append or Commit, else OK.
  absl::Status TryWriteSecond() {
    WriterOptions options;
    options.buffer_bytes = 1 << 20;
    auto writer = CheckpointWriter::Create(&fs_, dir_.path(), 2, options);
    if (!writer.ok()) return writer.status();
    for (int i = 0; i < 24; ++i) {
      auto location = (*writer)->Append(1, TestBytes(i, 256 << 10, i == 0), i == 0);
      if (!location.ok()) return location.status();
    }
    return (*writer)->Commit(nlohmann::json::object(), {1}).status();
  }

  TestDirectory dir_;
  FaultInjectingFileSystem fs_{DefaultFileSystem()};
  CheckpointDirectory directory_{&fs_, dir_.path(), CheckpointKey{}};
  std::vector<TestRecord> previous_;
};

struct FaultCase {
  const char* name;
  Fault fault;
  absl::StatusCode code;
  const char* message;
};

void PrintTo(const FaultCase& c, std::ostream* os) { *os << c.name; }

class CommitFaultTest : public CheckpointFaultTest,
                        public ::testing::WithParamInterface<FaultCase> {};

TEST_P(CommitFaultTest, FailedCommitLeavesThePreviousCheckpoint) {
  const FaultCase& c = GetParam();
  fs_.AddFault(c.fault);
  const absl::Status status = TryWriteSecond();
  EXPECT_EQ(fs_.fired(), 1u);
  EXPECT_EQ(status.code(), c.code) << status;
  EXPECT_THAT(status.message(), HasSubstr(c.message));
  auto list = directory_.List();
  ASSERT_TRUE(list.ok());
  for (const CheckpointInfo& info : *list) {
    EXPECT_TRUE(info.sequence == 1 || info.state != CheckpointState::kComplete);
  }
  // The writer cleaned up after itself.
  EXPECT_FALSE(std::filesystem::exists(dir_.File(DataFileName(2))));
  EXPECT_FALSE(std::filesystem::exists(dir_.File(ManifestFileName(2))));
  EXPECT_FALSE(std::filesystem::exists(dir_.File(ManifestTempFileName(2))));
  ExpectPreviousIntact();
  // And the next attempt, without the fault, commits.
  EXPECT_TRUE(TryWriteSecond().ok());
  EXPECT_EQ(directory_.NewestComplete().value().sequence, 2u);
}

const char kData2[] = "ckpt-00000000000000000002.data";
const char kManifestTmp2[] = "ckpt-00000000000000000002.manifest.tmp";

const FaultCase kFaultCases[] = {FaultCase{"ShortWriteOfData",
                                           {FaultKind::kShortWrite, kData2, 3},
                                           absl::StatusCode::kUnavailable,
                                           "short write"},
                                 FaultCase{"NoSpaceForData",
                                           {FaultKind::kNoSpace, kData2, 2},
                                           absl::StatusCode::kResourceExhausted,
                                           "No space left on device"},
                                 FaultCase{"IoErrorOnData",
                                           {FaultKind::kIoError, kData2, 1},
                                           absl::StatusCode::kUnavailable,
                                           "Input/output error"},
                                 FaultCase{"IoErrorOnLaterDataWrite",
                                           {FaultKind::kIoError, kData2, 7},
                                           absl::StatusCode::kUnavailable,
                                           "Input/output error"},
                                 FaultCase{"DataSyncFails",
                                           {FaultKind::kSyncFails, kData2, 1},
                                           absl::StatusCode::kUnavailable,
                                           "fdatasync"},
                                 FaultCase{"NoSpaceForManifest",
                                           {FaultKind::kNoSpace, kManifestTmp2, 1},
                                           absl::StatusCode::kResourceExhausted,
                                           "manifest.tmp"},
                                 FaultCase{"ManifestSyncFails",
                                           {FaultKind::kSyncFails, kManifestTmp2, 1},
                                           absl::StatusCode::kUnavailable,
                                           "fdatasync"},
                                 FaultCase{"ManifestRenameFails",
                                           {FaultKind::kRenameFails, kManifestTmp2, 1},
                                           absl::StatusCode::kUnavailable,
                                           "rename"}};

INSTANTIATE_TEST_SUITE_P(Faults, CommitFaultTest, ::testing::ValuesIn(kFaultCases),
                         [](const ::testing::TestParamInfo<FaultCase>& info) {
                           return info.param.name;
                         });

// Corruption of a committed checkpoint 2.
class CorruptionTest : public CheckpointFaultTest {
 protected:
  void SetUp() override {
    CheckpointFaultTest::SetUp();
    second_ = {{1, TestBytes(7, 3000, true), true},
               {2, TestBytes(8, 70000), false},
               {3, TestBytes(9, 100), true}};
    locations_ = WriteCheckpoint(&fs_, dir_.path(), 2, second_, {1});
    ASSERT_EQ(locations_.size(), second_.size());
    data_ = dir_.File(DataFileName(2));
    data_bytes_ = std::filesystem::file_size(data_);
  }

  // Reading checkpoint 2 fails with DATA_LOSS saying `message`; 1 reads.
  // (List() reads manifests and headers only: damage inside the frames shows
  // when the records are read, and restart falls back to the checkpoint before.)
  void ExpectDetected(const std::string& message) {
    std::vector<Record> got;
    const absl::Status s = testing::ReadAll(&fs_, dir_.path(), 2, &got);
    EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss) << s;
    EXPECT_THAT(s.message(), HasSubstr(message));
    EXPECT_EQ(directory_.Verify(2).value().status.code(), absl::StatusCode::kDataLoss);
    ExpectPreviousReads();
  }

  // Checkpoint 2 lists as corrupt with `reason`, so 1 is the newest complete.
  void ExpectListedCorrupt(const std::string& reason) {
    auto list = directory_.List().value();
    ASSERT_EQ(list.size(), 2u);
    EXPECT_EQ(list[1].state, CheckpointState::kCorrupt);
    EXPECT_THAT(list[1].reason, HasSubstr(reason));
    ExpectPreviousIntact();
  }

  // Rewrites checkpoint 2's manifest to match the data file as it is now, so
  // that only the frames can tell what is wrong.
  void RefreshManifest() {
    std::ifstream in(dir_.File(ManifestFileName(2)), std::ios::binary);
    std::stringstream text;
    text << in.rdbuf();
    Manifest m = DecodeManifest(text.str(), 2, CheckpointKey{}, "test").value();
    std::ifstream data(data_, std::ios::binary);
    std::stringstream bytes;
    bytes << data.rdbuf();
    m.data_bytes = bytes.str().size();
    m.data_xxh3 = XXH3_64bits(bytes.str().data(), bytes.str().size());
    std::ofstream(dir_.File(ManifestFileName(2)), std::ios::binary | std::ios::trunc)
        << EncodeManifest(m, CheckpointKey{});
  }

  std::vector<TestRecord> second_;
  std::vector<RecordLocation> locations_;
  std::string data_;
  uint64_t data_bytes_ = 0;
};

TEST_F(CorruptionTest, IntactCheckpointReads) {
  EXPECT_TRUE(ReadsBackAs(&fs_, dir_.path(), 2, second_));
}

TEST_F(CorruptionTest, FlippedByteInRecord) {
  const uint64_t offset = locations_[1].offset + kFrameHeaderBytes + 500;
  ASSERT_TRUE(fs_.CorruptByte(data_, offset).ok());
  ExpectDetected("frame at offset " + std::to_string(locations_[1].offset) + ": MAC mismatch");
  auto reader = CheckpointReader::Open(&fs_, dir_.path(), 2);
  ASSERT_TRUE(reader.ok());
  Record record;
  EXPECT_EQ((*reader)->ReadRecordAt(locations_[1], &record).code(), absl::StatusCode::kDataLoss);
  EXPECT_TRUE((*reader)->ReadRecordAt(locations_[2], &record).ok());
}

TEST_F(CorruptionTest, FlippedByteInFrameLength) {
  ASSERT_TRUE(fs_.CorruptByte(data_, locations_[2].offset + 1, 0x01).ok());
  ExpectDetected("frame at offset " + std::to_string(locations_[2].offset));
}

TEST_F(CorruptionTest, FlippedByteInEndRecord) {
  ASSERT_TRUE(fs_.CorruptByte(data_, data_bytes_ - 3).ok());
  ExpectDetected("MAC mismatch");
}

TEST_F(CorruptionTest, FlippedByteInDataHeader) {
  ASSERT_TRUE(fs_.CorruptByte(data_, 17).ok());
  ExpectDetected("header checksum mismatch");
  ExpectListedCorrupt("header checksum mismatch");
}

TEST_F(CorruptionTest, FlippedByteInManifest) {
  const std::string manifest = dir_.File(ManifestFileName(2));
  ASSERT_TRUE(fs_.CorruptByte(manifest, std::filesystem::file_size(manifest) / 2, 0x02).ok());
  ExpectDetected("manifest MAC mismatch");
  ExpectListedCorrupt("manifest MAC mismatch");
}

TEST_F(CorruptionTest, DataFileMissing) {
  ASSERT_TRUE(fs_.Delete(data_).ok());
  ExpectDetected("data file missing");
  ExpectListedCorrupt("data file missing");
}

TEST_F(CorruptionTest, TruncatedAtFrameBoundary) {
  ASSERT_TRUE(fs_.Truncate(data_, locations_[2].offset).ok());
  ExpectDetected("manifest says " + std::to_string(data_bytes_));
  ExpectListedCorrupt("bytes, the manifest says");
  // Even with a manifest that agrees, the missing end record gives it away.
  RefreshManifest();
  ExpectDetected("truncated: the file ends at offset " + std::to_string(locations_[2].offset) +
                 " before the end record");
}

TEST_F(CorruptionTest, TruncatedBeforeEndRecord) {
  // Cut exactly the end record off (the last frame: 24 + 8 bytes).
  ASSERT_TRUE(fs_.Truncate(data_, data_bytes_ - kFrameHeaderBytes - 8).ok());
  RefreshManifest();
  ExpectDetected("before the end record");
}

TEST_F(CorruptionTest, TruncatedInsideFrame) {
  ASSERT_TRUE(fs_.Truncate(data_, locations_[1].offset + kFrameHeaderBytes + 1000).ok());
  ExpectDetected("manifest says " + std::to_string(data_bytes_));
  RefreshManifest();
  ExpectDetected("truncated: the frame at offset " + std::to_string(locations_[1].offset));
}

TEST_F(CorruptionTest, BytesAfterEndRecord) {
  std::ofstream(data_, std::ios::binary | std::ios::app) << "junk";
  RefreshManifest();
  ExpectDetected("bytes follow the end record");
}

}  // namespace
}  // namespace kvcache::checkpoint
