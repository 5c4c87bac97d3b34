// End-to-end integrity is not opt-in: against the real daemon with its
// default configuration, an append whose header carries no block_checksums is
// refused on both front doors (the gRPC Append stream and the shared-memory
// append_from) and caches nothing; security.require_block_checksums set to
// false restores the old acceptance.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <fstream>
#include <iterator>

#include "tests/integration/daemon_process.h"
#include "tests/integration/kv_pattern.h"

namespace kvcache::testing {
namespace {

using ::testing::HasSubstr;

constexpr uint32_t kBlockTokens = 16;

struct Path {
  const char* name;
  DataPath path;
};
constexpr Path kPaths[] = {{"grpc", DataPath::kGrpc}, {"shm", DataPath::kSharedMemory}};

std::string ReadFile(const std::string& path) {
  std::ifstream in(path);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

// Whole blocks the daemon holds in all.
uint64_t CachedBlocks(Client& client) {
  auto stats = client.GetStats();
  EXPECT_TRUE(stats.ok()) << stats.status();
  if (!stats.ok()) return 0;
  uint64_t blocks = 0;
  for (const v1::ModelStats& m : stats->models()) blocks += m.blocks();
  return blocks;
}

TEST(AppendChecksumsTest, TheDefaultDaemonRefusesAppendsWithoutChecksums) {
  auto daemon = DaemonProcess::Start();
  ASSERT_TRUE(daemon.ok()) << daemon.status();
  auto admin = (*daemon)->NewClient("", DataPath::kGrpc);
  auto reg = admin->RegisterModel("m", MakeLayout(1, 2, 32, v1::DTYPE_FP16, kBlockTokens));
  ASSERT_TRUE(reg.ok()) << reg.status();
  const uint64_t bb = reg->block_bytes();

  uint64_t seed = 1;
  for (const Path& p : kPaths) {
    SCOPED_TRACE(p.name);
    auto client = (*daemon)->NewClient("", p.path);
    ASSERT_NE(client, nullptr);
    ASSERT_EQ(client->UsesSharedMemory(), p.path == DataPath::kSharedMemory);
    const auto tokens = MakeTokens(seed++, 3 * kBlockTokens);
    const auto kv = MakeKv(tokens, kBlockTokens, bb, 0, 3);

    AppendOptions bare;
    bare.send_checksums = false;
    auto refused = client->Append("m", tokens, kv, bare);
    EXPECT_EQ(refused.status().code(), absl::StatusCode::kInvalidArgument) << refused.status();
    EXPECT_THAT(std::string(refused.status().message()), HasSubstr("block_checksums"));
    EXPECT_THAT(std::string(refused.status().message()),
                HasSubstr("security.require_block_checksums"));
    EXPECT_EQ(client->Lookup("m", tokens)->matched_tokens, 0u) << "a refused append was cached";
    EXPECT_EQ(CachedBlocks(*admin), 0u);

    // Prefixes already cached do not excuse an extension from its checksums.
    auto first =
        client->Append("m", std::span(tokens).first(kBlockTokens), std::span(kv).first(bb));
    ASSERT_TRUE(first.ok()) << first.status();
    bare.start_token = kBlockTokens;
    auto extension = client->Append("m", tokens, std::span(kv).subspan(bb), bare);
    EXPECT_EQ(extension.status().code(), absl::StatusCode::kInvalidArgument) << extension.status();
    EXPECT_EQ(client->Lookup("m", tokens)->matched_tokens, kBlockTokens);

    // With its checksums (the client's default) the same append is stored.
    auto stored = client->Append("m", tokens, kv);
    ASSERT_TRUE(stored.ok()) << stored.status();
    EXPECT_EQ(stored->stored_blocks, 2u);
    EXPECT_EQ(FetchVerified(*client, "m", tokens, kBlockTokens, bb, 3, p.name), 3u);
    ASSERT_TRUE(client->EvictModel("m").ok());
  }
  admin.reset();
  EXPECT_EQ((*daemon)->Stop(), 0);
  EXPECT_THAT(ReadFile((*daemon)->log_path()), HasSubstr("block checksums: required"));
}

TEST(AppendChecksumsTest, TurnedOffTheDaemonStoresAppendsWithoutChecksums) {
  const std::string config = ::testing::TempDir() + "/append_checksums_off.json";
  std::ofstream(config) << R"({"security": {"require_block_checksums": false}})";
  auto daemon = DaemonProcess::Start({.extra_flags = {"--config", config}});
  ASSERT_TRUE(daemon.ok()) << daemon.status();
  auto admin = (*daemon)->NewClient("", DataPath::kGrpc);
  auto reg = admin->RegisterModel("m", MakeLayout(1, 2, 32, v1::DTYPE_FP16, kBlockTokens));
  ASSERT_TRUE(reg.ok()) << reg.status();
  const uint64_t bb = reg->block_bytes();

  uint64_t seed = 1;
  for (const Path& p : kPaths) {
    SCOPED_TRACE(p.name);
    auto client = (*daemon)->NewClient("", p.path);
    ASSERT_NE(client, nullptr);
    const auto tokens = MakeTokens(seed++, 2 * kBlockTokens);
    const auto kv = MakeKv(tokens, kBlockTokens, bb, 0, 2);
    AppendOptions bare;
    bare.send_checksums = false;
    auto stored = client->Append("m", tokens, kv, bare);
    ASSERT_TRUE(stored.ok()) << stored.status();
    EXPECT_EQ(stored->stored_blocks, 2u);
    EXPECT_EQ(FetchVerified(*client, "m", tokens, kBlockTokens, bb, 2, p.name), 2u);
  }
  admin.reset();
  EXPECT_EQ((*daemon)->Stop(), 0);
  EXPECT_THAT(ReadFile((*daemon)->log_path()), HasSubstr("block checksums: not required"));
}

}  // namespace
}  // namespace kvcache::testing
