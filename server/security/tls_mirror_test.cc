#include "server/security/tls_mirror.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>

#include "absl/strings/str_cat.h"

namespace kvcache {
namespace {

using ::testing::HasSubstr;

std::string Read(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

void Copy(const std::string& from, const std::string& to) {
  std::filesystem::copy_file(from, to, std::filesystem::copy_options::overwrite_existing);
}

// Certificates from make_test_certs.sh; the configured files are copies the
// tests replace the way an operator renews them, one file at a time.
class TlsMirrorTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    certs_ =
        new std::string(::testing::TempDir() + "tls-mirror-certs-" + std::to_string(::getpid()));
    ASSERT_EQ(
        std::system(absl::StrCat("bash ", MAKE_TEST_CERTS, " ", *certs_, " >/dev/null").c_str()),
        0);
  }
  void SetUp() override {
    dir_ = ::testing::TempDir() + "tls-mirror-" + std::to_string(::getpid());
    std::filesystem::remove_all(dir_);
    std::filesystem::create_directories(dir_ + "/run");
    Copy(Cert("server.pem"), Conf("cert.pem"));
    Copy(Cert("server.key"), Conf("key.pem"));
    Copy(Cert("ca.pem"), Conf("ca.pem"));
    files_ = {.cert_file = Conf("cert.pem"),
              .key_file = Conf("key.pem"),
              .client_ca_file = Conf("ca.pem")};
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }

  static std::string Cert(const std::string& name) { return *certs_ + "/" + name; }
  std::string Conf(const std::string& name) const { return dir_ + "/" + name; }

  // What gRPC would read now through the mirror.
  static std::pair<std::string, std::string> Served(const TlsMirror& m) {
    return {Read(m.mirrored().cert_file), Read(m.mirrored().key_file)};
  }

  static std::string* certs_;
  std::string dir_;
  TlsFiles files_;
};
std::string* TlsMirrorTest::certs_ = nullptr;

TEST_F(TlsMirrorTest, ARenewedKeyIsServedOnlyOnceItsCertificateIsThereToo) {
  auto mirror = TlsMirror::Start(files_, dir_ + "/run");
  ASSERT_TRUE(mirror.ok()) << mirror.status();
  EXPECT_EQ(Served(**mirror), std::make_pair(Read(Cert("server.pem")), Read(Cert("server.key"))));
  EXPECT_EQ(Read((*mirror)->mirrored().client_ca_file), Read(Cert("ca.pem")));
  EXPECT_EQ((*mirror)->installed(), 1u);

  // The operator writes the new key first: not a pair, not installed.
  Copy(Cert("server-rekeyed.key"), Conf("key.pem"));
  EXPECT_FALSE((*mirror)->Refresh());
  EXPECT_EQ(Served(**mirror), std::make_pair(Read(Cert("server.pem")), Read(Cert("server.key"))));
  // Then its certificate: the new pair goes in whole.
  Copy(Cert("server-rekeyed.pem"), Conf("cert.pem"));
  EXPECT_TRUE((*mirror)->Refresh());
  EXPECT_EQ(Served(**mirror),
            std::make_pair(Read(Cert("server-rekeyed.pem")), Read(Cert("server-rekeyed.key"))));
  EXPECT_EQ((*mirror)->installed(), 2u);
  // Nothing changed: nothing installed.
  EXPECT_TRUE((*mirror)->Refresh());
  EXPECT_EQ((*mirror)->installed(), 2u);
  // A file that stops loading leaves the last good set.
  std::ofstream(Conf("cert.pem"), std::ios::trunc) << "not a certificate";
  EXPECT_FALSE((*mirror)->Refresh());
  EXPECT_EQ(Served(**mirror).first, Read(Cert("server-rekeyed.pem")));
}

TEST_F(TlsMirrorTest, ItsFilesAreTheDaemonsAloneAndGoWithIt) {
  std::string private_dir;
  {
    auto mirror = TlsMirror::Start(files_, dir_ + "/run");
    ASSERT_TRUE(mirror.ok()) << mirror.status();
    private_dir = std::filesystem::path((*mirror)->mirrored().key_file).parent_path().parent_path();
    const auto perms = std::filesystem::status(private_dir).permissions();
    EXPECT_EQ(perms & std::filesystem::perms::all, std::filesystem::perms::owner_all);
    EXPECT_EQ(std::filesystem::status((*mirror)->mirrored().key_file).permissions() &
                  std::filesystem::perms::all,
              std::filesystem::perms::owner_read | std::filesystem::perms::owner_write);
  }
  EXPECT_FALSE(std::filesystem::exists(private_dir));
}

TEST_F(TlsMirrorTest, AMismatchedPairStopsTheStart) {
  Copy(Cert("ops.key"), Conf("key.pem"));
  auto mirror = TlsMirror::Start(files_, dir_ + "/run");
  EXPECT_EQ(mirror.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(mirror.status().message(), HasSubstr("is not the key of the certificate in"));
  files_.key_file = Conf("missing.pem");
  EXPECT_EQ(TlsMirror::Start(files_, dir_ + "/run").status().code(), absl::StatusCode::kNotFound);
}

}  // namespace
}  // namespace kvcache
