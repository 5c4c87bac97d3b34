// Keyed block hashes through the Cache: the same tokens have other chain keys
// in every (namespace, model), and a restore of images written under other
// keys (a checkpoint from before keys were keyed) re-hashes them.
#include <memory>
#include <string>
#include <vector>

#include "absl/hash/hash.h"
#include "server/core/cache_test_util.h"
#include "server/core/checkpoint_source.h"

namespace kvcache {
namespace {

using cache_test::Append;
using cache_test::Ids;
using cache_test::kSlab;
using cache_test::Mid;
using cache_test::PlanHolds;
using cache_test::Seq;
using cache_test::TestModel;

// Stands in for the daemon's HMAC: distinct keys per (namespace, model).
BlockHashKeys TestKeys(const ModelKey& model) {
  BlockHashKeys keys;
  const size_t h = absl::HashOf(model.ns, model.model_id);
  for (size_t i = 0; i < keys.lookup.size(); ++i) {
    keys.lookup[i] = static_cast<uint8_t>(h >> (i % 8 * 8)) ^ static_cast<uint8_t>(i);
    keys.chain[i] = static_cast<uint8_t>(h >> (i % 8 * 8)) ^ static_cast<uint8_t>(3 * i + 1);
  }
  return keys;
}

class CacheKeysTest : public ::testing::Test {
 protected:
  std::unique_ptr<Cache> MakeCache(bool keyed) {
    auto pool = SlabPool::Create(
        {.capacity_bytes = 64 * kSlab, .slab_bytes = kSlab, .min_class_bytes = 64});
    EXPECT_TRUE(pool.ok()) << pool.status();
    CacheOptions options;
    if (keyed) options.block_hash_keys = TestKeys;
    return std::make_unique<Cache>(options, *std::move(pool), NewLruKPolicy({}, &clock_), &clock_);
  }
  static std::vector<uint64_t> KeysOf(const LookupResult& r) {
    std::vector<uint64_t> keys;
    for (const BlockInfo& b : r.blocks) keys.push_back(b.key);
    return keys;
  }

  ManualClock clock_;
};

TEST_F(CacheKeysTest, SameTokensHaveOtherKeysInEveryNamespaceAndModel) {
  std::unique_ptr<Cache> cache = MakeCache(/*keyed=*/true);
  const TestModel a = Mid();
  TestModel b = Mid();
  b.key.ns = "other";
  TestModel c = Mid();
  c.key.model_id = "mid2";
  const std::vector<Token> tokens = Seq(Ids{1, 2, 3});
  std::vector<std::vector<uint64_t>> keys;
  for (const TestModel& m : {a, b, c}) {
    ASSERT_TRUE(cache->RegisterModel(m.key, m.layout).ok());
    ASSERT_TRUE(Append(*cache, m, tokens).ok());
    auto r = cache->Lookup(m.key, tokens);
    ASSERT_TRUE(r.ok()) << r.status();
    ASSERT_EQ(r->matched_tokens, tokens.size());
    keys.push_back(KeysOf(*r));
  }
  for (size_t i = 0; i < keys.size(); ++i) {
    for (size_t j = i + 1; j < keys.size(); ++j) {
      for (size_t k = 0; k < keys[i].size(); ++k) EXPECT_NE(keys[i][k], keys[j][k]) << i << j << k;
    }
  }
  // Nor are they the unkeyed hashes anyone could compute.
  uint64_t unkeyed = 0;
  for (size_t k = 0; k < 3; ++k) {
    unkeyed = BlockHasher::Unkeyed()->ChainKey(
        unkeyed, std::span<const Token>(tokens).subspan(k * cache_test::kBt, cache_test::kBt));
    EXPECT_NE(keys[0][k], unkeyed);
  }
}

TEST_F(CacheKeysTest, RestoreRehashesImagesWrittenUnderOtherKeys) {
  // Written by an unkeyed cache (as a checkpoint from before keyed hashes),
  // restored into a keyed one.
  std::unique_ptr<Cache> source = MakeCache(/*keyed=*/false);
  const TestModel m = Mid();
  ASSERT_TRUE(source->RegisterModel(m.key, m.layout).ok());
  const std::vector<std::vector<Token>> sequences = {Seq(Ids{1, 2, 3}), Seq(Ids{1, 2, 4}),
                                                     Seq(Ids{1, 5}), Seq(Ids{6, 7})};
  for (const auto& s : sequences) ASSERT_TRUE(Append(*source, m, s).ok());
  const std::vector<ModelImage> models = CheckpointSource(source.get()).CaptureModels();
  ASSERT_EQ(models.size(), 1u);
  std::vector<BlockImage> images;
  ASSERT_EQ(CheckpointSource(source.get()).CaptureBlocks(m.key, models[0].blocks, &images), 0u);
  ASSERT_EQ(images.size(), 7u);

  std::unique_ptr<Cache> target = MakeCache(/*keyed=*/true);
  CheckpointSource restore(target.get());
  ASSERT_TRUE(restore.RestoreModel(models[0]).ok());
  for (BlockImage& image : images) {
    auto host = restore.AllocateRestoredPayload(image.seal.size);
    ASSERT_TRUE(host.ok()) << host.status();
    std::span<const std::byte> bytes = image.host->data();
    std::copy(bytes.begin(), bytes.end(), host->data().begin());
    image.host = PinnedBlock(std::move(*host).Seal(image.key, image.seal), PinReason::kCheckpoint);
    EXPECT_EQ(restore.RestoreBlock(m.key, std::move(image)), RestoreOutcome::kRestored);
  }
  restore.EndRestore();
  EXPECT_EQ(target->GetStats().blocks, 7u);
  for (const auto& s : sequences) {
    auto plan = target->PrepareFetch(m.key, {.tokens = s});
    ASSERT_TRUE(plan.ok()) << plan.status();
    EXPECT_EQ(plan->matched_tokens, s.size());
    EXPECT_TRUE(PlanHolds(*plan, m, s));
    auto before = source->Lookup(m.key, s);
    auto after = target->Lookup(m.key, s);
    ASSERT_TRUE(before.ok() && after.ok());
    ASSERT_EQ(after->blocks.size(), before->blocks.size());
    for (size_t k = 0; k < after->blocks.size(); ++k) {
      EXPECT_NE(after->blocks[k].key, before->blocks[k].key);  // keyed now
      EXPECT_EQ(after->blocks[k].checksum, before->blocks[k].checksum);
    }
  }
  // Appending the same tokens again finds them cached under the new keys.
  auto again = Append(*target, m, sequences[0]);
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_EQ(again->stored_blocks, 0u);
}

}  // namespace
}  // namespace kvcache
