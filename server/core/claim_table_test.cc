#include "server/core/claim_table.h"

#include <gtest/gtest.h>

#include <atomic>
#include <thread>
#include <vector>

namespace kvcache {
namespace {

TEST(ClaimTableTest, ClaimsWhatNoOtherOwnerHolds) {
  ClaimTable table;
  const std::vector<uint64_t> keys = {1, 2, 3};
  int a = 0, b = 0;
  EXPECT_EQ(table.Claim(7, keys, {true, false, true}, &a), (std::vector<bool>{true, false, true}));
  EXPECT_EQ(table.size(), 2u);
  // b gets only the key a did not want; a claiming again keeps its own.
  EXPECT_EQ(table.Claim(7, keys, {true, true, true}, &b), (std::vector<bool>{false, true, false}));
  EXPECT_EQ(table.Claim(7, keys, {true, false, true}, &a), (std::vector<bool>{true, false, true}));
  // The same key of another incarnation of the model is another claim.
  EXPECT_EQ(table.Claim(8, keys, {true, true, true}, &b), (std::vector<bool>{true, true, true}));
  EXPECT_EQ(table.size(), 6u);
}

TEST(ClaimTableTest, ReleaseLeavesOtherOwnersClaimsAlone) {
  ClaimTable table;
  const std::vector<uint64_t> keys = {1, 2};
  int a = 0, b = 0;
  table.Claim(7, keys, {true, false}, &a);
  table.Claim(7, keys, {false, true}, &b);
  table.Release(7, keys, {true, true}, &a);  // key 2 is b's
  EXPECT_EQ(table.size(), 1u);
  EXPECT_EQ(table.Claim(7, keys, {true, true}, &a), (std::vector<bool>{true, false}));
  table.Release(7, keys, {false, true}, &b);
  table.Release(7, keys, {true, false}, &a);
  EXPECT_EQ(table.size(), 0u);
}

// Owners racing for the same keys: each key goes to exactly one of them.
TEST(ClaimTableTest, EachKeyGoesToOneOfRacingOwners) {
  ClaimTable table;
  constexpr int kOwners = 4;
  constexpr uint64_t kKeys = 2000;
  std::vector<uint64_t> keys(kKeys);
  for (uint64_t k = 0; k < kKeys; ++k) keys[k] = k * 0x9e3779b97f4a7c15ull;
  const std::vector<bool> all(kKeys, true);
  std::vector<std::vector<bool>> held(kOwners);
  int owners[kOwners];
  std::vector<std::thread> threads;
  for (int o = 0; o < kOwners; ++o) {
    threads.emplace_back([&, o] {
      // In slices, so that the owners interleave.
      held[o].assign(kKeys, false);
      for (uint64_t first = 0; first < kKeys; first += 100) {
        std::vector<uint64_t> slice(keys.begin() + first, keys.begin() + first + 100);
        std::vector<bool> got = table.Claim(1, slice, std::vector<bool>(100, true), &owners[o]);
        for (uint64_t k = 0; k < 100; ++k) held[o][first + k] = got[k];
      }
    });
  }
  for (auto& t : threads) t.join();
  for (uint64_t k = 0; k < kKeys; ++k) {
    int holders = 0;
    for (int o = 0; o < kOwners; ++o) holders += held[o][k] ? 1 : 0;
    ASSERT_EQ(holders, 1) << "key " << k;
  }
  EXPECT_EQ(table.size(), kKeys);
  for (int o = 0; o < kOwners; ++o) table.Release(1, keys, held[o], &owners[o]);
  EXPECT_EQ(table.size(), 0u);
}

}  // namespace
}  // namespace kvcache
