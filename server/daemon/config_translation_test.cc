#include "server/daemon/config_translation.h"

#include <gtest/gtest.h>

#include "server/config/config.h"

namespace kvcache {
namespace {

TEST(ConfigTranslationTest, DisabledValuesBecomeEmpty) {
  EXPECT_EQ(Enabled("none"), "");
  EXPECT_EQ(Enabled("127.0.0.1:50051"), "127.0.0.1:50051");
  EXPECT_EQ(Enabled(""), "");
}

TEST(ConfigTranslationTest, TheSharedMemorySocketFollowsTheGrpcSocketUnlessSet) {
  v1::ListenConfig listen;
  listen.set_unix_socket("/run/kvcached/kvcached.sock");
  EXPECT_EQ(ShmSocketPath(listen), "/run/kvcached/kvcached.sock.shm");
  listen.set_shm_socket("/run/kvcached/data.shm");
  EXPECT_EQ(ShmSocketPath(listen), "/run/kvcached/data.shm");
  listen.set_shm_socket("none");
  EXPECT_EQ(ShmSocketPath(listen), "");
  listen.clear_shm_socket();
  listen.set_unix_socket("none");
  EXPECT_EQ(ShmSocketPath(listen), "");
}

TEST(ConfigTranslationTest, CacheOptionsTakeTheHostTiersFractionsAndTheLimits) {
  v1::ServerConfig config = DefaultConfig();
  config.mutable_host_tier()->set_capacity_bytes(1000 << 20);
  config.mutable_host_tier()->set_append_staging_fraction(0.25);
  config.mutable_host_tier()->set_metadata_fraction(0.125);
  config.mutable_limits()->set_max_models(17);
  config.mutable_ssd_tier()->set_promote_on_fetch(false);
  config.mutable_security()->set_require_block_checksums(false);
  config.mutable_importance()->set_default_mode("quantize");
  config.mutable_importance()->set_sink_tokens(7);
  const CacheOptions o = CacheOptionsFromConfig(config);
  EXPECT_EQ(o.append_staging_bytes, uint64_t{250} << 20);
  EXPECT_EQ(o.max_metadata_bytes, uint64_t{125} << 20);
  EXPECT_EQ(o.max_models, 17u);
  EXPECT_FALSE(o.tiers.promote_on_fetch);
  EXPECT_EQ(o.tiers.host_high_watermark, config.host_tier().high_watermark());
  EXPECT_FALSE(o.require_block_checksums);
  EXPECT_EQ(o.importance.default_policy.mode, CompressionMode::kQuantize);
  EXPECT_EQ(o.importance.default_policy.params.sink_tokens, 7u);
  EXPECT_EQ(o.namespace_share, TenantShare(config.security()));
}

TEST(ConfigTranslationTest, TheEvictionPolicyIsTheOneNamed) {
  v1::CacheConfig c;
  c.set_eviction_policy("lru");
  EXPECT_EQ(EvictionPolicyFromConfig(c, SystemClock::Get())->name(), "lru");
  c.set_eviction_policy("lru_k");
  EXPECT_EQ(EvictionPolicyFromConfig(c, SystemClock::Get())->name(), "lru_k");
}

TEST(ConfigTranslationTest, TheHostPoolIsTheHostTiers) {
  v1::HostTierConfig host;
  host.set_capacity_bytes(64 << 20);
  host.set_slab_bytes(2 << 20);
  host.set_min_class_bytes(4096);
  host.set_thread_cache_bytes(0);
  const SlabPoolOptions o = HostPoolOptionsFromConfig(host);
  EXPECT_EQ(o.capacity_bytes, uint64_t{64} << 20);
  EXPECT_EQ(o.slab_bytes, uint64_t{2} << 20);
  EXPECT_EQ(o.min_class_bytes, 4096u);
  EXPECT_EQ(o.thread_cache_bytes, 0u);
  host.set_thread_cache_bytes(1 << 20);
  EXPECT_EQ(HostPoolOptionsFromConfig(host).thread_cache_bytes, uint64_t{1} << 20);
}

}  // namespace
}  // namespace kvcache
