#include "server/security/access_control.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstdio>
#include <fstream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "kvcache/v1/admin.pb.h"
#include "kvcache/v1/kvcache.pb.h"
#include "kvcache/v1/shm.pb.h"
#include "server/security/access_policy.h"

namespace kvcache {
namespace {

using ::testing::HasSubstr;

class FakeClock final : public Clock {
 public:
  absl::Time Now() const override { return now; }
  absl::Time now = absl::FromUnixSeconds(1000);
};

constexpr char kAcmeToken[] = "acme-token-0123456789";
constexpr char kGlobexToken[] = "globex-token-0123456789";
constexpr char kReaderToken[] = "reader-token-0123456789";
constexpr char kAdminToken[] = "admin-token-0123456789";

constexpr char kPrincipals[] = R"({"principals": [
  {"name": "acme-worker", "tenant": "acme", "role": "worker", "token": "acme-token-0123456789"},
  {"name": "globex-worker", "tenant": "globex", "role": "worker",
   "token": "globex-token-0123456789"},
  {"name": "monitor", "tenant": "acme", "role": "reader", "token": "reader-token-0123456789"},
  {"name": "root", "role": "admin", "token": "admin-token-0123456789"},
  {"name": "ops", "role": "admin", "certificate": "ops.example.com"},
  {"name": "local", "tenant": "acme", "role": "worker", "unix_uid": 4242},
  {"name": "acme-admin", "tenant": "acme", "role": "admin", "token": "acme-admin-0123456789"}
]})";

Credentials Token(std::string token) { return {.bearer_token = std::move(token)}; }

class AccessControlTest : public ::testing::Test {
 protected:
  void SetUp() override {
    path_ = ::testing::TempDir() + "principals-" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name() + ".json";
    Write(kPrincipals);
  }
  void TearDown() override { std::remove(path_.c_str()); }

  void Write(std::string_view text) { std::ofstream(path_, std::ios::trunc) << text; }

  std::unique_ptr<AccessControl> Make(AccessControlOptions options = {}) {
    options.principals_file = path_;
    if (options.shared_namespaces.empty()) options.shared_namespaces = {"shared"};
    options.clock = &clock_;
    absl::StatusOr<std::unique_ptr<AccessControl>> access = AccessControl::Create(options);
    EXPECT_TRUE(access.ok()) << access.status();
    return access.ok() ? *std::move(access) : nullptr;
  }

  FakeClock clock_;
  std::string path_;
};

TEST_F(AccessControlTest, WithoutAPrincipalsFileEveryCallerIsAnAnonymousAdmin) {
  auto access = AccessControl::Create({});
  ASSERT_TRUE(access.ok());
  EXPECT_FALSE((*access)->enabled());
  absl::StatusOr<Caller> caller = (*access)->Admit({}, "DumpMemory");
  ASSERT_TRUE(caller.ok());
  EXPECT_EQ(caller->principal().name, "anonymous");
  EXPECT_EQ(caller->principal().authenticated_by, AuthMethod::kNone);
  EXPECT_TRUE(caller->every_namespace());
  EXPECT_EQ(caller->NamespaceOf("anything").value(), "anything");
  EXPECT_EQ(caller->NamespaceOf("").value(), "");
}

TEST_F(AccessControlTest, ABrokenFileStopsTheStart) {
  Write("{");
  absl::StatusOr<std::unique_ptr<AccessControl>> access =
      AccessControl::Create({.principals_file = path_});
  EXPECT_EQ(access.status().code(), absl::StatusCode::kInvalidArgument);
}

TEST_F(AccessControlTest, NoOrWrongCredentialsAreUnauthenticated) {
  auto access = Make();
  EXPECT_EQ(access->principals(), 7u);
  const Credentials refused[] = {
      {},
      Token("acme-token-012345678"),
      Token(""),
      {.malformed_authorization = true},
      {.certificate_identities = {"someone.example.com"}},
      {.unix_uid = 1},
      // A wrong token is not excused by a good certificate.
      {.bearer_token = "wrong-token-0123456789", .certificate_identities = {"ops.example.com"}},
  };
  for (const Credentials& c : refused) {
    for (std::string_view method : {"Lookup", "GetServerInfo", "WhoAmI", "DumpMemory"}) {
      absl::StatusOr<Caller> caller = access->Admit(c, method);
      EXPECT_EQ(caller.status().code(), absl::StatusCode::kUnauthenticated) << method;
    }
  }
}

TEST_F(AccessControlTest, EachCredentialNamesItsPrincipal) {
  auto access = Make();
  absl::StatusOr<Caller> acme = access->Admit(Token(kAcmeToken), "Lookup");
  ASSERT_TRUE(acme.ok()) << acme.status();
  EXPECT_EQ(acme->principal().name, "acme-worker");
  absl::StatusOr<Caller> ops = access->Admit(
      {.certificate_identities = {"other.example.com", "ops.example.com"}}, "DumpMemory");
  ASSERT_TRUE(ops.ok()) << ops.status();
  EXPECT_EQ(ops->principal().name, "ops");
  EXPECT_EQ(ops->principal().authenticated_by, AuthMethod::kCertificate);
  absl::StatusOr<Caller> local = access->Admit({.unix_uid = 4242}, "ShmFetchInto");
  ASSERT_TRUE(local.ok()) << local.status();
  EXPECT_EQ(local->principal().name, "local");
}

TEST_F(AccessControlTest, RolesDecideWhichMethodsACallerMayCall) {
  auto access = Make();
  for (std::string_view method : {"WhoAmI", "GetServerInfo", "GetStats", "ListModels"}) {
    EXPECT_TRUE(access->Admit(Token(kReaderToken), method).ok()) << method;
    EXPECT_TRUE(access->Admit(Token(kAcmeToken), method).ok()) << method;
  }
  for (std::string_view method : {"Lookup", "Append", "Fetch", "Evict", "ReleaseLease",
                                  "ReportAttention", "RegisterModel", "ShmFetchInto"}) {
    absl::StatusOr<Caller> reader = access->Admit(Token(kReaderToken), method);
    EXPECT_EQ(reader.status().code(), absl::StatusCode::kPermissionDenied) << method;
    EXPECT_THAT(reader.status().message(), HasSubstr("monitor (role reader) may not call"));
    EXPECT_TRUE(access->Admit(Token(kAcmeToken), method).ok()) << method;
    EXPECT_TRUE(access->Admit(Token(kAdminToken), method).ok()) << method;
  }
  for (std::string_view method :
       {"DumpMemory", "VerifyBlocks", "SetLogLevel", "UnregisterModel", "UpdateModelPolicy",
        "Checkpoint", "InspectSequence", "GetDeviceArenas", "PlaceOnDevice", "NoSuchMethod"}) {
    EXPECT_EQ(access->Admit(Token(kAcmeToken), method).status().code(),
              absl::StatusCode::kPermissionDenied)
        << method;
    EXPECT_TRUE(access->Admit(Token(kAdminToken), method).ok()) << method;
  }
}

TEST_F(AccessControlTest, AnAdminOfOneTenantAdministersItsNamespacesButNotTheDaemon) {
  auto access = Make();
  const Credentials acme_admin = Token("acme-admin-0123456789");
  for (std::string_view method : {"UpdateModelPolicy", "UnregisterModel", "InspectSequence",
                                  "VerifyBlocks", "Lookup", "GetStats"}) {
    absl::StatusOr<Caller> caller = access->Admit(acme_admin, method);
    ASSERT_TRUE(caller.ok()) << method << ": " << caller.status();
    EXPECT_EQ(caller->NamespaceOf("").value(), "acme");
    EXPECT_EQ(caller->NamespaceOf("globex").status().code(), absl::StatusCode::kPermissionDenied);
  }
  for (std::string_view method :
       {"DumpMemory", "SetLogLevel", "Checkpoint", "ListCheckpoints", "VerifyCheckpoint",
        "GetDeviceArenas", "PlaceOnDevice", "NoSuchMethod"}) {
    absl::StatusOr<Caller> caller = access->Admit(acme_admin, method);
    EXPECT_EQ(caller.status().code(), absl::StatusCode::kPermissionDenied) << method;
    EXPECT_THAT(caller.status().message(), HasSubstr("acts on the whole daemon")) << method;
    EXPECT_TRUE(access->Admit(Token(kAdminToken), method).ok()) << method;
  }
}

TEST_F(AccessControlTest, AWorkerUsesItsTenantAndTheSharedNamespacesOnly) {
  auto access = Make();
  Caller acme = access->Admit(Token(kAcmeToken), "Lookup").value();
  EXPECT_FALSE(acme.every_namespace());
  EXPECT_EQ(acme.NamespaceOf("").value(), "acme");
  EXPECT_EQ(acme.NamespaceOf("acme").value(), "acme");
  EXPECT_EQ(acme.NamespaceOf("shared").value(), "shared");
  for (std::string_view other : {"globex", "default", "*", "acme2", "ACME"}) {
    absl::StatusOr<std::string> ns = acme.NamespaceOf(other);
    EXPECT_EQ(ns.status().code(), absl::StatusCode::kPermissionDenied) << other;
  }
  EXPECT_TRUE(acme.MaySee("acme"));
  EXPECT_TRUE(acme.MaySee("shared"));
  EXPECT_FALSE(acme.MaySee("globex"));

  Caller root = access->Admit(Token(kAdminToken), "Lookup").value();
  EXPECT_TRUE(root.every_namespace());
  EXPECT_EQ(root.NamespaceOf("globex").value(), "globex");
  EXPECT_TRUE(root.MaySee("globex"));
}

TEST_F(AccessControlTest, ReloadSwapsThePrincipalsAndABadFileKeepsTheOld) {
  auto access = Make();
  EXPECT_TRUE(access->Admit(Token(kGlobexToken), "Lookup").ok());
  Write(R"({"principals": [{"name": "new", "tenant": "n", "role": "worker",
                            "token": "new-token-0123456789"}]})");
  ASSERT_TRUE(access->Reload().ok());
  EXPECT_EQ(access->Admit(Token(kGlobexToken), "Lookup").status().code(),
            absl::StatusCode::kUnauthenticated);
  EXPECT_TRUE(access->Admit(Token("new-token-0123456789"), "Lookup").ok());

  Write("{\"principals\": [{\"name\": ");
  EXPECT_EQ(access->Reload().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(access->Admit(Token("new-token-0123456789"), "Lookup").ok());
  EXPECT_EQ(access->principals(), 1u);
}

TEST_F(AccessControlTest, ASessionKeepsItsPrincipalUntilAReload) {
  auto access = Make();
  SessionPrincipal session;
  absl::StatusOr<Caller> caller = access->AdmitSession(Token(kGlobexToken), "ShmLookup", &session);
  ASSERT_TRUE(caller.ok()) << caller.status();
  EXPECT_EQ(caller->principal().name, "globex-worker");
  ASSERT_TRUE(session.principal.has_value());
  // Roles are still checked per call.
  EXPECT_EQ(access->AdmitSession(Token(kGlobexToken), "DumpMemory", &session).status().code(),
            absl::StatusCode::kPermissionDenied);
  // A reload that drops the principal refuses the session's next call.
  Write(R"({"principals": [{"name": "new", "tenant": "n", "role": "worker",
                            "token": "new-token-0123456789"}]})");
  ASSERT_TRUE(access->Reload().ok());
  EXPECT_EQ(access->AdmitSession(Token(kGlobexToken), "ShmLookup", &session).status().code(),
            absl::StatusCode::kUnauthenticated);
  EXPECT_FALSE(session.principal.has_value());
  // A reload that fails keeps what the session had.
  SessionPrincipal fresh;
  ASSERT_TRUE(access->AdmitSession(Token("new-token-0123456789"), "ShmLookup", &fresh).ok());
  Write("{");
  EXPECT_FALSE(access->Reload().ok());
  EXPECT_TRUE(access->AdmitSession(Token("new-token-0123456789"), "ShmLookup", &fresh).ok());
}

TEST_F(AccessControlTest, ATenantPastItsRequestRateIsRefusedAndOthersAreNot) {
  auto access = Make({.max_requests_per_second = 5});
  for (int i = 0; i < 5; ++i) ASSERT_TRUE(access->Admit(Token(kAcmeToken), "Lookup").ok()) << i;
  absl::StatusOr<Caller> over = access->Admit(Token(kAcmeToken), "Fetch");
  EXPECT_EQ(over.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(over.status().message(), HasSubstr("tenant \"acme\""));
  // Another tenant, an admin and calls that read no KV are not charged.
  EXPECT_TRUE(access->Admit(Token(kGlobexToken), "Lookup").ok());
  EXPECT_TRUE(access->Admit(Token(kAdminToken), "Lookup").ok());
  EXPECT_TRUE(access->Admit(Token(kAcmeToken), "GetStats").ok());
  // The bucket refills at the rate.
  clock_.now += absl::Milliseconds(400);
  EXPECT_TRUE(access->Admit(Token(kAcmeToken), "Lookup").ok());
  EXPECT_TRUE(access->Admit(Token(kAcmeToken), "Lookup").ok());
  EXPECT_EQ(access->Admit(Token(kAcmeToken), "Lookup").status().code(),
            absl::StatusCode::kResourceExhausted);
}

TEST_F(AccessControlTest, ATenantsOpenStreamsAreCappedAndGivenBack) {
  auto access = Make({.max_concurrent_streams = 2});
  Caller acme = access->Admit(Token(kAcmeToken), "Append").value();
  Caller globex = access->Admit(Token(kGlobexToken), "Append").value();
  absl::StatusOr<TenantStreamSlot> a = access->OpenStream(acme);
  absl::StatusOr<TenantStreamSlot> b = access->OpenStream(acme);
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_EQ(access->OpenStream(acme).status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_TRUE(access->OpenStream(globex).ok());
  { TenantStreamSlot released = *std::move(a); }
  EXPECT_TRUE(access->OpenStream(acme).ok());
}

TEST_F(AccessControlTest, ATenantsShareOfUnaryCallsAndShmConnectionsIsCappedAndGivenBack) {
  auto access =
      Make({.max_share = 0.5, .daemon_max_concurrent_unary = 4, .daemon_max_shm_connections = 3});
  Caller acme = access->Admit(Token(kAcmeToken), "Lookup").value();
  Caller globex = access->Admit(Token(kGlobexToken), "Lookup").value();
  std::vector<TenantStreamSlot> held;
  for (int i = 0; i < 2; ++i) held.push_back(access->OpenUnaryCall(acme).value());
  absl::StatusOr<TenantStreamSlot> third = access->OpenUnaryCall(acme);
  EXPECT_EQ(third.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(third.status().message(),
              HasSubstr("tenant \"acme\" has 2 unary calls in flight, its share 2 "
                        "(limits.max_concurrent_unary 4 x security.tenant_limits.max_share 0.5)"));
  // Another tenant, and the tenant's other budgets, are not held back.
  EXPECT_TRUE(access->OpenUnaryCall(globex).ok());
  held.push_back(access->OpenShmConnection(acme).value());
  absl::StatusOr<TenantStreamSlot> connection = access->OpenShmConnection(acme);
  EXPECT_EQ(connection.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(connection.status().message(),
              HasSubstr("its share 1 (shm.max_connections 3 x security.tenant_limits.max_share"));
  EXPECT_TRUE(access->OpenShmConnection(globex).ok());
  held.clear();
  EXPECT_TRUE(access->OpenUnaryCall(acme).ok());
  EXPECT_TRUE(access->OpenShmConnection(acme).ok());
}

TEST_F(AccessControlTest, AdminsAndAShareOfOneAreNotLimited) {
  auto whole = Make({.daemon_max_concurrent_unary = 1, .daemon_max_shm_connections = 1});
  Caller acme = whole->Admit(Token(kAcmeToken), "Lookup").value();
  std::vector<TenantStreamSlot> held;
  for (int i = 0; i < 3; ++i) held.push_back(whole->OpenUnaryCall(acme).value());
  auto half = Make({.max_share = 0.5, .daemon_max_concurrent_unary = 1});
  Caller admin = half->Admit(Token(kAdminToken), "Lookup").value();
  for (int i = 0; i < 3; ++i) held.push_back(half->OpenUnaryCall(admin).value());
}

// Every RPC of both services and every shared-memory operation is in the
// policy table, so none is admin-only by accident.
TEST(AccessPolicyTest, ListsEveryMethodOfEveryFrontDoor) {
  for (const google::protobuf::ServiceDescriptor* service :
       {v1::LookupRequest::descriptor()->file()->FindServiceByName("Cache"),
        v1::GetStatsRequest::descriptor()->file()->FindServiceByName("Admin")}) {
    ASSERT_NE(service, nullptr);
    for (int i = 0; i < service->method_count(); ++i) {
      EXPECT_TRUE(AccessOf(service->method(i)->name()).has_value()) << service->method(i)->name();
    }
  }
  const google::protobuf::OneofDescriptor* ops =
      v1::ShmRequest::descriptor()->FindOneofByName("op");
  ASSERT_NE(ops, nullptr);
  for (int i = 0; i < ops->field_count(); ++i) {
    const std::string name = absl::StrCat("Shm", ops->field(i)->camelcase_name());
    std::string method = name;
    method[3] = static_cast<char>(std::toupper(method[3]));
    EXPECT_TRUE(AccessOf(method).has_value()) << method;
  }
  EXPECT_FALSE(AccessOf("NoSuchMethod").has_value());
}

}  // namespace
}  // namespace kvcache
