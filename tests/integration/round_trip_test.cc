// Byte-exact round trips, dedup, leases and capacity through the real daemon.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <thread>

#include "tests/integration/daemon_process.h"
#include "tests/integration/kv_pattern.h"

namespace kvcache::testing {
namespace {

using ::testing::HasSubstr;

class DaemonTest : public ::testing::Test {
 protected:
  void StartDaemon(const DaemonOptions& options = {}) {
    auto d = DaemonProcess::Start(options);
    ASSERT_TRUE(d.ok()) << d.status();
    daemon_ = *std::move(d);
    client_ = daemon_->NewClient();
    ASSERT_NE(client_, nullptr);
  }
  void TearDown() override {
    if (daemon_ != nullptr) {
      client_.reset();
      EXPECT_EQ(daemon_->Stop(), 0)
          << "kvcached did not drain cleanly; log " << daemon_->log_path();
    }
  }
  uint64_t Register(const std::string& model, const v1::ModelLayout& layout) {
    auto r = client_->RegisterModel(model, layout);
    EXPECT_TRUE(r.ok()) << r.status();
    return r.ok() ? r->block_bytes() : 0;
  }

  std::unique_ptr<DaemonProcess> daemon_;
  std::unique_ptr<Client> client_;
};

struct LayoutCase {
  uint32_t layers, heads, dim;
  v1::DType dtype;
  uint32_t block_tokens;
};

class RoundTripTest : public DaemonTest, public ::testing::WithParamInterface<LayoutCase> {};

TEST_P(RoundTripTest, FetchReturnsExactlyTheAppendedBytes) {
  StartDaemon();
  const LayoutCase c = GetParam();
  const v1::ModelLayout layout = MakeLayout(c.layers, c.heads, c.dim, c.dtype, c.block_tokens);
  const uint64_t block_bytes = Register("m", layout);
  ASSERT_GT(block_bytes, 0u);
  // 5 whole blocks plus a partial one that carries no KV.
  const auto tokens = MakeTokens(7, 5 * c.block_tokens + c.block_tokens / 2);
  const auto kv = MakeKv(tokens, c.block_tokens, block_bytes, 0, 5);

  auto appended = client_->Append("m", tokens, kv);
  ASSERT_TRUE(appended.ok()) << appended.status();
  EXPECT_EQ(appended->stored_blocks, 5u);
  EXPECT_EQ(appended->cached_tokens, 5u * c.block_tokens);

  auto lookup = client_->Lookup("m", tokens);
  ASSERT_TRUE(lookup.ok()) << lookup.status();
  EXPECT_EQ(lookup->matched_tokens, 5u * c.block_tokens);
  ASSERT_EQ(lookup->blocks.size(), 5u);
  for (size_t b = 0; b < 5; ++b) {
    EXPECT_EQ(lookup->blocks[b].index(), b);
    EXPECT_EQ(lookup->blocks[b].bytes(), block_bytes);
    EXPECT_EQ(lookup->blocks[b].checksum(),
              BlockChecksum(std::span<const std::byte>(kv).subspan(b * block_bytes, block_bytes)));
  }

  std::vector<std::byte> out(kv.size());
  auto fetched = client_->Fetch("m", tokens, out);
  ASSERT_TRUE(fetched.ok()) << fetched.status();
  EXPECT_EQ(fetched->matched_tokens, 5u * c.block_tokens);
  EXPECT_EQ(fetched->bytes, kv.size());
  EXPECT_TRUE(out == kv) << "fetched bytes differ from appended bytes";

  // A prefix of the sequence fetches the prefix's blocks only.
  std::vector<std::byte> part(2 * block_bytes);
  auto prefix = client_->Fetch("m", std::span(tokens).first(2 * c.block_tokens + 3), part);
  ASSERT_TRUE(prefix.ok()) << prefix.status();
  EXPECT_EQ(prefix->blocks, 2u);
  EXPECT_TRUE(std::equal(part.begin(), part.end(), kv.begin()));
}

INSTANTIATE_TEST_SUITE_P(
    Layouts, RoundTripTest,
    ::testing::Values(LayoutCase{2, 2, 64, v1::DTYPE_FP16, 16},
                      LayoutCase{4, 8, 128, v1::DTYPE_BF16, 64},  // 512 KiB blocks
                      LayoutCase{3, 1, 32, v1::DTYPE_FP32, 256},
                      LayoutCase{32, 8, 128, v1::DTYPE_FP16, 32}),  // 4 MiB: several chunks
    [](const auto& info) {
      return "L" + std::to_string(info.param.layers) + "H" + std::to_string(info.param.heads) +
             "D" + std::to_string(info.param.dim) + "T" + std::to_string(info.param.block_tokens) +
             "_" + v1::DType_Name(info.param.dtype);
    });

TEST_F(DaemonTest, ExtendingAppendStartsAtTheCachedPrefix) {
  StartDaemon();
  const uint64_t bb = Register("m", MakeLayout(1, 1, 16, v1::DTYPE_FP16, 16));
  const auto tokens = MakeTokens(3, 6 * 16);
  auto first = client_->Append("m", std::span(tokens).first(2 * 16), MakeKv(tokens, 16, bb, 0, 2));
  ASSERT_TRUE(first.ok()) << first.status();
  AppendOptions from_block_2{.start_token = 32};
  auto rest = client_->Append("m", tokens, MakeKv(tokens, 16, bb, 2, 4), from_block_2);
  ASSERT_TRUE(rest.ok()) << rest.status();
  EXPECT_EQ(rest->stored_blocks, 4u);
  EXPECT_EQ(rest->cached_tokens, 96u);
  std::vector<std::byte> out(6 * bb);
  auto fetched = client_->Fetch("m", tokens, out);
  ASSERT_TRUE(fetched.ok());
  EXPECT_TRUE(out == MakeKv(tokens, 16, bb, 0, 6));

  // Starting beyond the cached prefix would leave a gap.
  const auto other = MakeTokens(4, 4 * 16);
  auto gap = client_->Append("m", other, MakeKv(other, 16, bb, 2, 2), from_block_2);
  EXPECT_EQ(gap.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(gap.status().message(), HasSubstr("beyond the cached prefix"));
}

TEST_F(DaemonTest, SharedPrefixesAreStoredOnceAcrossWorkers) {
  StartDaemon();
  const uint64_t bb = Register("m", MakeLayout(2, 2, 32, v1::DTYPE_FP16, 16));
  auto worker_a = daemon_->NewClient();
  auto worker_b = daemon_->NewClient();
  // Both sequences share a 3-block system prompt, then diverge for 2 blocks.
  const auto prompt = MakeTokens(11, 3 * 16);
  auto seq_a = prompt;
  auto seq_b = prompt;
  const auto tail_a = MakeTokens(12, 2 * 16);
  const auto tail_b = MakeTokens(13, 2 * 16);
  seq_a.insert(seq_a.end(), tail_a.begin(), tail_a.end());
  seq_b.insert(seq_b.end(), tail_b.begin(), tail_b.end());

  auto a = worker_a->Append("m", seq_a, MakeKv(seq_a, 16, bb, 0, 5));
  ASSERT_TRUE(a.ok()) << a.status();
  EXPECT_EQ(a->stored_blocks, 5u);
  auto b = worker_b->Append("m", seq_b, MakeKv(seq_b, 16, bb, 0, 5));
  ASSERT_TRUE(b.ok()) << b.status();
  EXPECT_EQ(b->stored_blocks, 2u);
  EXPECT_EQ(b->deduplicated_blocks, 3u);

  auto stats = client_->GetStats();
  ASSERT_TRUE(stats.ok());
  ASSERT_EQ(stats->models_size(), 1);
  EXPECT_EQ(stats->models(0).blocks(), 7u);
  EXPECT_EQ(stats->models(0).bytes(), 7 * bb);
  EXPECT_EQ(stats->models(0).deduplicated_blocks(), 3u);

  // Each worker reads the other's blocks byte-exact.
  std::vector<std::byte> out(5 * bb);
  ASSERT_TRUE(worker_a->Fetch("m", seq_b, out).ok());
  EXPECT_TRUE(out == MakeKv(seq_b, 16, bb, 0, 5));
  ASSERT_TRUE(worker_b->Fetch("m", seq_a, out).ok());
  EXPECT_TRUE(out == MakeKv(seq_a, 16, bb, 0, 5));
}

TEST_F(DaemonTest, NamespacesDoNotShareBlocks) {
  StartDaemon();
  auto tenant_a = daemon_->NewClient("tenant-a");
  auto tenant_b = daemon_->NewClient("tenant-b");
  const auto layout = MakeLayout(1, 1, 16, v1::DTYPE_FP16, 16);
  auto ra = tenant_a->RegisterModel("m", layout);
  ASSERT_TRUE(ra.ok());
  ASSERT_TRUE(tenant_b->RegisterModel("m", layout).ok());
  const auto tokens = MakeTokens(5, 32);
  ASSERT_TRUE(tenant_a->Append("m", tokens, MakeKv(tokens, 16, ra->block_bytes(), 0, 2)).ok());
  auto in_b = tenant_b->Lookup("m", tokens);
  ASSERT_TRUE(in_b.ok());
  EXPECT_EQ(in_b->matched_tokens, 0u);
  auto in_a = tenant_a->Lookup("m", tokens);
  ASSERT_TRUE(in_a.ok());
  EXPECT_EQ(in_a->matched_tokens, 32u);
}

// Capacity of 8 slabs of 64 KiB; 16 KiB blocks (1 layer, K+V, 1 head, 128 dims, fp32, 16 tokens).
DaemonOptions SmallCapacity() { return {.capacity_bytes = 8 * 65536, .slab_bytes = 65536}; }

TEST_F(DaemonTest, LeasedBlocksSurviveCapacityEviction) {
  StartDaemon(SmallCapacity());
  const uint64_t bb = Register("m", MakeLayout(1, 1, 128, v1::DTYPE_FP32, 16));
  ASSERT_EQ(bb, 16384u);
  const auto keep = MakeTokens(100, 4 * 16);
  ASSERT_TRUE(client_->Append("m", keep, MakeKv(keep, 16, bb, 0, 4)).ok());
  auto lease = client_->Lookup("m", keep, {.acquire_lease = true, .lease_ttl = absl::Seconds(60)});
  ASSERT_TRUE(lease.ok()) << lease.status();
  ASSERT_NE(lease->lease_id, 0u);
  EXPECT_EQ(lease->matched_tokens, 64u);

  // Write 4x the capacity of other sequences: everything unleased cycles out.
  for (int i = 0; i < 32; ++i) {
    const auto t = MakeTokens(200 + i, 4 * 16);
    auto r = client_->Append("m", t, MakeKv(t, 16, bb, 0, 4));
    ASSERT_TRUE(r.ok()) << "append " << i << ": " << r.status();
  }
  auto stats = client_->GetStats();
  ASSERT_TRUE(stats.ok());
  EXPECT_GT(stats->capacity_evictions(), 0u);
  EXPECT_LE(stats->tiers(0).used_bytes(), stats->tiers(0).capacity_bytes());

  std::vector<std::byte> out(4 * bb);
  auto by_lease = client_->FetchLease("m", lease->lease_id, out);
  ASSERT_TRUE(by_lease.ok()) << by_lease.status();
  EXPECT_TRUE(out == MakeKv(keep, 16, bb, 0, 4));
  auto again = client_->Lookup("m", keep);
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(again->matched_tokens, 64u) << "a leased prefix was evicted";

  // Once released, the prefix is evictable like any other.
  auto released = client_->ReleaseLease(lease->lease_id);
  ASSERT_TRUE(released.ok());
  EXPECT_TRUE(*released);
  EXPECT_FALSE(*client_->ReleaseLease(lease->lease_id));
  for (int i = 0; i < 32; ++i) {
    const auto t = MakeTokens(300 + i, 4 * 16);
    ASSERT_TRUE(client_->Append("m", t, MakeKv(t, 16, bb, 0, 4)).ok());
  }
  auto gone = client_->Lookup("m", keep);
  ASSERT_TRUE(gone.ok());
  EXPECT_EQ(gone->matched_tokens, 0u);
  auto stale = client_->FetchLease("m", lease->lease_id, out);
  EXPECT_EQ(stale.status().code(), absl::StatusCode::kNotFound);
}

TEST_F(DaemonTest, FullCacheRejectsAppendAndKeepsWhatItHas) {
  StartDaemon(SmallCapacity());
  const uint64_t bb = Register("m", MakeLayout(1, 1, 128, v1::DTYPE_FP32, 16));
  // 8 slabs x 4 blocks = 32 blocks fit; fill them all and lease every one.
  std::vector<std::vector<uint32_t>> seqs;
  std::vector<uint64_t> leases;
  for (int i = 0; i < 8; ++i) {
    seqs.push_back(MakeTokens(400 + i, 4 * 16));
    ASSERT_TRUE(client_->Append("m", seqs.back(), MakeKv(seqs.back(), 16, bb, 0, 4)).ok());
    auto l = client_->Lookup("m", seqs.back(), {.acquire_lease = true});
    ASSERT_TRUE(l.ok());
    ASSERT_EQ(l->matched_tokens, 64u) << "sequence " << i << " was evicted before it was leased";
    leases.push_back(l->lease_id);
  }
  const auto extra = MakeTokens(999, 2 * 16);
  auto rejected = client_->Append("m", extra, MakeKv(extra, 16, bb, 0, 2));
  EXPECT_EQ(rejected.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(rejected.status().message(), HasSubstr("host tier is full"));

  auto stats = client_->GetStats();
  ASSERT_TRUE(stats.ok());
  EXPECT_EQ(stats->models(0).blocks(), 32u);
  EXPECT_EQ(stats->rejected_appends(), 1u);
  std::vector<std::byte> out(4 * bb);
  for (const auto& s : seqs) {
    ASSERT_TRUE(client_->Fetch("m", s, out).ok());
    EXPECT_TRUE(out == MakeKv(s, 16, bb, 0, 4));
  }
  EXPECT_EQ(client_->Lookup("m", extra)->matched_tokens, 0u);
  // Releasing one lease makes room again.
  ASSERT_TRUE(*client_->ReleaseLease(leases[0]));
  EXPECT_TRUE(client_->Append("m", extra, MakeKv(extra, 16, bb, 0, 2)).ok());
}

TEST_F(DaemonTest, EvictPrefixAndWholeModel) {
  StartDaemon();
  const uint64_t bb = Register("m", MakeLayout(1, 2, 32, v1::DTYPE_FP16, 16));
  const auto tokens = MakeTokens(21, 4 * 16);
  ASSERT_TRUE(client_->Append("m", tokens, MakeKv(tokens, 16, bb, 0, 4)).ok());
  auto evicted = client_->EvictPrefix("m", std::span(tokens).first(3 * 16));
  ASSERT_TRUE(evicted.ok()) << evicted.status();
  EXPECT_EQ(evicted->evicted_blocks, 2u);  // block 2 and its child, block 3
  EXPECT_EQ(evicted->evicted_bytes, 2 * bb);
  EXPECT_EQ(client_->Lookup("m", tokens)->matched_tokens, 32u);
  auto all = client_->EvictModel("m");
  ASSERT_TRUE(all.ok());
  EXPECT_EQ(all->evicted_blocks, 2u);
  EXPECT_EQ(client_->Lookup("m", tokens)->matched_tokens, 0u);
  // The registration stays.
  auto models = client_->ListModels();
  ASSERT_TRUE(models.ok());
  EXPECT_EQ(models->models_size(), 1);
}

TEST_F(DaemonTest, ServesOverTcpToo) {
  StartDaemon({.tcp = true});
  ClientOptions options;
  options.target = daemon_->tcp_target();
  auto tcp = Client::Connect(options);
  ASSERT_TRUE(tcp.ok());
  auto info = (*tcp)->GetServerInfo();
  ASSERT_TRUE(info.ok()) << info.status();
  EXPECT_FALSE(info->version().empty());
  EXPECT_EQ(info->listen_addresses_size(), 2);
}

}  // namespace
}  // namespace kvcache::testing
