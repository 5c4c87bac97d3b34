// Authentication and tenancy against the real daemon, through the C++
// client and kvcachectl: bearer tokens on gRPC and in the shared-memory
// hello, the peer's uid on the shared-memory socket, tenants that cannot see
// or touch each other's KV, shared namespaces, roles, and SIGHUP reloading
// the principals. (tests/python/security_test.py checks the same contract
// with an independent client, plus TLS.)
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>

#include "absl/strings/str_cat.h"
#include "tests/integration/daemon_process.h"
#include "tests/integration/kv_pattern.h"

namespace kvcache::testing {
namespace {

using ::testing::HasSubstr;

constexpr char kAcme[] = "acme-token-0123456789abcdef";
constexpr char kGlobex[] = "globex-token-0123456789abcdef";
constexpr char kReader[] = "reader-token-0123456789abcdef";
constexpr char kAdmin[] = "admin-token-0123456789abcdef";
constexpr uint32_t kBlockTokens = 16;

std::string Principals(bool with_globex) {
  std::string p = absl::StrCat(R"({"principals": [
    {"name": "acme-worker", "tenant": "acme", "role": "worker", "token": ")",
                               kAcme, R"("},
    {"name": "monitor", "tenant": "acme", "role": "reader", "token": ")",
                               kReader, R"("},
    {"name": "root", "role": "admin", "token": ")",
                               kAdmin, R"("},
    {"name": "local", "tenant": "acme", "role": "worker", "unix_uid": )",
                               ::getuid(), "}");
  if (with_globex) {
    absl::StrAppend(&p, R"(, {"name": "globex-worker", "tenant": "globex", "role": "worker",
      "token": ")",
                    kGlobex, R"("})");
  }
  return p + "]}";
}

class TenancyTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = ::testing::TempDir() + "tenancy-" + std::to_string(::getpid());
    std::filesystem::create_directories(dir_);
    principals_ = dir_ + "/principals.json";
    std::ofstream(principals_) << Principals(true);
    const std::string config = dir_ + "/config.json";
    // Each namespace may cache 16 of the tests' 4 KiB blocks.
    std::ofstream(config) << R"({"security": {"shared_namespaces": ["shared"],
                                              "tenant_limits": {"max_cached_bytes": 65536}}})";
    auto d =
        DaemonProcess::Start({.tcp = true,
                              .metrics = true,
                              .extra_flags = {"--config", config, "--principals-file", principals_},
                              .token = kAdmin});
    ASSERT_TRUE(d.ok()) << d.status();
    daemon_ = *std::move(d);
    layout_ = MakeLayout(2, 2, 16, v1::DTYPE_FP16, kBlockTokens);
  }

  std::unique_ptr<Client> As(const std::string& token, const std::string& ns = "",
                             DataPath path = DataPath::kGrpc) {
    auto c = daemon_->NewClient(ns, path, token);
    EXPECT_NE(c, nullptr);
    return c;
  }

  // Registers "m" and appends `blocks` blocks of `tokens` as `client`.
  uint64_t Store(Client& client, std::span<const uint32_t> tokens) {
    auto reg = client.RegisterModel("m", layout_);
    EXPECT_TRUE(reg.ok()) << reg.status();
    if (!reg.ok()) return 0;
    const size_t blocks = tokens.size() / kBlockTokens;
    auto kv = MakeKv(tokens, kBlockTokens, reg->block_bytes(), 0, blocks);
    auto appended = client.Append("m", tokens, kv);
    EXPECT_TRUE(appended.ok()) << appended.status();
    return reg->block_bytes();
  }

  std::unique_ptr<DaemonProcess> daemon_;
  std::string dir_;
  std::string principals_;
  v1::ModelLayout layout_;
};

TEST_F(TenancyTest, EveryCredentialNamesItsPrincipal) {
  auto who = As(kAcme)->WhoAmI();
  ASSERT_TRUE(who.ok()) << who.status();
  EXPECT_EQ(who->principal(), "acme-worker");
  EXPECT_EQ(who->tenant(), "acme");
  EXPECT_EQ(who->role(), "worker");
  EXPECT_EQ(who->authenticated_by(), "token");
  EXPECT_THAT(who->shared_namespaces(), ::testing::ElementsAre("shared"));
  who = As(kAdmin)->WhoAmI();
  ASSERT_TRUE(who.ok()) << who.status();
  EXPECT_EQ(who->tenant(), "*");

  // No token on the Unix socket: the peer's uid names the principal.
  who = As("")->WhoAmI();
  ASSERT_TRUE(who.ok()) << who.status();
  EXPECT_EQ(who->principal(), "local");
  EXPECT_EQ(who->authenticated_by(), "unix_uid");

  // No token over TCP, or a wrong token anywhere (a known uid does not excuse it).
  ClientOptions tcp{.target = daemon_->tcp_target(), .data_path = DataPath::kGrpc};
  auto over_tcp = Client::Connect(tcp);
  ASSERT_TRUE(over_tcp.ok());
  std::vector<std::unique_ptr<Client>> refused;
  refused.push_back(*std::move(over_tcp));
  refused.push_back(As("wrong-token-0123456789"));
  for (const std::unique_ptr<Client>& anonymous : refused) {
    EXPECT_EQ(anonymous->WhoAmI().status().code(), absl::StatusCode::kUnauthenticated);
    EXPECT_EQ(anonymous->GetServerInfo().status().code(), absl::StatusCode::kUnauthenticated);
    EXPECT_EQ(anonymous->RegisterModel("m", layout_).status().code(),
              absl::StatusCode::kUnauthenticated);
  }
  auto list = As(kAdmin)->ListModels();
  ASSERT_TRUE(list.ok());
  EXPECT_EQ(list->models_size(), 0) << "a refused RegisterModel registered a model";
}

TEST_F(TenancyTest, TenantsNeitherSeeNorTouchEachOthersKv) {
  auto acme = As(kAcme);
  auto globex = As(kGlobex);
  const std::vector<uint32_t> prompt = MakeTokens(7, 8 * kBlockTokens);
  const uint64_t block_bytes = Store(*acme, prompt);
  ASSERT_GT(block_bytes, 0u);
  auto lease = acme->Lookup("m", prompt, {.acquire_lease = true});
  ASSERT_TRUE(lease.ok()) << lease.status();
  ASSERT_EQ(lease->matched_tokens, prompt.size());

  // globex's own "m" is another model in another namespace: a miss.
  ASSERT_TRUE(globex->RegisterModel("m", layout_).ok());
  auto miss = globex->Lookup("m", prompt);
  ASSERT_TRUE(miss.ok()) << miss.status();
  EXPECT_EQ(miss->matched_tokens, 0u);
  // Naming acme's namespace is refused, whatever the call.
  auto intruder = As(kGlobex, "acme");
  EXPECT_EQ(intruder->Lookup("m", prompt).status().code(), absl::StatusCode::kPermissionDenied);
  std::vector<std::byte> out(8 * block_bytes);
  EXPECT_EQ(intruder->Fetch("m", prompt, out).status().code(), absl::StatusCode::kPermissionDenied);
  EXPECT_EQ(intruder->EvictModel("m").status().code(), absl::StatusCode::kPermissionDenied);
  EXPECT_EQ(intruder->RegisterModel("m2", layout_).status().code(),
            absl::StatusCode::kPermissionDenied);
  // Another tenant's lease reads as unknown and stays the owner's.
  auto released = globex->ReleaseLease(lease->lease_id);
  ASSERT_TRUE(released.ok()) << released.status();
  EXPECT_FALSE(*released);
  auto fetched = acme->FetchLease("m", lease->lease_id, out);
  ASSERT_TRUE(fetched.ok()) << fetched.status();
  EXPECT_EQ(fetched->matched_tokens, prompt.size());

  // acme's KV is intact, byte for byte; listings show each tenant its own.
  EXPECT_EQ(FetchVerified(*acme, "m", prompt, kBlockTokens, block_bytes, 8, "acme"), 8u);
  auto listed = globex->ListModels();
  ASSERT_TRUE(listed.ok());
  ASSERT_EQ(listed->models_size(), 1);
  EXPECT_EQ(listed->models(0).namespace_(), "globex");
  auto stats = globex->GetStats();
  ASSERT_TRUE(stats.ok());
  for (const v1::ModelStats& m : stats->models()) EXPECT_EQ(m.namespace_(), "globex");
  auto all = As(kAdmin)->ListModels();
  ASSERT_TRUE(all.ok());
  EXPECT_EQ(all->models_size(), 2);
}

// An HTTP GET of the status port as `token` (none when empty): the status
// code, and the body in `body`.
int GetStatus(const DaemonProcess& daemon, const std::string& target, const std::string& token,
              std::string* body = nullptr) {
  const std::string file = ::testing::TempDir() + "status-body-" + std::to_string(::getpid());
  const std::string auth =
      token.empty() ? "" : absl::StrCat("-H 'Authorization: Bearer ", token, "' ");
  CommandResult r =
      RunCommand(absl::StrCat("curl -s -o ", file, " -w '%{http_code}' ", auth,
                              "'http://127.0.0.1:", daemon.metrics_port(), target, "'"));
  if (body != nullptr) {
    std::ifstream in(file);
    body->assign(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
  }
  std::filesystem::remove(file);
  return r.exit_code == 0 ? std::atoi(r.output.c_str()) : -1;
}

TEST_F(TenancyTest, TheStatusPageShowsTenantsDetailToAdminsOnly) {
  // acme caches a prompt; its first block's key is what an attacker would
  // probe /status/attention with.
  auto acme = As(kAcme);
  const std::vector<uint32_t> prompt = MakeTokens(11, 4 * kBlockTokens);
  ASSERT_GT(Store(*acme, prompt), 0u);
  auto looked = acme->Lookup("m", prompt);
  ASSERT_TRUE(looked.ok()) << looked.status();
  ASSERT_EQ(looked->blocks.size(), 4u);
  char hex[17];
  std::snprintf(hex, sizeof(hex), "%016llx",
                static_cast<unsigned long long>(looked->blocks[0].key()));
  const std::string cached = absl::StrCat("/status/attention?ns=acme&model=m&key=", hex);
  const std::string random = "/status/attention?ns=acme&model=m&key=0123456789abcdef";

  // Without a token, with a wrong one, or as a worker or a tenant's reader:
  // the same 401 whether or not the sequence is cached, and /status without
  // models, prefixes or keys.
  for (const std::string token : {"", "wrong-token-0123456789", kAcme, kReader}) {
    EXPECT_EQ(GetStatus(*daemon_, cached, token), 401) << token;
    EXPECT_EQ(GetStatus(*daemon_, random, token), 401) << token;
    std::string page;
    ASSERT_EQ(GetStatus(*daemon_, "/status", token, &page), 200) << token;
    EXPECT_THAT(page, HasSubstr("id=\"tenant-detail\""));
    EXPECT_THAT(page, HasSubstr("id=\"tiers\""));
    EXPECT_THAT(page, ::testing::Not(HasSubstr("id=\"top-prefixes\"")));
    EXPECT_THAT(page, ::testing::Not(HasSubstr("id=\"models\"")));
    EXPECT_THAT(page, ::testing::Not(HasSubstr(hex)));
    EXPECT_THAT(page, ::testing::Not(HasSubstr("acme")));
  }

  // The admin of every namespace sees it all.
  std::string page;
  ASSERT_EQ(GetStatus(*daemon_, "/status", kAdmin, &page), 200);
  EXPECT_THAT(page, HasSubstr("id=\"top-prefixes\""));
  EXPECT_THAT(page, HasSubstr(hex));
  EXPECT_EQ(GetStatus(*daemon_, cached, kAdmin), 200);
  EXPECT_EQ(GetStatus(*daemon_, random, kAdmin), 404);
}

TEST_F(TenancyTest, ASharedNamespaceServesEveryTenant) {
  auto acme = As(kAcme, "shared");
  auto globex = As(kGlobex, "shared");
  const std::vector<uint32_t> system_prompt = MakeTokens(11, 4 * kBlockTokens);
  const uint64_t block_bytes = Store(*acme, system_prompt);
  ASSERT_GT(block_bytes, 0u);
  ASSERT_TRUE(globex->RegisterModel("m", layout_).ok());
  EXPECT_EQ(FetchVerified(*globex, "m", system_prompt, kBlockTokens, block_bytes, 4, "shared"), 4u);
}

TEST_F(TenancyTest, RolesLimitWhatACallerMayCall) {
  auto reader = As(kReader);
  EXPECT_TRUE(reader->GetStats().ok());
  EXPECT_EQ(reader->RegisterModel("m", layout_).status().code(),
            absl::StatusCode::kPermissionDenied);
  EXPECT_EQ(reader->Lookup("m", MakeTokens(1, kBlockTokens)).status().code(),
            absl::StatusCode::kPermissionDenied);
  auto worker = As(kAcme);
  auto dump = worker->DumpMemory();
  EXPECT_EQ(dump.status().code(), absl::StatusCode::kPermissionDenied);
  EXPECT_THAT(dump.status().message(), HasSubstr("acme-worker (role worker) may not call"));
  EXPECT_EQ(worker->SetLogLevel("debug").status().code(), absl::StatusCode::kPermissionDenied);
  EXPECT_TRUE(As(kAdmin)->DumpMemory().ok());
}

TEST_F(TenancyTest, TheSharedMemoryPlaneActsAsTheHelloTokenOrThePeersUid) {
  const std::vector<uint32_t> prompt = MakeTokens(21, 4 * kBlockTokens);
  const uint64_t block_bytes = Store(*As(kAcme), prompt);
  ASSERT_GT(block_bytes, 0u);
  const std::string shm_socket = daemon_->socket_path() + ".shm";

  // No token: the session is the principal of this test's uid ("local", of
  // acme), read on the shared-memory socket (named here, so the gRPC socket is
  // not asked for it).
  ClientOptions by_uid{.target = daemon_->unix_target(),
                       .data_path = DataPath::kSharedMemory,
                       .shm_socket = shm_socket};
  auto local = Client::Connect(by_uid);
  ASSERT_TRUE(local.ok()) << local.status();
  ASSERT_TRUE((*local)->UsesSharedMemory());
  auto hit = (*local)->Lookup("m", prompt);
  ASSERT_TRUE(hit.ok()) << hit.status();
  EXPECT_EQ(hit->matched_tokens, prompt.size());

  // A hello token stands for the session instead.
  auto acme = As(kAcme, "", DataPath::kSharedMemory);
  ASSERT_TRUE(acme->UsesSharedMemory());
  EXPECT_EQ(FetchVerified(*acme, "m", prompt, kBlockTokens, block_bytes, 4, "shm"), 4u);
  auto globex = As(kGlobex, "", DataPath::kSharedMemory);
  ASSERT_TRUE(globex->UsesSharedMemory());
  ASSERT_TRUE(globex->RegisterModel("m", layout_).ok());
  auto miss = globex->Lookup("m", prompt);
  ASSERT_TRUE(miss.ok()) << miss.status();
  EXPECT_EQ(miss->matched_tokens, 0u);
  auto intruder = As(kGlobex, "acme", DataPath::kSharedMemory);
  EXPECT_EQ(intruder->Lookup("m", prompt).status().code(), absl::StatusCode::kPermissionDenied);

  // A wrong token is not excused by a known uid.
  ClientOptions wrong = by_uid;
  wrong.token = "wrong-token-0123456789";
  auto impostor = Client::Connect(wrong);
  ASSERT_TRUE(impostor.ok()) << impostor.status();
  EXPECT_EQ((*impostor)->Lookup("m", prompt).status().code(), absl::StatusCode::kUnauthenticated);
}

TEST_F(TenancyTest, ATenantPastItsQuotaEvictsItsOwnBlocksOnly) {
  auto acme = As(kAcme);
  auto globex = As(kGlobex);
  const std::vector<uint32_t> theirs = MakeTokens(31, 12 * kBlockTokens);
  const uint64_t block_bytes = Store(*globex, theirs);
  ASSERT_EQ(block_bytes, 4096u);
  ASSERT_TRUE(acme->RegisterModel("m", layout_).ok());
  for (uint64_t seed = 40; seed < 44; ++seed) {  // 32 blocks into a quota of 16
    const std::vector<uint32_t> ours = MakeTokens(seed, 8 * kBlockTokens);
    auto kv = MakeKv(ours, kBlockTokens, block_bytes, 0, 8);
    auto appended = acme->Append("m", ours, kv);
    ASSERT_TRUE(appended.ok()) << appended.status();
  }
  auto stats = As(kAdmin)->GetStats();
  ASSERT_TRUE(stats.ok());
  for (const v1::ModelStats& m : stats->models()) {
    EXPECT_LE(m.bytes(), 65536u) << m.namespace_();
  }
  EXPECT_EQ(FetchVerified(*globex, "m", theirs, kBlockTokens, block_bytes, 12, "globex"), 12u);
  const std::vector<uint32_t> newest = MakeTokens(43, 8 * kBlockTokens);
  EXPECT_EQ(FetchVerified(*acme, "m", newest, kBlockTokens, block_bytes, 8, "acme"), 8u);
}

TEST_F(TenancyTest, SighupReloadsThePrincipalsAndABrokenFileKeepsThem) {
  ASSERT_TRUE(As(kGlobex)->WhoAmI().ok());
  std::ofstream(principals_, std::ios::trunc) << Principals(false);
  ASSERT_EQ(::kill(daemon_->pid(), SIGHUP), 0);
  absl::StatusCode code = absl::StatusCode::kOk;
  for (int i = 0; i < 100 && code == absl::StatusCode::kOk; ++i) {
    absl::SleepFor(absl::Milliseconds(50));
    code = As(kGlobex)->WhoAmI().status().code();
  }
  EXPECT_EQ(code, absl::StatusCode::kUnauthenticated);

  std::ofstream(principals_, std::ios::trunc) << "{\"principals\": [";
  ASSERT_EQ(::kill(daemon_->pid(), SIGHUP), 0);
  absl::SleepFor(absl::Milliseconds(500));
  EXPECT_TRUE(daemon_->Running());
  EXPECT_TRUE(As(kAcme)->WhoAmI().ok());
  std::ifstream log(daemon_->log_path());
  std::string text((std::istreambuf_iterator<char>(log)), std::istreambuf_iterator<char>());
  EXPECT_THAT(text, HasSubstr("the principals file did not load"));
}

TEST_F(TenancyTest, KvcachectlSendsItsToken) {
  const std::string ctl = absl::StrCat(KVCACHECTL_BINARY, " --target ", daemon_->unix_target());
  CommandResult anonymous =
      RunCommand(absl::StrCat(KVCACHECTL_BINARY, " --target ", daemon_->tcp_target(), " whoami"));
  EXPECT_NE(anonymous.exit_code, 0);
  EXPECT_THAT(anonymous.output, HasSubstr("UNAUTHENTICATED"));
  CommandResult by_uid = RunCommand(ctl + " whoami");
  EXPECT_EQ(by_uid.exit_code, 0) << by_uid.output;
  EXPECT_THAT(by_uid.output, HasSubstr("authenticated by: unix_uid"));
  CommandResult by_env = RunCommand(absl::StrCat("KVCACHE_TOKEN=", kAcme, " ", ctl, " whoami"));
  EXPECT_EQ(by_env.exit_code, 0) << by_env.output;
  EXPECT_THAT(by_env.output, HasSubstr("principal: acme-worker"));
  const std::string token_file = dir_ + "/token";
  std::ofstream(token_file) << kReader << "\n";
  CommandResult by_file = RunCommand(ctl + " --token-file " + token_file + " whoami --json");
  EXPECT_EQ(by_file.exit_code, 0) << by_file.output;
  EXPECT_THAT(by_file.output, HasSubstr("\"role\":\"reader\""));
}

// TLS and mutual TLS through the C++ client and kvcachectl, with certificates
// from make_test_certs.sh (tests/python/security_test.py covers the server's
// side of TLS more fully, with an independent client).
class TlsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = ::testing::TempDir() + "tls-" + std::to_string(::getpid());
    std::filesystem::create_directories(dir_);
    CommandResult certs = RunCommand(absl::StrCat("bash ", MAKE_TEST_CERTS, " ", dir_, "/certs"));
    ASSERT_EQ(certs.exit_code, 0) << certs.output;
    std::ofstream(dir_ + "/principals.json") << absl::StrCat(R"({"principals": [
      {"name": "ops", "role": "admin", "certificate": "ops.kvcache.test"},
      {"name": "acme-worker", "tenant": "acme", "role": "worker", "token": ")",
                                                             kAcme, R"("}]})");
  }

  absl::StatusOr<std::unique_ptr<DaemonProcess>> StartTls(const std::string& key) {
    return DaemonProcess::Start({.tcp = true,
                                 .extra_flags = {"--principals-file", dir_ + "/principals.json",
                                                 "--tls-cert", Cert("server.pem"), "--tls-key",
                                                 Cert(key), "--tls-client-ca", Cert("ca.pem")},
                                 .token = kAcme});
  }

  std::string Cert(const std::string& name) const { return dir_ + "/certs/" + name; }

  std::unique_ptr<Client> Over(const DaemonProcess& d, const std::string& client_cert,
                               const std::string& token = "") {
    ClientOptions o{.target = d.tcp_target(),
                    .timeout = absl::Seconds(5),
                    .max_attempts = 1,
                    .data_path = DataPath::kGrpc,
                    .token = token,
                    .tls_ca_file = Cert("ca.pem")};
    if (!client_cert.empty()) {
      o.tls_cert_file = Cert(client_cert + ".pem");
      o.tls_key_file = Cert(client_cert + ".key");
    }
    auto c = Client::Connect(o);
    EXPECT_TRUE(c.ok()) << c.status();
    return c.ok() ? *std::move(c) : nullptr;
  }

  std::string dir_;
};

TEST_F(TlsTest, AClientCertificateNamesItsPrincipalAndOnlyTheCaItTrustsIsAccepted) {
  auto d = StartTls("server.key");
  ASSERT_TRUE(d.ok()) << d.status();
  auto who = Over(**d, "ops")->WhoAmI();
  ASSERT_TRUE(who.ok()) << who.status();
  EXPECT_EQ(who->principal(), "ops");
  EXPECT_EQ(who->authenticated_by(), "certificate");
  // A token over mutual TLS: the token names the principal.
  who = Over(**d, "acme-worker", kAcme)->WhoAmI();
  ASSERT_TRUE(who.ok()) << who.status();
  EXPECT_EQ(who->principal(), "acme-worker");
  // A certificate the CA signed that names no principal, an expired one, one
  // from another CA, none at all.
  EXPECT_EQ(Over(**d, "stranger")->WhoAmI().status().code(), absl::StatusCode::kUnauthenticated);
  for (const std::string refused : {"expired", "rogue", ""}) {
    EXPECT_EQ(Over(**d, refused)->WhoAmI().status().code(), absl::StatusCode::kUnavailable)
        << refused;
  }
  // Plaintext to the TLS port does not get through either.
  ClientOptions plain{.target = (*d)->tcp_target(),
                      .timeout = absl::Seconds(5),
                      .max_attempts = 1,
                      .data_path = DataPath::kGrpc,
                      .token = kAcme};
  auto plaintext = Client::Connect(plain);
  ASSERT_TRUE(plaintext.ok());
  EXPECT_EQ((*plaintext)->WhoAmI().status().code(), absl::StatusCode::kUnavailable);

  const std::string ctl = absl::StrCat(KVCACHECTL_BINARY, " --target ", (*d)->tcp_target(),
                                       " --tls-ca ", Cert("ca.pem"));
  CommandResult ops = RunCommand(absl::StrCat(ctl, " --tls-cert ", Cert("ops.pem"), " --tls-key ",
                                              Cert("ops.key"), " whoami"));
  EXPECT_EQ(ops.exit_code, 0) << ops.output;
  EXPECT_THAT(ops.output, HasSubstr("authenticated by: certificate"));
}

TEST_F(TlsTest, AKeyThatIsNotTheCertificatesStopsTheStart) {
  CommandResult start = RunCommand(absl::StrCat(
      KvcachedPath(), " --unix-socket ", dir_, "/kvcached.sock --listen 127.0.0.1:0",
      " --metrics-address none --principals-file ", dir_, "/principals.json --tls-cert ",
      Cert("server.pem"), " --tls-key ", Cert("ops.key")));
  EXPECT_EQ(start.exit_code, 2) << start.output;
  EXPECT_THAT(start.output, HasSubstr("is not the key of the certificate in"));
}

}  // namespace
}  // namespace kvcache::testing
