// The POSIX file system and the fault-injecting wrapper.
#include "server/checkpoint/file_system.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <sys/stat.h>

#include <algorithm>
#include <cerrno>
#include <filesystem>

#include "server/checkpoint/checkpoint_test_util.h"
#include "server/checkpoint/fault_injecting_file_system.h"
#include "server/common/status_macros.h"

namespace kvcache::checkpoint {
namespace {

using ::testing::HasSubstr;
using testing::TestBytes;
using testing::TestDirectory;
using ::testing::UnorderedElementsAre;

std::vector<std::byte> ReadWhole(FileSystem* fs, const std::string& path) {
  auto file = fs->NewReadableFile(path);
  EXPECT_TRUE(file.ok()) << file.status();
  if (!file.ok()) return {};
  std::vector<std::byte> bytes((*file)->Size().value());
  EXPECT_EQ((*file)->Read(0, bytes).value(), bytes.size());
  return bytes;
}

absl::Status WriteWhole(FileSystem* fs, const std::string& path, std::span<const std::byte> bytes) {
  auto file = fs->NewWritableFile(path);
  if (!file.ok()) return file.status();
  KVCACHE_RETURN_IF_ERROR((*file)->Append(bytes));
  KVCACHE_RETURN_IF_ERROR((*file)->Sync());
  return (*file)->Close();
}

TEST(PosixFileSystemTest, FilesAndDirectories) {
  TestDirectory dir;
  FileSystem* fs = DefaultFileSystem();
  const std::string sub = dir.path() + "/a/b";
  ASSERT_TRUE(fs->CreateDir(sub).ok());
  ASSERT_TRUE(fs->CreateDir(sub).ok());  // exists: fine
  const std::vector<std::byte> bytes = TestBytes(1, 100000);
  ASSERT_TRUE(WriteWhole(fs, sub + "/f", bytes).ok());
  EXPECT_EQ(ReadWhole(fs, sub + "/f"), bytes);
  auto file = fs->NewReadableFile(sub + "/f");
  ASSERT_TRUE(file.ok());
  std::vector<std::byte> tail(1000);
  EXPECT_EQ((*file)->Read(bytes.size() - 10, tail).value(), 10u);  // short only at the end
  EXPECT_EQ((*file)->Read(bytes.size() + 10, tail).value(), 0u);

  ASSERT_TRUE(fs->Rename(sub + "/f", sub + "/g").ok());
  EXPECT_FALSE(fs->Exists(sub + "/f"));
  EXPECT_TRUE(fs->Exists(sub + "/g"));
  ASSERT_TRUE(WriteWhole(fs, sub + "/h", {}).ok());
  EXPECT_THAT(fs->ListDir(sub).value(), UnorderedElementsAre("g", "h"));
  EXPECT_TRUE(fs->SyncDir(sub).ok());
  ASSERT_TRUE(fs->Delete(sub + "/g").ok());
  EXPECT_THAT(fs->ListDir(sub).value(), UnorderedElementsAre("h"));
}

mode_t ModeOf(const std::string& path) {
  struct stat st;
  EXPECT_EQ(::stat(path.c_str(), &st), 0) << path;
  return st.st_mode & 07777;
}

// Restores the process's umask when it goes.
class ScopedUmask {
 public:
  explicit ScopedUmask(mode_t mask) : old_(::umask(mask)) {}
  ~ScopedUmask() { ::umask(old_); }

 private:
  mode_t old_;
};

// Checkpoint files hold every tenant's prompts and KV: 0600 and 0700 whatever
// the umask (0 here, which would give 0666 and 0777), and a file that existed
// with a wider mode is narrowed when rewritten.
TEST(PosixFileSystemTest, FilesAre0600AndFolders0700UnderAnyUmask) {
  TestDirectory dir;
  FileSystem* fs = DefaultFileSystem();
  for (mode_t mask : {mode_t{0}, mode_t{0077}, mode_t{0007}}) {
    SCOPED_TRACE(mask);
    ScopedUmask umask(mask);
    std::filesystem::remove_all(dir.path());
    const std::string sub = dir.path() + "/a/b";
    ASSERT_TRUE(fs->CreateDir(sub).ok());
    EXPECT_EQ(ModeOf(dir.path()), 0700u);
    EXPECT_EQ(ModeOf(dir.path() + "/a"), 0700u);
    EXPECT_EQ(ModeOf(sub), 0700u);
    ASSERT_TRUE(WriteWhole(fs, sub + "/f", TestBytes(1, 10)).ok());
    EXPECT_EQ(ModeOf(sub + "/f"), 0600u);
    ASSERT_EQ(::chmod((sub + "/f").c_str(), 0666), 0);
    ASSERT_TRUE(WriteWhole(fs, sub + "/f", TestBytes(2, 10)).ok());
    EXPECT_EQ(ModeOf(sub + "/f"), 0600u);
  }
  // An existing folder keeps its mode (CheckPrivateDirectory judges it).
  ASSERT_EQ(::chmod(dir.path().c_str(), 0750), 0);
  ASSERT_TRUE(fs->CreateDir(dir.path()).ok());
  EXPECT_EQ(ModeOf(dir.path()), 0750u);
}

TEST(PosixFileSystemTest, CheckPrivateDirectoryRefusesAFolderOthersMayEnter) {
  TestDirectory dir;
  ASSERT_TRUE(DefaultFileSystem()->CreateDir(dir.path()).ok());
  EXPECT_TRUE(CheckPrivateDirectory(dir.path()).ok());
  for (mode_t mode : {0770, 0750, 0701, 0705, 0703}) {
    ASSERT_EQ(::chmod(dir.path().c_str(), mode), 0);
    const absl::Status s = CheckPrivateDirectory(dir.path());
    EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << mode;
    EXPECT_THAT(s.message(), HasSubstr(dir.path()));
    EXPECT_THAT(s.message(), HasSubstr("chmod 700"));
  }
  ASSERT_EQ(::chmod(dir.path().c_str(), 0700), 0);
  EXPECT_TRUE(CheckPrivateDirectory(dir.path()).ok());
  EXPECT_EQ(CheckPrivateDirectory(dir.path() + "/missing").code(), absl::StatusCode::kNotFound);
  ASSERT_TRUE(WriteWhole(DefaultFileSystem(), dir.File("f"), {}).ok());
  EXPECT_EQ(CheckPrivateDirectory(dir.File("f")).code(), absl::StatusCode::kFailedPrecondition);
}

TEST(PosixFileSystemTest, ErrorsNameThePathAndErrno) {
  TestDirectory dir;
  FileSystem* fs = DefaultFileSystem();
  const std::string missing = dir.path() + "/missing";
  absl::Status s = fs->NewReadableFile(missing).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(s.message(), HasSubstr(missing));
  EXPECT_THAT(s.message(), HasSubstr("No such file or directory"));
  EXPECT_EQ(fs->Delete(missing).code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(fs->ListDir(missing).status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(ErrnoToStatus(ENOSPC, "write", "/x").code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(ErrnoToStatus(EIO, "write", "/x").code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(JoinPath("a/", "b"), "a/b");
  EXPECT_EQ(JoinPath("a", "b"), "a/b");
}

TEST(FaultInjectingFileSystemTest, FaultsFireOnTheNthMatchingCallOnce) {
  TestDirectory dir;
  FaultInjectingFileSystem fs(DefaultFileSystem());
  ASSERT_TRUE(fs.CreateDir(dir.path()).ok());
  const std::vector<std::byte> chunk = TestBytes(1, 1000);
  fs.AddFault({FaultKind::kShortWrite, "target", 2});
  fs.AddFault({FaultKind::kNoSpace, "other", 1});
  auto file = fs.NewWritableFile(dir.File("target"));
  ASSERT_TRUE(file.ok());
  EXPECT_TRUE((*file)->Append(chunk).ok());
  absl::Status s = (*file)->Append(chunk);  // the 2nd: half written
  EXPECT_EQ(s.code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(s.message(), HasSubstr("short write"));
  EXPECT_TRUE((*file)->Append(chunk).ok());  // fired once
  ASSERT_TRUE((*file)->Close().ok());
  EXPECT_EQ(ReadWhole(&fs, dir.File("target")).size(), 2500u);
  EXPECT_EQ(fs.fired(), 1u);

  auto other = fs.NewWritableFile(dir.File("other"));
  ASSERT_TRUE(other.ok());
  EXPECT_EQ((*other)->Append(chunk).code(), absl::StatusCode::kResourceExhausted);
  fs.AddFault({FaultKind::kIoError, "other", 1});
  fs.AddFault({FaultKind::kSyncFails, "other", 1});
  EXPECT_THAT((*other)->Append(chunk).message(), HasSubstr("Input/output error"));
  EXPECT_EQ((*other)->Sync().code(), absl::StatusCode::kUnavailable);
  EXPECT_TRUE((*other)->Sync().ok());
  fs.AddFault({FaultKind::kRenameFails, "other", 1});
  EXPECT_EQ(fs.Rename(dir.File("other"), dir.File("x")).code(), absl::StatusCode::kUnavailable);
  EXPECT_TRUE(fs.Exists(dir.File("other")));
  fs.AddFault({FaultKind::kRenameFails, "other", 1});
  fs.ClearFaults();
  EXPECT_TRUE(fs.Rename(dir.File("other"), dir.File("x")).ok());
  EXPECT_EQ(fs.fired(), 5u);
}

// A crash loses what was not synced: appends after the last Sync, files
// created and renames made since their folder's last SyncDir.
TEST(FaultInjectingFileSystemTest, ACrashLosesWhatWasNotSynced) {
  TestDirectory dir;
  FaultInjectingFileSystem fs(DefaultFileSystem());
  ASSERT_TRUE(fs.CreateDir(dir.path()).ok());
  const std::vector<std::byte> bytes = TestBytes(3, 3000);
  const std::span<const std::byte> all(bytes);
  ASSERT_TRUE(WriteWhole(&fs, dir.File("durable"), all.first(1000)).ok());
  ASSERT_TRUE(WriteWhole(&fs, dir.File("renamed"), all.first(10)).ok());
  ASSERT_TRUE(fs.SyncDir(dir.path()).ok());

  auto file = fs.NewWritableFile(dir.File("durable"));  // rewritten: 2000 synced, 1000 not
  ASSERT_TRUE(file.ok());
  ASSERT_TRUE((*file)->Append(all.first(2000)).ok());
  ASSERT_TRUE((*file)->Sync().ok());
  ASSERT_TRUE((*file)->Append(all.subspan(2000)).ok());
  ASSERT_TRUE(WriteWhole(&fs, dir.File("new"), all.first(100)).ok());  // synced, folder not
  ASSERT_TRUE(fs.Rename(dir.File("renamed"), dir.File("moved")).ok());
  fs.CrashAfter(1);
  ASSERT_TRUE((*file)->Append(all.first(5)).ok());  // the last change that happens
  EXPECT_EQ((*file)->Sync().code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(fs.SyncDir(dir.path()).code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(fs.Delete(dir.File("new")).code(), absl::StatusCode::kUnavailable);
  EXPECT_TRUE(fs.crashed());
  EXPECT_EQ(ReadWhole(&fs, dir.File("durable")).size(), 3005u);  // before the crash is applied

  ASSERT_TRUE(fs.LoseUnsyncedWrites().ok());
  EXPECT_FALSE(fs.crashed());
  EXPECT_EQ(ReadWhole(&fs, dir.File("durable")),
            std::vector<std::byte>(bytes.begin(), bytes.begin() + 2000));
  EXPECT_FALSE(fs.Exists(dir.File("new")));
  EXPECT_FALSE(fs.Exists(dir.File("moved")));
  EXPECT_EQ(ReadWhole(&fs, dir.File("renamed")).size(), 10u);
  EXPECT_TRUE(fs.SyncDir(dir.path()).ok());  // works again, as after a reboot
}

TEST(FaultInjectingFileSystemTest, CorruptAndTruncate) {
  TestDirectory dir;
  FaultInjectingFileSystem fs(DefaultFileSystem());
  ASSERT_TRUE(fs.CreateDir(dir.path()).ok());
  std::vector<std::byte> bytes = TestBytes(2, 4096);
  ASSERT_TRUE(WriteWhole(&fs, dir.File("f"), bytes).ok());
  ASSERT_TRUE(fs.CorruptByte(dir.File("f"), 100, 0x10).ok());
  bytes[100] ^= std::byte{0x10};
  EXPECT_EQ(ReadWhole(&fs, dir.File("f")), bytes);
  EXPECT_EQ(fs.CorruptByte(dir.File("f"), 4096).code(), absl::StatusCode::kOutOfRange);
  ASSERT_TRUE(fs.Truncate(dir.File("f"), 1000).ok());
  bytes.resize(1000);
  EXPECT_EQ(ReadWhole(&fs, dir.File("f")), bytes);
}

}  // namespace
}  // namespace kvcache::checkpoint
