// LeaseTable: limits, expiry, removal and the totals it keeps.
#include "server/core/lease_table.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "absl/container/flat_hash_set.h"

namespace kvcache {
namespace {

using ::testing::HasSubstr;

const ModelKey kA{"default", "a"};
const ModelKey kB{"default", "b"};
const absl::Time kT0 = absl::FromUnixSeconds(1000);

Lease Make(const ModelKey& model, size_t tokens, absl::Time expires, size_t blocks = 1) {
  Lease l{.model = model, .matched_tokens = tokens, .expires = expires};
  l.tokens.assign(tokens, 7);
  l.blocks.resize(blocks);
  return l;
}

TEST(LeaseTableTest, IdsAreNonZeroAndDistinct) {
  LeaseTable t(1000, 1 << 20);
  absl::flat_hash_set<uint64_t> ids;
  for (int i = 0; i < 500; ++i) {
    auto id = t.Add(Make(kA, 16, kT0));
    ASSERT_TRUE(id.ok());
    EXPECT_NE(*id, 0u);
    EXPECT_TRUE(ids.insert(*id).second);
  }
  EXPECT_EQ(t.size(), 500u);
}

TEST(LeaseTableTest, LimitsRefuseAndAddNothing) {
  LeaseTable t(2, 100);
  ASSERT_TRUE(t.Add(Make(kA, 60, kT0)).ok());
  auto tokens = t.Add(Make(kA, 41, kT0));
  EXPECT_EQ(tokens.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(std::string(tokens.status().message()), HasSubstr("max_lease_tokens (100)"));
  ASSERT_TRUE(t.Add(Make(kA, 40, kT0)).ok());
  auto count = t.Add(Make(kA, 0, kT0));
  EXPECT_EQ(count.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(std::string(count.status().message()), HasSubstr("max_leases (2)"));
  EXPECT_EQ(t.size(), 2u);
  EXPECT_EQ(t.tokens(), 100u);
}

TEST(LeaseTableTest, ExpireRemovesExactlyWhatExpired) {
  LeaseTable t(100, 1 << 20);
  auto early = t.Add(Make(kA, 16, kT0 + absl::Seconds(1)));
  auto same = t.Add(Make(kA, 16, kT0 + absl::Seconds(1)));
  auto late = t.Add(Make(kA, 16, kT0 + absl::Seconds(5)));
  ASSERT_TRUE(early.ok() && same.ok() && late.ok());
  t.Expire(kT0);
  EXPECT_EQ(t.size(), 3u);
  t.Expire(kT0 + absl::Seconds(1));
  EXPECT_EQ(t.Find(*early), nullptr);
  EXPECT_EQ(t.Find(*same), nullptr);
  ASSERT_NE(t.Find(*late), nullptr);
  EXPECT_EQ(t.tokens(), 16u);
  EXPECT_EQ(t.metadata_bytes(), LeaseTable::MetadataBytes(16, 1));
}

TEST(LeaseTableTest, RemoveHandsTheLeaseBackAndTheTotalsReturnToZero) {
  LeaseTable t(100, 1 << 20);
  auto a1 = t.Add(Make(kA, 32, kT0, 2));
  auto b1 = t.Add(Make(kB, 16, kT0 + absl::Seconds(1)));
  auto a2 = t.Add(Make(kA, 48, kT0 + absl::Seconds(2), 3));
  ASSERT_TRUE(a1.ok() && b1.ok() && a2.ok());
  EXPECT_EQ(t.metadata_bytes(), LeaseTable::MetadataBytes(32, 2) +
                                    LeaseTable::MetadataBytes(16, 1) +
                                    LeaseTable::MetadataBytes(48, 3));
  Lease out;
  ASSERT_TRUE(t.Remove(*b1, &out));
  EXPECT_EQ(out.model, kB);
  EXPECT_EQ(out.tokens.size(), 16u);
  EXPECT_FALSE(t.Remove(*b1, &out));
  std::vector<Lease> removed;
  EXPECT_EQ(t.RemoveModel(kA, &removed), 2u);
  EXPECT_EQ(removed.size(), 2u);
  EXPECT_EQ(t.size(), 0u);
  EXPECT_EQ(t.tokens(), 0u);
  EXPECT_EQ(t.metadata_bytes(), 0u);
  // A removed lease's expiry entry is gone too: expiring later finds nothing.
  t.Expire(kT0 + absl::Hours(1));
  EXPECT_EQ(t.size(), 0u);
}

TEST(LeaseTableTest, ANamespacePastItsShareIsRefusedAndLeavesOthersRoom) {
  const ModelKey a{"tenant-a", "m"};
  const ModelKey b{"tenant-b", "m"};
  LeaseTable t(4, 100, 0.5);  // each namespace: 2 leases, 50 tokens
  ASSERT_TRUE(t.Add(Make(a, 10, kT0)).ok());
  auto tokens = t.Add(Make(a, 41, kT0));
  EXPECT_EQ(tokens.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(
      std::string(tokens.status().message()),
      HasSubstr("namespace \"tenant-a\" holds 10 lease tokens; 41 more would pass its "
                "share 50 (limits.max_lease_tokens 100 x security.tenant_limits.max_share"));
  ASSERT_TRUE(t.Add(Make(a, 40, kT0)).ok());
  auto count = t.Add(Make(a, 0, kT0));
  EXPECT_EQ(count.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(std::string(count.status().message()),
              HasSubstr("share 2 (limits.max_leases 4 x security.tenant_limits.max_share 0.5)"));
  EXPECT_EQ(t.leases_of("tenant-a"), 2u);
  EXPECT_EQ(t.tokens_of("tenant-a"), 50u);
  // Refusals changed nothing; the other namespace still gets its share.
  EXPECT_EQ(t.size(), 2u);
  auto b1 = t.Add(Make(b, 50, kT0 + absl::Seconds(1)));
  ASSERT_TRUE(b1.ok()) << b1.status();
  ASSERT_TRUE(t.Add(Make(b, 0, kT0)).ok());
  EXPECT_EQ(t.leases_of("tenant-b"), 2u);
  // Expiry and removal give the share back.
  t.Expire(kT0);
  EXPECT_EQ(t.leases_of("tenant-a"), 0u);
  EXPECT_EQ(t.tokens_of("tenant-a"), 0u);
  Lease out;
  EXPECT_TRUE(t.Remove(*b1, &out));
  EXPECT_EQ(t.tokens_of("tenant-b"), 0u);
  EXPECT_TRUE(t.Add(Make(a, 50, kT0)).ok());
}

TEST(LeaseTableTest, AShareOfOneLeavesEveryBudgetToOneNamespace) {
  LeaseTable t(3, 100);
  for (int i = 0; i < 3; ++i) ASSERT_TRUE(t.Add(Make(kA, 33, kT0)).ok());
  EXPECT_EQ(t.leases_of("default"), 3u);
}

}  // namespace
}  // namespace kvcache
