// What the default config lets a host tier of N bytes hold: at least 0.95 N
// of committed KV, with or without an SSD tier below it (the share the
// append staging, the watermarks and the slab pool's rounding leave). The
// cache is built from DefaultConfig() exactly as the daemon builds it
// (CacheOptionsFromConfig, HostPoolOptionsFromConfig,
// EvictionPolicyFromConfig) and filled well past its capacity with blocks of
// a real model's layout.
#include <cstdio>
#include <memory>
#include <vector>

#include "gtest/gtest.h"
#include "server/config/config.h"
#include "server/core/cache.h"
#include "server/core/memory_tier.h"
#include "server/daemon/config_translation.h"

namespace kvcache {
namespace {

constexpr uint64_t kCapacity = uint64_t{128} << 20;
constexpr uint32_t kSequenceBlocks = 8;
const ModelKey kModel{"default", "llama-3-8b"};
// Llama-3-8B: 32 layers x 8 KV heads x 128 dims, fp16, 16-token blocks: 2 MiB.
const ModelLayout kLayout{32, 8, 128, DType::kFp16, 16};

class CapacityTest : public ::testing::Test {
 protected:
  // A cache as the daemon makes it from the default config with a host tier
  // of kCapacity; `lower` (may be null) is the tier below it.
  std::unique_ptr<Cache> DefaultCache(std::shared_ptr<Tier> lower) {
    v1::ServerConfig config = DefaultConfig();
    config.mutable_host_tier()->set_capacity_bytes(kCapacity);
    auto pool = SlabPool::Create(HostPoolOptionsFromConfig(config.host_tier()));
    EXPECT_TRUE(pool.ok()) << pool.status();
    std::unique_ptr<EvictionPolicy> lower_policy;
    if (lower != nullptr) lower_policy = EvictionPolicyFromConfig(config.cache(), &clock_);
    auto cache = std::make_unique<Cache>(CacheOptionsFromConfig(config), *std::move(pool),
                                         EvictionPolicyFromConfig(config.cache(), &clock_), &clock_,
                                         std::move(lower), std::move(lower_policy));
    auto registered = cache->RegisterModel(kModel, kLayout);
    EXPECT_TRUE(registered.ok()) << registered.status();
    return cache;
  }

  // Appends distinct sequences of kSequenceBlocks blocks until twice the
  // capacity went in; with a lower tier the migrator runs between appends,
  // as the daemon's maintenance loop does.
  void Fill(Cache& cache) {
    const uint64_t sequence_bytes = kSequenceBlocks * kLayout.BlockBytes();
    const std::vector<std::byte> kv(sequence_bytes, std::byte{7});
    // The default config requires each block's checksum.
    const std::vector<uint64_t> checksums(kSequenceBlocks,
                                          Checksum(std::span(kv).first(kLayout.BlockBytes())));
    for (uint32_t s = 0; s * sequence_bytes < 2 * kCapacity; ++s) {
      std::vector<Token> tokens(kSequenceBlocks * kLayout.block_tokens);
      for (size_t t = 0; t < tokens.size(); ++t) tokens[t] = s * 100'003u + static_cast<Token>(t);
      auto session = cache.BeginAppend(kModel, tokens, 0, {}, checksums);
      ASSERT_TRUE(session.ok()) << session.status();
      ASSERT_TRUE((*session)->Write(kv).ok());
      auto committed = (*session)->Commit();
      ASSERT_TRUE(committed.ok()) << committed.status();
      cache.tiers().Migrate();
    }
  }

  SystemClock clock_;
};

TEST_F(CapacityTest, TheDefaultHostTierHoldsAtLeast95PercentOfItsCapacityInKv) {
  std::unique_ptr<Cache> cache = DefaultCache(nullptr);
  Fill(*cache);
  const CacheStats stats = cache->GetStats();
  const double held = static_cast<double>(stats.payload_bytes) / kCapacity;
  std::printf("host tier alone: %.4f of capacity holds KV (%llu blocks)\n", held,
              static_cast<unsigned long long>(stats.blocks));
  EXPECT_GT(stats.capacity_evictions, 0u);
  EXPECT_GE(held, 0.95);
}

TEST_F(CapacityTest, TheDefaultHostTierOverAnSsdTierHoldsAtLeast95PercentOfItsCapacityInKv) {
  std::unique_ptr<Cache> cache = DefaultCache(MemoryTier::Create(4 * kCapacity));
  Fill(*cache);
  const CacheStats stats = cache->GetStats();
  const double held = static_cast<double>(stats.payload_bytes) / kCapacity;
  std::printf("host tier over a lower tier: %.4f of capacity holds KV, %llu blocks below\n", held,
              static_cast<unsigned long long>(stats.tiers.lower[0].blocks));
  EXPECT_GT(stats.tiers.lower[0].blocks, 0u);
  EXPECT_GE(held, 0.95);
}

}  // namespace
}  // namespace kvcache
