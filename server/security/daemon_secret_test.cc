#include "server/security/daemon_secret.h"

#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>

#include "gtest/gtest.h"

namespace kvcache {
namespace {

class DaemonSecretTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = std::filesystem::temp_directory_path() /
           ("daemon_secret_test." + std::to_string(::getpid()));
    std::filesystem::create_directories(dir_);
    path_ = (dir_ / "kvcached.secret").string();
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }

  std::filesystem::path dir_;
  std::string path_;
};

TEST_F(DaemonSecretTest, CreatesAnOwnerOnlyFileAndReadsTheSameSecretBack) {
  const mode_t old = ::umask(0);  // the widest umask: the file is still 0600
  auto first = DaemonSecret::LoadOrCreate(path_);
  ::umask(old);
  ASSERT_TRUE(first.ok()) << first.status();
  struct stat st;
  ASSERT_EQ(::stat(path_.c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 07777, 0600u);
  auto second = DaemonSecret::LoadOrCreate(path_);
  ASSERT_TRUE(second.ok()) << second.status();
  EXPECT_EQ(first->Derive("x"), second->Derive("x"));
  EXPECT_NE(first->Derive("x"), DaemonSecret::Random().Derive("x"));
}

TEST_F(DaemonSecretTest, RefusesAFileOthersMayRead) {
  ASSERT_TRUE(DaemonSecret::LoadOrCreate(path_).ok());
  ASSERT_EQ(::chmod(path_.c_str(), 0640), 0);
  auto s = DaemonSecret::LoadOrCreate(path_);
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(s.status().message().find("0640"), std::string::npos) << s.status();
}

TEST_F(DaemonSecretTest, RefusesTextThatIsNotASecret) {
  {
    std::ofstream out(path_);
    out << "not a secret\n";
  }
  ASSERT_EQ(::chmod(path_.c_str(), 0600), 0);
  auto s = DaemonSecret::LoadOrCreate(path_);
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.status().code(), absl::StatusCode::kDataLoss);
}

TEST_F(DaemonSecretTest, LoadReadsASharedSecretButNeverCreatesOne) {
  auto missing = DaemonSecret::Load(path_, "the remote tier's key file");
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kNotFound);
  EXPECT_NE(missing.status().message().find("the remote tier's key file"), std::string::npos)
      << missing.status();
  EXPECT_FALSE(std::filesystem::exists(path_));
  // Another daemon's file (the same bytes on every node): read as it is.
  ASSERT_TRUE(DaemonSecret::LoadOrCreate(path_).ok());
  auto loaded = DaemonSecret::Load(path_, "the remote tier's key file");
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  EXPECT_EQ(loaded->Derive("x"), DaemonSecret::LoadOrCreate(path_)->Derive("x"));
  // The same checks: a file others may read is refused, naming it.
  ASSERT_EQ(::chmod(path_.c_str(), 0604), 0);
  auto open = DaemonSecret::Load(path_, "the remote tier's key file");
  EXPECT_EQ(open.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(open.status().message().find("the remote tier's key file"), std::string::npos);
  EXPECT_EQ(DaemonSecret::Load("", "the remote tier's key file").status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST_F(DaemonSecretTest, PurposesGiveIndependentKeys) {
  const DaemonSecret secret = DaemonSecret::FromBytes(SecretKey{1, 2, 3});
  EXPECT_NE(secret.Derive("checkpoint-mac"), secret.Derive("chain-key"));
  EXPECT_EQ(secret.Derive("a"), DaemonSecret::FromBytes(SecretKey{1, 2, 3}).Derive("a"));
  EXPECT_NE(secret.DeriveSeed("a"), secret.DeriveSeed("b"));
}

TEST(HmacTest, MatchesRfc4231Case2Shape) {
  // RFC 4231 test case 2 uses a 4-byte key ("Jefe"); HMAC pads short keys
  // with zeros, so the same key padded to 32 bytes gives the same MAC.
  SecretKey key{};
  key[0] = 'J', key[1] = 'e', key[2] = 'f', key[3] = 'e';
  const SecretKey mac = HmacSha256(key, std::string_view("what do ya want for nothing?"));
  const uint8_t expected[4] = {0x5b, 0xdc, 0xc1, 0x46};
  EXPECT_EQ(0, std::memcmp(mac.data(), expected, 4));
  HmacStream stream(key);
  stream.Update(std::string_view("what do ya want "));
  stream.Update(std::string_view("for nothing?"));
  EXPECT_TRUE(MacEquals(stream.Finish(), mac));
}

}  // namespace
}  // namespace kvcache
