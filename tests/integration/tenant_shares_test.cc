// Per-tenant shares of the budgets all tenants share, against the real
// daemon with a principals file (docs/security.md, "Tenant limits"): one
// tenant that takes its whole share of models, leases and lease tokens is
// refused past it, naming the budget and the share, and another tenant can
// still register, append and lease, over gRPC and over shared memory.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>

#include "absl/strings/str_cat.h"
#include "tests/integration/daemon_process.h"
#include "tests/integration/kv_pattern.h"

namespace kvcache::testing {
namespace {

using ::testing::HasSubstr;

constexpr char kAcme[] = "acme-token-0123456789abcdef";
constexpr char kGlobex[] = "globex-token-0123456789abcdef";
constexpr char kAdmin[] = "admin-token-0123456789abcdef";
constexpr uint32_t kBlockTokens = 16;
constexpr int kMaxModels = 4;
constexpr int kMaxLeases = 8;
constexpr int kMaxLeaseTokens = 16 * kBlockTokens;

class TenantSharesTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = ::testing::TempDir() + "tenant-shares-" + std::to_string(::getpid());
    std::filesystem::create_directories(dir_);
    const std::string principals = dir_ + "/principals.json";
    std::ofstream(principals) << absl::StrCat(
        R"({"principals": [
          {"name": "acme-worker", "tenant": "acme", "role": "worker", "token": ")",
        kAcme, R"("},
          {"name": "globex-worker", "tenant": "globex", "role": "worker", "token": ")",
        kGlobex, R"("},
          {"name": "root", "role": "admin", "token": ")",
        kAdmin, R"("}]})");
    // security.tenant_limits.max_share is left at its default: 0.5 with a
    // principals file, so each namespace may hold 2 models, 4 leases and 128
    // lease tokens, and each tenant 2 shared-memory connections.
    const std::string config = dir_ + "/config.json";
    std::ofstream(config) << absl::StrCat(
        R"({"limits": {"max_models": )", kMaxModels, R"(, "max_leases": )", kMaxLeases,
        R"(, "max_lease_tokens": )", kMaxLeaseTokens, R"(, "max_tokens_per_request": 16},
            "shm": {"max_connections": 4}})");
    auto d = DaemonProcess::Start(
        {.extra_flags = {"--config", config, "--principals-file", principals}, .token = kAdmin});
    ASSERT_TRUE(d.ok()) << d.status();
    daemon_ = *std::move(d);
    layout_ = MakeLayout(2, 2, 16, v1::DTYPE_FP16, kBlockTokens);
  }

  std::unique_ptr<Client> As(const std::string& token, DataPath path) {
    auto c = daemon_->NewClient("", path, token);
    EXPECT_NE(c, nullptr);
    return c;
  }

  // Registers `model` and appends one block of `tokens` as `client`.
  void Store(Client& client, const std::string& model, std::span<const uint32_t> tokens) {
    auto reg = client.RegisterModel(model, layout_);
    ASSERT_TRUE(reg.ok()) << reg.status();
    auto kv = MakeKv(tokens, kBlockTokens, reg->block_bytes(), 0, 1);
    auto appended = client.Append(model, tokens, kv);
    ASSERT_TRUE(appended.ok()) << appended.status();
  }

  std::unique_ptr<DaemonProcess> daemon_;
  std::string dir_;
  v1::ModelLayout layout_;
};

TEST_F(TenantSharesTest, ATenantPastItsShareLeavesTheOtherItsOwn) {
  const LookupOptions lease{.acquire_lease = true, .lease_ttl = absl::Minutes(10)};
  const std::vector<uint32_t> block = MakeTokens(7, kBlockTokens);
  // Tenant acme takes its share of models (2 of 4) and of leases (4 of 8),
  // over gRPC and over shared memory alike.
  auto acme = As(kAcme, DataPath::kGrpc);
  auto acme_shm = As(kAcme, DataPath::kSharedMemory);
  Store(*acme, "m0", block);
  ASSERT_TRUE(acme->RegisterModel("m1", layout_).ok());
  for (Client* c : {acme.get(), acme_shm.get()}) {
    auto third = c->RegisterModel("m2", layout_);
    EXPECT_EQ(third.status().code(), absl::StatusCode::kResourceExhausted);
    EXPECT_THAT(third.status().message(),
                HasSubstr("namespace \"acme\" holds 2 models; 1 more would pass its share 2 "
                          "(limits.max_models 4 x security.tenant_limits.max_share 0.5)"));
  }
  for (int i = 0; i < 4; ++i) {
    auto leased = (i % 2 == 0 ? acme : acme_shm)->Lookup("m0", block, lease);
    ASSERT_TRUE(leased.ok()) << leased.status();
    EXPECT_NE(leased->lease_id, 0u);
  }
  for (Client* c : {acme.get(), acme_shm.get()}) {
    auto fifth = c->Lookup("m0", block, lease);
    EXPECT_EQ(fifth.status().code(), absl::StatusCode::kResourceExhausted);
    EXPECT_THAT(fifth.status().message(),
                HasSubstr("share 4 (limits.max_leases 8 x security.tenant_limits.max_share 0.5)"));
  }
  // A plain lookup takes no lease and still answers.
  auto plain = acme->Lookup("m0", block);
  ASSERT_TRUE(plain.ok()) << plain.status();
  EXPECT_EQ(plain->matched_tokens, kBlockTokens);

  // Tenant globex still registers, appends and leases its share.
  auto globex = As(kGlobex, DataPath::kGrpc);
  auto globex_shm = As(kGlobex, DataPath::kSharedMemory);
  Store(*globex, "m0", block);
  ASSERT_TRUE(globex_shm->RegisterModel("m1", layout_).ok());
  for (int i = 0; i < 4; ++i) {
    auto leased = (i % 2 == 0 ? globex : globex_shm)->Lookup("m0", block, lease);
    ASSERT_TRUE(leased.ok()) << leased.status();
    EXPECT_EQ(leased->matched_tokens, kBlockTokens);
    EXPECT_NE(leased->lease_id, 0u);
  }
  auto stats = As(kAdmin, DataPath::kGrpc)->GetStats();
  ASSERT_TRUE(stats.ok()) << stats.status();
  EXPECT_EQ(stats->active_leases(), 8u);
  EXPECT_EQ(stats->models_size(), 4);
}

TEST_F(TenantSharesTest, ATenantPastItsShareOfSharedMemoryConnectionsLeavesTheOtherRoom) {
  // Two clients of acme hold a connection each: its share of shm.max_connections 4.
  std::vector<std::unique_ptr<Client>> acme;
  for (int i = 0; i < 2; ++i) {
    acme.push_back(As(kAcme, DataPath::kSharedMemory));
    auto looked = acme.back()->Lookup("m", MakeTokens(1, kBlockTokens));
    EXPECT_EQ(looked.status().code(), absl::StatusCode::kNotFound) << looked.status();
  }
  auto third = As(kAcme, DataPath::kSharedMemory);
  auto refused = third->Lookup("m", MakeTokens(1, kBlockTokens));
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kResourceExhausted) << refused.status();
  EXPECT_THAT(refused.status().message(),
              HasSubstr("its share 2 (shm.max_connections 4 x security.tenant_limits.max_share"));
  // Another tenant still connects, registers, appends and leases.
  auto globex = As(kGlobex, DataPath::kSharedMemory);
  const std::vector<uint32_t> block = MakeTokens(7, kBlockTokens);
  Store(*globex, "m", block);
  auto leased = globex->Lookup("m", block, {.acquire_lease = true});
  ASSERT_TRUE(leased.ok()) << leased.status();
  EXPECT_NE(leased->lease_id, 0u);
  // A connection given back makes room for the tenant again.
  acme.pop_back();
  for (int attempt = 0; attempt < 100; ++attempt) {
    refused = third->Lookup("m", MakeTokens(1, kBlockTokens));
    if (!absl::IsResourceExhausted(refused.status())) break;
    absl::SleepFor(absl::Milliseconds(20));  // the daemon sees the close asynchronously
  }
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kNotFound) << refused.status();
}

}  // namespace
}  // namespace kvcache::testing
