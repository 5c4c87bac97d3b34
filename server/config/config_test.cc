#include "server/config/config.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstdio>

namespace kvcache {
namespace {

using ::testing::HasSubstr;

TEST(ConfigTest, DefaultsAreValidAndDocumented) {
  v1::ServerConfig c = DefaultConfig();
  EXPECT_TRUE(ValidateConfig(c).ok()) << ValidateConfig(c);
  EXPECT_EQ(c.listen().tcp_address(), "0.0.0.0:50051");
  EXPECT_EQ(c.listen().unix_socket(), "/tmp/kvcached.sock");
  EXPECT_EQ(c.host_tier().capacity_bytes(), uint64_t{1} << 30);
  EXPECT_EQ(c.host_tier().slab_bytes(), uint64_t{4} << 20);
  EXPECT_EQ(c.limits().max_message_bytes(), uint64_t{64} << 20);
  EXPECT_EQ(c.drain_timeout_seconds(), 10u);
}

TEST(ConfigTest, JsonOverridesOnlyWhatItSets) {
  auto c = ParseConfigJson(R"({"host_tier": {"capacity_bytes": "8388608"},
                               "listen": {"unix_socket": "none"}})");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->host_tier().capacity_bytes(), 8388608u);
  EXPECT_EQ(c->host_tier().slab_bytes(), uint64_t{4} << 20);  // default kept
  EXPECT_EQ(c->listen().unix_socket(), "none");
  EXPECT_EQ(c->listen().tcp_address(), "0.0.0.0:50051");
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
      {"no listener",
       [](auto& c) {
         c.mutable_listen()->set_tcp_address("none");
         c.mutable_listen()->set_unix_socket("none");
       },
       "listen.tcp_address"},
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

}  // namespace
}  // namespace kvcache
