#include "server/security/principals_file.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <string>

#include "absl/strings/escaping.h"

namespace kvcache {
namespace {

using ::testing::HasSubstr;

constexpr char kGood[] = R"({"principals": [
  {"name": "acme-worker", "tenant": "acme", "role": "worker", "token": "acme-token-0123456789"},
  {"name": "globex", "tenant": "globex", "role": "worker",
   "token_sha256": "SHA"},
  {"name": "ops", "role": "admin", "certificate": "ops.example.com"},
  {"name": "monitor", "tenant": "acme", "role": "reader", "unix_uid": 1234}
]})";

std::string Good() {
  std::string text = kGood;
  const std::string digest = absl::BytesToHexString(Sha256("globex-token-0123456789"));
  text.replace(text.find("SHA"), 3, digest);
  return text;
}

TEST(Sha256Test, MatchesTheStandardVector) {
  EXPECT_EQ(absl::BytesToHexString(Sha256("abc")),
            "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
}

TEST(PrincipalsFileTest, IndexesEachPrincipalByItsCredential) {
  absl::StatusOr<PrincipalTable> table = ParsePrincipals(Good());
  ASSERT_TRUE(table.ok()) << table.status();
  EXPECT_EQ(table->size(), 4u);

  const Principal* acme = table->FindToken("acme-token-0123456789");
  ASSERT_NE(acme, nullptr);
  EXPECT_EQ(acme->name, "acme-worker");
  EXPECT_EQ(acme->tenant, "acme");
  EXPECT_EQ(acme->role, Role::kWorker);
  EXPECT_EQ(acme->authenticated_by, AuthMethod::kToken);

  const Principal* globex = table->FindToken("globex-token-0123456789");
  ASSERT_NE(globex, nullptr);
  EXPECT_EQ(globex->tenant, "globex");

  const Principal* ops = table->FindCertificate("ops.example.com");
  ASSERT_NE(ops, nullptr);
  EXPECT_EQ(ops->role, Role::kAdmin);
  EXPECT_EQ(ops->tenant, kAllNamespaces);
  EXPECT_EQ(ops->authenticated_by, AuthMethod::kCertificate);

  const Principal* monitor = table->FindUid(1234);
  ASSERT_NE(monitor, nullptr);
  EXPECT_EQ(monitor->role, Role::kReader);
  EXPECT_EQ(monitor->authenticated_by, AuthMethod::kUnixUid);

  EXPECT_EQ(table->FindToken("acme-token-012345678"), nullptr);  // one character short
  EXPECT_EQ(table->FindToken(""), nullptr);
  EXPECT_EQ(table->FindCertificate("OPS.example.com"), nullptr);
  EXPECT_EQ(table->FindUid(0), nullptr);
}

TEST(PrincipalsFileTest, RefusesMalformedFilesNamingThePrincipal) {
  struct Case {
    std::string json;
    std::string error;
  };
  const Case cases[] = {
      {"", "not valid JSON"},
      {"[]", "must be a JSON object"},
      {R"({"principal": []})", "unknown field \"principal\""},
      {R"({"principals": [{"role": "admin", "token": "0123456789abcdef"}]})", "needs a \"name\""},
      {R"({"principals": [{"name": "a", "token": "0123456789abcdef"}]})", "needs a \"role\""},
      {R"({"principals": [{"name": "a", "role": "root", "token": "0123456789abcdef"}]})",
       "reader, worker or admin"},
      {R"({"principals": [{"name": "a", "role": "admin"}]})", "exactly one of"},
      {R"({"principals": [{"name": "a", "role": "admin", "token": "0123456789abcdef",
           "unix_uid": 5}]})",
       "exactly one of"},
      {R"({"principals": [{"name": "a", "role": "admin", "token": "short"}]})",
       "at least 16 characters"},
      {R"({"principals": [{"name": "a", "role": "admin", "token_sha256": "abc"}]})",
       "64 lower-case hex"},
      {R"({"principals": [{"name": "a", "role": "worker", "token": "0123456789abcdef"}]})",
       "principal \"a\": a worker or reader needs a \"tenant\""},
      {R"({"principals": [{"name": "a", "tenant": "bad tenant!", "role": "worker",
           "token": "0123456789abcdef"}]})",
       "principal \"a\""},
      {R"({"principals": [{"name": "a", "role": "admin", "unix_uid": -1}]})", "must be a uid"},
      {R"({"principals": [{"name": "a", "role": "admin", "tokn": "0123456789abcdef"}]})",
       "unknown field \"tokn\""},
      {R"({"principals": [{"name": "a", "role": "admin", "unix_uid": 1},
                          {"name": "a", "role": "admin", "unix_uid": 2}]})",
       "the name is used twice"},
      {R"({"principals": [{"name": "a", "role": "admin", "certificate": "x"},
                          {"name": "b", "role": "reader", "tenant": "t", "certificate": "x"}]})",
       "principal \"b\": its credential is already another principal's"},
  };
  for (const Case& c : cases) {
    absl::StatusOr<PrincipalTable> table = ParsePrincipals(c.json);
    ASSERT_FALSE(table.ok()) << c.json;
    EXPECT_EQ(table.status().code(), absl::StatusCode::kInvalidArgument) << c.json;
    EXPECT_THAT(table.status().message(), HasSubstr(c.error)) << c.json;
  }
}

TEST(PrincipalsFileTest, AMissingFileIsNotFound) {
  absl::StatusOr<PrincipalTable> table = LoadPrincipalsFile("no-such-dir/principals.json");
  EXPECT_EQ(table.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(table.status().message(), HasSubstr("no-such-dir/principals.json"));
}

}  // namespace
}  // namespace kvcache
