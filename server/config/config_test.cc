#include "server/config/config.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <sys/resource.h>

#include <algorithm>
#include <csignal>
#include <cstdio>
#include <filesystem>
#include <string>
#include <thread>
#include <vector>

#include "server/config/calibration_file.h"

namespace kvcache {
namespace {

using ::testing::HasSubstr;

TEST(ConfigTest, DefaultsAreValidAndDocumented) {
  v1::ServerConfig c = DefaultConfig();
  EXPECT_TRUE(ValidateConfig(c).ok()) << ValidateConfig(c);
  EXPECT_EQ(c.listen().tcp_address(), "127.0.0.1:50051");
  EXPECT_EQ(c.listen().metrics_address(), "127.0.0.1:9464");
  EXPECT_FALSE(c.listen().allow_insecure_remote());
  EXPECT_EQ(c.listen().unix_socket(), "/tmp/kvcached.sock");
  EXPECT_EQ(c.host_tier().capacity_bytes(), uint64_t{1} << 30);
  EXPECT_EQ(c.host_tier().slab_bytes(), uint64_t{4} << 20);
  EXPECT_EQ(c.host_tier().thread_cache_bytes(), uint64_t{256} << 10);
  EXPECT_EQ(c.limits().max_message_bytes(), uint64_t{64} << 20);
  EXPECT_EQ(c.drain_timeout_seconds(), 10u);
  EXPECT_EQ(c.limits().stream_idle_timeout_ms(), 30000u);
  EXPECT_EQ(c.limits().max_streams_per_client(), c.limits().max_concurrent_streams());
  EXPECT_EQ(c.limits().max_concurrent_unary(), 64u);
  EXPECT_EQ(c.limits().data_path_concurrency(), std::max(1u, std::thread::hardware_concurrency()));
  EXPECT_EQ(c.limits().grpc_memory_quota_bytes(), uint64_t{1} << 30);
  EXPECT_EQ(c.limits().keepalive_time_ms(), 30000u);
  EXPECT_EQ(c.limits().keepalive_timeout_ms(), 10000u);
  EXPECT_TRUE(c.gpu_tier().kind().empty());
  EXPECT_TRUE(c.gpu_tier().pin_host_memory());  // takes effect only with a GPU tier
  EXPECT_DOUBLE_EQ(c.checkpoint().ssd_retained_share(), 0.1);
}

TEST(ConfigTest, RemoteListenersNeedAnExplicitOptIn) {
  for (const char* address : {"0.0.0.0:50051", "[::]:50051", "10.1.2.3:7000", "kvhost:50051"}) {
    v1::ServerConfig c = DefaultConfig();
    c.mutable_listen()->set_tcp_address(address);
    absl::Status s = ValidateConfig(c);
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << address;
    EXPECT_THAT(s.message(), HasSubstr("allow_insecure_remote")) << address;
    c.mutable_listen()->set_allow_insecure_remote(true);
    EXPECT_TRUE(ValidateConfig(c).ok()) << address;
  }
  for (const char* address : {"127.0.0.1:1", "127.8.9.10:50051", "localhost:5", "[::1]:50051"}) {
    v1::ServerConfig c = DefaultConfig();
    c.mutable_listen()->set_tcp_address(address);
    EXPECT_TRUE(ValidateConfig(c).ok()) << address;
  }
  EXPECT_FALSE(IsLoopbackAddress("127.evil.example:1"));
  EXPECT_FALSE(IsLoopbackAddress("1270.0.0.1:1"));
}

TEST(ConfigTest, BlockChecksumsAreRequiredUnlessTurnedOff) {
  EXPECT_TRUE(DefaultConfig().security().require_block_checksums());
  auto unset = ParseConfigJson(R"({"security": {"principals_file": ""}})");
  ASSERT_TRUE(unset.ok()) << unset.status();
  EXPECT_TRUE(unset->security().require_block_checksums());

  auto off = ParseConfigJson(R"({"security": {"require_block_checksums": false}})");
  ASSERT_TRUE(off.ok()) << off.status();
  EXPECT_TRUE(off->security().has_require_block_checksums());
  EXPECT_FALSE(off->security().require_block_checksums());
  EXPECT_TRUE(ValidateConfig(*off).ok()) << ValidateConfig(*off);

  auto on = ParseConfigJson(R"({"security": {"requireBlockChecksums": true}})");
  ASSERT_TRUE(on.ok()) << on.status();
  EXPECT_TRUE(on->security().require_block_checksums());

  // Unset after defaults would read as false: validation refuses it.
  v1::ServerConfig c = DefaultConfig();
  c.mutable_security()->clear_require_block_checksums();
  absl::Status s = ValidateConfig(c);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(s.message()), HasSubstr("security.require_block_checksums"));
}

TEST(ConfigTest, TenantShareDefaultsToHalfWithPrincipalsAndIsValidated) {
  v1::ServerConfig c = DefaultConfig();
  EXPECT_DOUBLE_EQ(TenantShare(c.security()), 1.0);
  // A principals file set after the defaults (--principals-file) still halves it.
  c.mutable_security()->set_principals_file("/etc/p.json");
  EXPECT_DOUBLE_EQ(TenantShare(c.security()), 0.5);
  auto set = ParseConfigJson(
      R"({"security": {"principals_file": "/etc/p.json", "tenant_limits": {"max_share": 0.25}}})");
  ASSERT_TRUE(set.ok()) << set.status();
  EXPECT_DOUBLE_EQ(TenantShare(set->security()), 0.25);
  EXPECT_TRUE(ValidateConfig(*set).ok());
  for (double bad : {0.0, -0.5, 1.5}) {
    v1::ServerConfig c = DefaultConfig();
    c.mutable_security()->mutable_tenant_limits()->set_max_share(bad);
    absl::Status s = ValidateConfig(c);
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << bad;
    EXPECT_THAT(s.message(), HasSubstr("security.tenant_limits.max_share")) << bad;
  }
}

TEST(ConfigTest, PerClientStreamCapDefaultsToTheTotal) {
  auto c = ParseConfigJson(R"({"limits": {"max_concurrent_streams": 8}})");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->limits().max_streams_per_client(), 8u);
  EXPECT_TRUE(ValidateConfig(*c).ok());
}

TEST(ConfigTest, ShmDeadlinesAndMappingCapsHaveDefaultsAndTenantCapsFitTheDaemonWide) {
  v1::ServerConfig d = DefaultConfig();
  EXPECT_EQ(d.shm().hello_timeout_ms(), 5000u);
  EXPECT_EQ(d.shm().io_timeout_ms(), 30000u);
  EXPECT_EQ(d.shm().drain_timeout_ms(), 5000u);
  EXPECT_EQ(d.shm().max_mappings(), 16384u);
  EXPECT_EQ(d.shm().max_mapped_bytes(), uint64_t{16} << 40);
  EXPECT_EQ(d.shm().max_tenant_mappings(), 4096u);
  EXPECT_EQ(d.shm().max_tenant_mapped_bytes(), uint64_t{4} << 40);
  // A small daemon-wide cap lowers the tenants' default with it.
  auto c = ParseConfigJson(R"({"shm": {"max_mappings": 100, "max_mapped_bytes": "1048576"}})");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->shm().max_tenant_mappings(), 100u);
  EXPECT_EQ(c->shm().max_tenant_mapped_bytes(), 1048576u);
  EXPECT_TRUE(ValidateConfig(*c).ok()) << ValidateConfig(*c);
  // A tenant's cap above the daemon-wide one is an error naming the field.
  c->mutable_shm()->set_max_tenant_mappings(101);
  absl::Status s = ValidateConfig(*c);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(s.message()), HasSubstr("shm.max_tenant_mappings"));
  c->mutable_shm()->set_max_tenant_mappings(100);
  c->mutable_shm()->set_max_tenant_mapped_bytes(1048577);
  s = ValidateConfig(*c);
  EXPECT_THAT(std::string(s.message()), HasSubstr("shm.max_tenant_mapped_bytes"));
  c->mutable_shm()->set_max_tenant_mapped_bytes(1048576);
  c->mutable_shm()->set_hello_timeout_ms(50);
  s = ValidateConfig(*c);
  EXPECT_THAT(std::string(s.message()), HasSubstr("shm.hello_timeout_ms"));
}

TEST(ConfigTest, JsonOverridesOnlyWhatItSets) {
  auto c = ParseConfigJson(R"({"host_tier": {"capacity_bytes": "8388608"},
                               "listen": {"unix_socket": "none"}})");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->host_tier().capacity_bytes(), 8388608u);
  EXPECT_EQ(c->host_tier().slab_bytes(), uint64_t{4} << 20);  // default kept
  EXPECT_EQ(c->listen().unix_socket(), "none");
  EXPECT_EQ(c->listen().tcp_address(), "127.0.0.1:50051");
}

TEST(ConfigTest, PrintedDefaultsParseBackToTheSameConfig) {
  auto c = ParseConfigJson(ConfigToJson(DefaultConfig()));
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->SerializeAsString(), DefaultConfig().SerializeAsString());
}

TEST(ConfigTest, UnknownFieldsAndBadJsonAreErrors) {
  auto unknown = ParseConfigJson(R"({"host_tier": {"capacity": 1}})");
  EXPECT_EQ(unknown.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(unknown.status().message()), HasSubstr("capacity"));
  EXPECT_EQ(ParseConfigJson("{not json").status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(ConfigTest, MissingFileNamesThePath) {
  auto c = LoadConfigFile("/nonexistent/kvcached.json");
  EXPECT_EQ(c.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(std::string(c.status().message()), HasSubstr("/nonexistent/kvcached.json"));
}

TEST(ConfigTest, FileIsReadAndErrorsNameTheFile) {
  const std::string path = ::testing::TempDir() + "/kvcached_config_test.json";
  std::FILE* f = std::fopen(path.c_str(), "w");
  std::fputs(R"({"logging": {"level": "debug"}})", f);
  std::fclose(f);
  auto c = LoadConfigFile(path);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->logging().level(), "debug");

  f = std::fopen(path.c_str(), "w");
  std::fputs(R"({"logging": {"lvl": "debug"}})", f);
  std::fclose(f);
  auto bad = LoadConfigFile(path);
  EXPECT_THAT(std::string(bad.status().message()), HasSubstr(path));
}

TEST(ConfigTest, LogFormatDefaultsToTextAndTakesLogfmtAndJson) {
  EXPECT_EQ(DefaultConfig().logging().format(), "text");
  for (const std::string format : {"text", "logfmt", "json"}) {
    v1::ServerConfig c = DefaultConfig();
    c.mutable_logging()->set_format(format);
    EXPECT_TRUE(ValidateConfig(c).ok()) << format;
  }
  v1::ServerConfig c = DefaultConfig();
  c.mutable_logging()->set_format("JSON");
  const absl::Status s = ValidateConfig(c);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(s.message()),
              HasSubstr("logging.format is \"JSON\"; it must be text, logfmt or json"));
}

struct BadValue {
  std::string name;
  std::function<void(v1::ServerConfig&)> edit;
  std::string field;
};

TEST(ConfigTest, EachOutOfRangeValueNamesItsField) {
  const std::vector<BadValue> cases = {
      {"tiny message limit", [](auto& c) { c.mutable_limits()->set_max_message_bytes(100); },
       "limits.max_message_bytes"},
      {"slab not power of two", [](auto& c) { c.mutable_host_tier()->set_slab_bytes(3 << 20); },
       "host_tier.slab_bytes"},
      {"slab too small", [](auto& c) { c.mutable_host_tier()->set_slab_bytes(4096); },
       "host_tier.slab_bytes"},
      {"capacity below a slab", [](auto& c) { c.mutable_host_tier()->set_capacity_bytes(1 << 20); },
       "host_tier.capacity_bytes"},
      {"chunk bigger than a message",
       [](auto& c) { c.mutable_limits()->set_fetch_chunk_bytes(uint64_t{128} << 20); },
       "limits.fetch_chunk_bytes"},
      {"default lease beyond max",
       [](auto& c) { c.mutable_limits()->set_default_lease_ttl_ms(700000); },
       "limits.default_lease_ttl_ms"},
      {"bad log level", [](auto& c) { c.mutable_logging()->set_level("loud"); }, "logging.level"},
      {"retained share above 1",
       [](auto& c) { c.mutable_checkpoint()->set_ssd_retained_share(1.5); },
       "checkpoint.ssd_retained_share"},
      {"negative retained share",
       [](auto& c) { c.mutable_checkpoint()->set_ssd_retained_share(-0.1); },
       "checkpoint.ssd_retained_share"},
      {"too many shm workers", [](auto& c) { c.mutable_shm()->set_worker_threads(2000); },
       "shm.worker_threads"},
      {"checkpoint write limit of a few bytes a second",
       [](auto& c) { c.mutable_checkpoint()->set_max_write_bytes_per_second(4096); },
       "checkpoint.max_write_bytes_per_second"},
      {"unknown log format", [](auto& c) { c.mutable_logging()->set_format("xml"); },
       "logging.format"},
      {"huge ssd staging cache",
       [](auto& c) {
         c.mutable_ssd_tier()->set_path("/var/lib/kvcached/ssd.bin");  // checked with a tier
         c.mutable_ssd_tier()->set_staging_cache_bytes(uint64_t{2} << 30);
       },
       "ssd_tier.staging_cache_bytes"},
      {"tiny mmap threshold", [](auto& c) { c.mutable_memory()->set_mmap_threshold_bytes(100); },
       "memory.mmap_threshold_bytes"},
      {"huge mmap threshold",
       [](auto& c) { c.mutable_memory()->set_mmap_threshold_bytes(uint64_t{64} << 20); },
       "memory.mmap_threshold_bytes"},
      {"too many arenas", [](auto& c) { c.mutable_memory()->set_malloc_arena_max(5000); },
       "memory.malloc_arena_max"},
      {"trimming too often", [](auto& c) { c.mutable_memory()->set_trim_interval_ms(1); },
       "memory.trim_interval_ms"},
      {"no listener",
       [](auto& c) {
         c.mutable_listen()->set_tcp_address("none");
         c.mutable_listen()->set_unix_socket("none");
       },
       "listen.tcp_address"},
      {"unknown compression mode",
       [](auto& c) { c.mutable_importance()->set_default_mode("fast"); },
       "importance.default_mode"},
      {"weight above 1", [](auto& c) { c.mutable_importance()->set_alpha(1.5f); },
       "importance.alpha"},
      {"all weights zero",
       [](auto& c) {
         c.mutable_importance()->set_alpha(0);
         c.mutable_importance()->set_beta(0);
         c.mutable_importance()->set_gamma(0);
       },
       "importance.alpha"},
      {"target mass above 1", [](auto& c) { c.mutable_importance()->set_target_mass(1.2); },
       "importance.target_mass"},
      {"negative decay", [](auto& c) { c.mutable_importance()->set_decay_tau(-1); },
       "importance.decay_tau"},
      {"compaction too often",
       [](auto& c) { c.mutable_importance()->set_compaction_interval_ms(1); },
       "importance.compaction_interval_ms"},
      {"pool compaction too often",
       [](auto& c) { c.mutable_host_tier()->set_compaction_interval_ms(5); },
       "host_tier.compaction_interval_ms"},
      {"per-CPU pool caches above 16 MiB",
       [](auto& c) { c.mutable_host_tier()->set_thread_cache_bytes((uint64_t{16} << 20) + 1); },
       "host_tier.thread_cache_bytes"},
      {"pool compaction occupancy above 1",
       [](auto& c) { c.mutable_host_tier()->set_compaction_max_span_occupancy(1.5); },
       "host_tier.compaction_max_span_occupancy"},
      {"idle timeout too short",
       [](auto& c) { c.mutable_limits()->set_stream_idle_timeout_ms(10); },
       "limits.stream_idle_timeout_ms"},
      {"per-client cap above the total",
       [](auto& c) { c.mutable_limits()->set_max_streams_per_client(257); },
       "limits.max_streams_per_client"},
      {"unary limit too high",
       [](auto& c) { c.mutable_limits()->set_max_concurrent_unary(200000); },
       "limits.max_concurrent_unary"},
      {"data path concurrency too high",
       [](auto& c) { c.mutable_limits()->set_data_path_concurrency(5000); },
       "limits.data_path_concurrency"},
      {"memory quota below one message",
       [](auto& c) { c.mutable_limits()->set_grpc_memory_quota_bytes(1 << 20); },
       "limits.grpc_memory_quota_bytes"},
      {"keepalive too frequent", [](auto& c) { c.mutable_limits()->set_keepalive_time_ms(10); },
       "limits.keepalive_time_ms"},
      {"keepalive timeout too short",
       [](auto& c) { c.mutable_limits()->set_keepalive_timeout_ms(10); },
       "limits.keepalive_timeout_ms"},
      {"unknown eviction policy", [](auto& c) { c.mutable_cache()->set_eviction_policy("arc"); },
       "cache.eviction_policy"},
      {"correlated period above a day",
       [](auto& c) { c.mutable_cache()->mutable_lru_k()->set_correlated_period_ms(90000000); },
       "cache.lru_k.correlated_period_ms"},
      {"fewer-than-K penalty above ten years",
       [](auto& c) {
         c.mutable_cache()->mutable_lru_k()->set_fewer_than_k_penalty_ms(uint64_t{1} << 40);
       },
       "cache.lru_k.fewer_than_k_penalty_ms"},
      {"unknown gpu kind", [](auto& c) { c.mutable_gpu_tier()->set_kind("tpu"); }, "gpu_tier.kind"},
      {"gpu slab not power of two",
       [](auto& c) {
         c.mutable_gpu_tier()->set_kind("cuda");
         c.mutable_gpu_tier()->set_slab_bytes(3 << 20);
       },
       "gpu_tier.slab_bytes"},
      {"gpu arena not a multiple of slabs",
       [](auto& c) {
         c.mutable_gpu_tier()->set_kind("host_stand_in");
         c.mutable_gpu_tier()->set_arena_bytes((uint64_t{1} << 30) + 4096);
       },
       "gpu_tier.arena_bytes"},
      {"gpu watermarks crossed",
       [](auto& c) {
         c.mutable_gpu_tier()->set_kind("cuda");
         c.mutable_gpu_tier()->set_low_watermark(0.99);
       },
       "gpu_tier.low_watermark"},
      {"gpu on_unavailable unknown",
       [](auto& c) {
         c.mutable_gpu_tier()->set_kind("cuda");
         c.mutable_gpu_tier()->set_on_unavailable("retry");
       },
       "gpu_tier.on_unavailable"},
      {"retained history too large",
       [](auto& c) { c.mutable_cache()->mutable_lru_k()->set_retained_history(uint64_t{1} << 30); },
       "cache.lru_k.retained_history"},
  };
  for (const BadValue& b : cases) {
    SCOPED_TRACE(b.name);
    v1::ServerConfig c = DefaultConfig();
    b.edit(c);
    absl::Status s = ValidateConfig(c);
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(std::string(s.message()), HasSubstr(b.field));
  }
}

TEST(ConfigTest, ImportanceDefaultsAndExplicitZeros) {
  const v1::ImportanceConfig d = DefaultConfig().importance();
  EXPECT_EQ(d.default_mode(), "off");
  EXPECT_FLOAT_EQ(d.alpha(), 0.6f);
  EXPECT_FLOAT_EQ(d.beta(), 0.3f);
  EXPECT_FLOAT_EQ(d.gamma(), 0.1f);
  EXPECT_EQ(d.calibration_interval_seconds(), 1800u);
  // An explicit 0 switches a term (or calibration) off instead of meaning "default".
  auto c = ParseConfigJson(
      R"({"importance": {"gamma": 0, "calibration_interval_seconds": 0, "sink_tokens": 0}})");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->importance().gamma(), 0.0f);
  EXPECT_EQ(c->importance().calibration_interval_seconds(), 0u);
  EXPECT_EQ(c->importance().sink_tokens(), 0u);
  EXPECT_FLOAT_EQ(c->importance().alpha(), 0.6f);
  EXPECT_TRUE(ValidateConfig(*c).ok());
}

TEST(ConfigTest, FetchChunkLeavesRoomForThePrunedBlockHeader) {
  v1::ServerConfig c = DefaultConfig();
  c.mutable_limits()->set_max_message_bytes(1 << 20);
  // 1 KiB of room is less than a 1024-token block's kept_tokens may take.
  c.mutable_limits()->set_fetch_chunk_bytes((1 << 20) - 1024);
  absl::Status s = ValidateConfig(c);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(s.message()), HasSubstr("limits.fetch_chunk_bytes"));
  EXPECT_THAT(std::string(s.message()), HasSubstr("kept_tokens"));
  EXPECT_GE(kFetchHeaderRoom, 96u + 10 + 5 * 1024);
  c.mutable_limits()->set_fetch_chunk_bytes((1 << 20) - kFetchHeaderRoom);
  EXPECT_TRUE(ValidateConfig(c).ok()) << ValidateConfig(c);
}

TEST(ConfigTest, MaxLeaseTtlIsAtMostADay) {
  v1::ServerConfig c = DefaultConfig();
  c.mutable_limits()->set_max_lease_ttl_ms(uint64_t{25} * 3600 * 1000);
  absl::Status s = ValidateConfig(c);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(s.message()), HasSubstr("limits.max_lease_ttl_ms"));
  c.mutable_limits()->set_max_lease_ttl_ms(uint64_t{24} * 3600 * 1000);
  EXPECT_TRUE(ValidateConfig(c).ok()) << ValidateConfig(c);
}

TEST(ConfigTest, CalibrationMinSamplesBeyondTheSampleStoreIsRejected) {
  v1::ServerConfig c = DefaultConfig();
  c.mutable_importance()->set_calibration_min_samples(kCalibrationSamples + 1);
  absl::Status s = ValidateConfig(c);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(s.message()), HasSubstr("importance.calibration_min_samples"));
  EXPECT_THAT(std::string(s.message()), HasSubstr("8192 calibration samples"));
  c.mutable_importance()->set_calibration_min_samples(kCalibrationSamples);
  EXPECT_TRUE(ValidateConfig(c).ok()) << ValidateConfig(c);
}

TEST(CalibrationFileTest, RoundTripsAndRejectsBadFiles) {
  const std::string path = ::testing::TempDir() + "/kvcached_calibration_test.json";
  std::remove(path.c_str());
  EXPECT_EQ(LoadCalibrationFile(path).status().code(), absl::StatusCode::kNotFound);
  v1::CalibratedWeights w;
  v1::CalibratedWeights::Model* m = w.add_models();
  m->set_namespace_("default");
  m->set_model_id("llama");
  m->set_alpha(0.5f);
  m->set_beta(0.45f);
  m->set_gamma(0.05f);
  ASSERT_TRUE(SaveCalibrationFile(path, w).ok());
  auto back = LoadCalibrationFile(path);
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(back->SerializeAsString(), w.SerializeAsString());

  for (const char* bad : {"{not json", R"({"models": [{"model_id": "x", "alpha": 2}]})",
                          R"({"models": [{"model_id": "x"}]})"}) {
    std::FILE* f = std::fopen(path.c_str(), "w");
    std::fputs(bad, f);
    std::fclose(f);
    auto r = LoadCalibrationFile(path);
    EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument) << bad;
    EXPECT_THAT(std::string(r.status().message()), HasSubstr(path));
  }
  EXPECT_EQ(SaveCalibrationFile("/nonexistent/dir/w.json", w).code(), absl::StatusCode::kInternal);
  std::remove(path.c_str());
}

v1::CalibratedWeights OneModel(const std::string& id, float alpha) {
  v1::CalibratedWeights w;
  v1::CalibratedWeights::Model* m = w.add_models();
  m->set_namespace_("default");
  m->set_model_id(id);
  m->set_alpha(alpha);
  m->set_beta(1 - alpha);
  m->set_gamma(0);
  return w;
}

// The names in `dir`.
std::vector<std::string> FilesIn(const std::string& dir) {
  std::vector<std::string> names;
  for (const auto& e : std::filesystem::directory_iterator(dir)) {
    names.push_back(e.path().filename().string());
  }
  std::sort(names.begin(), names.end());
  return names;
}

class CalibrationSaveTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = ::testing::TempDir() + "/kvcached_calibration_save_test";
    std::filesystem::remove_all(dir_);
    std::filesystem::create_directories(dir_);
    path_ = dir_ + "/weights.json";
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }

  std::string dir_;
  std::string path_;
};

TEST_F(CalibrationSaveTest, ReplacesTheFileAndLeavesNoTemporaryFile) {
  ASSERT_TRUE(SaveCalibrationFile(path_, OneModel("a", 0.5f)).ok());
  ASSERT_TRUE(SaveCalibrationFile(path_, OneModel("b", 0.25f)).ok());
  EXPECT_THAT(FilesIn(dir_), ::testing::ElementsAre("weights.json"));
  auto back = LoadCalibrationFile(path_);
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(back->SerializeAsString(), OneModel("b", 0.25f).SerializeAsString());
}

TEST_F(CalibrationSaveTest, AFailedWriteLeavesThePreviousFileIntact) {
  const v1::CalibratedWeights before = OneModel("a", 0.5f);
  ASSERT_TRUE(SaveCalibrationFile(path_, before).ok());
  // Many models make a file far larger than the file-size limit set below,
  // so the write of the temporary file fails (EFBIG) part way.
  v1::CalibratedWeights big;
  for (int i = 0; i < 1000; ++i)
    *big.add_models() = OneModel("model" + std::to_string(i), 0.5f).models(0);
  rlimit old_limit;
  ASSERT_EQ(::getrlimit(RLIMIT_FSIZE, &old_limit), 0);
  auto old_handler = std::signal(SIGXFSZ, SIG_IGN);
  rlimit small = old_limit;
  small.rlim_cur = 4096;
  ASSERT_EQ(::setrlimit(RLIMIT_FSIZE, &small), 0);
  const absl::Status failed = SaveCalibrationFile(path_, big);
  ::setrlimit(RLIMIT_FSIZE, &old_limit);
  std::signal(SIGXFSZ, old_handler);

  EXPECT_EQ(failed.code(), absl::StatusCode::kInternal) << failed;
  EXPECT_THAT(std::string(failed.message()), HasSubstr("cannot write"));
  EXPECT_THAT(FilesIn(dir_), ::testing::ElementsAre("weights.json"));
  auto back = LoadCalibrationFile(path_);
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(back->SerializeAsString(), before.SerializeAsString());
}

TEST_F(CalibrationSaveTest, AnUnreadableFileIsNotMistakenForAMissingOne) {
  // A directory where the file should be: it exists but cannot be read as one.
  std::filesystem::create_directories(path_);
  auto r = LoadCalibrationFile(path_);
  EXPECT_NE(r.status().code(), absl::StatusCode::kNotFound) << r.status();
  EXPECT_FALSE(r.ok());
  EXPECT_THAT(std::string(r.status().message()), HasSubstr(path_));
}

TEST(ConfigTest, EvictionPolicyDefaultsAndExplicitZeros) {
  const v1::CacheConfig d = DefaultConfig().cache();
  EXPECT_EQ(d.eviction_policy(), "lru_k");
  EXPECT_EQ(d.lru_k().correlated_period_ms(), 1000u);
  EXPECT_EQ(d.lru_k().retained_history(), 65536u);
  EXPECT_EQ(d.lru_k().fewer_than_k_penalty_ms(), 600000u);
  // 0 is a setting here (every use counts; keep no history), not "default".
  auto c = ParseConfigJson(R"({"cache": {"eviction_policy": "lru",
                                         "lru_k": {"correlated_period_ms": 0,
                                                   "retained_history": "0",
                                                   "fewer_than_k_penalty_ms": "0"}}})");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->cache().eviction_policy(), "lru");
  EXPECT_EQ(c->cache().lru_k().correlated_period_ms(), 0u);
  EXPECT_EQ(c->cache().lru_k().retained_history(), 0u);
  EXPECT_EQ(c->cache().lru_k().fewer_than_k_penalty_ms(), 0u);
  EXPECT_TRUE(ValidateConfig(*c).ok());
}

TEST(ConfigTest, PoolThreadCachesDefaultOnAndTurnOffWithAnExplicitZero) {
  EXPECT_EQ(DefaultConfig().host_tier().thread_cache_bytes(), uint64_t{256} << 10);
  auto c = ParseConfigJson(R"({"host_tier": {"thread_cache_bytes": "0"}})");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->host_tier().thread_cache_bytes(), 0u);
  EXPECT_TRUE(ValidateConfig(*c).ok());
}

}  // namespace
}  // namespace kvcache

namespace kvcache {
namespace {

TEST(ConfigTest, MemoryDefaultsAndExplicitZeros) {
  const v1::ServerConfig d = DefaultConfig();
  EXPECT_EQ(d.ssd_tier().staging_cache_bytes(), uint64_t{8} << 20);
  EXPECT_EQ(d.memory().mmap_threshold_bytes(), uint64_t{64} << 10);
  EXPECT_EQ(d.memory().malloc_arena_max(), 4u);
  EXPECT_EQ(d.memory().trim_interval_ms(), 1000u);
  // 0 is a setting of its own for each: keep none, glibc's defaults, never.
  auto c = ParseConfigJson(
      R"({"ssd_tier": {"staging_cache_bytes": 0}, "memory": {"mmap_threshold_bytes": 0, )"
      R"("malloc_arena_max": 0, "trim_interval_ms": 0}})");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->ssd_tier().staging_cache_bytes(), 0u);
  EXPECT_EQ(c->memory().mmap_threshold_bytes(), 0u);
  EXPECT_EQ(c->memory().malloc_arena_max(), 0u);
  EXPECT_EQ(c->memory().trim_interval_ms(), 0u);
  EXPECT_TRUE(ValidateConfig(*c).ok());
}

TEST(ConfigTest, RemoteTierIsOffByDefaultAndNeedsAKeyFileAndHostPortSeeds) {
  const v1::ServerConfig d = DefaultConfig();
  EXPECT_TRUE(d.remote_tier().seeds().empty());
  EXPECT_EQ(d.remote_tier().io_timeout_ms(), 500u);
  EXPECT_EQ(d.remote_tier().write_queue_blocks(), 1024u);
  EXPECT_EQ(d.remote_tier().max_discover_blocks(), 256u);
  auto c = ParseConfigJson(R"({"remote_tier": {"seeds": ["10.0.0.1:6379"]}})");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_THAT(ValidateConfig(*c).message(), HasSubstr("remote_tier.key_file is empty"));
  c->mutable_remote_tier()->set_key_file("/etc/kvcached/shared.key");
  EXPECT_TRUE(ValidateConfig(*c).ok()) << ValidateConfig(*c);
  for (const char* bad : {"10.0.0.1", ":6379", "host:0", "host:70000", "host:port"}) {
    c->mutable_remote_tier()->set_seeds(0, bad);
    EXPECT_THAT(ValidateConfig(*c).message(), HasSubstr("each must be HOST:PORT")) << bad;
  }
  c->mutable_remote_tier()->set_seeds(0, "[::1]:7000");
  EXPECT_TRUE(ValidateConfig(*c).ok());
  c->mutable_remote_tier()->set_io_timeout_ms(60001);
  EXPECT_THAT(ValidateConfig(*c).message(), HasSubstr("remote_tier.io_timeout_ms"));
}

TEST(ConfigTest, StatusPageDefaultsAndBounds) {
  const v1::StatusPageConfig d = DefaultConfig().status_page();
  EXPECT_TRUE(d.enabled());
  EXPECT_FALSE(d.show_tokens());
  EXPECT_EQ(d.recent_events(), 50u);
  auto c = ParseConfigJson(
      R"({"status_page": {"enabled": false, "show_tokens": true, "recent_events": 7}})");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_FALSE(c->status_page().enabled());
  EXPECT_TRUE(c->status_page().show_tokens());
  EXPECT_EQ(c->status_page().recent_events(), 7u);
  EXPECT_TRUE(ValidateConfig(*c).ok());
  c->mutable_status_page()->set_recent_events(10001);
  EXPECT_THAT(std::string(ValidateConfig(*c).message()), HasSubstr("status_page.recent_events"));
}

}  // namespace
}  // namespace kvcache
