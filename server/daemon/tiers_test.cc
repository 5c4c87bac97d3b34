// The levels below host memory as the daemon opens them from its config
// (LowerLevelsFromConfig): none by default, a real SSD tier file when the
// list has "ssd", and a store that cannot be opened refused or skipped as
// ssd_tier.on_open_failure says.
#include "server/daemon/tiers.h"

#include <unistd.h>

#include <filesystem>
#include <string>

#include "gtest/gtest.h"
#include "server/config/config.h"

namespace kvcache {
namespace {

class TiersTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = std::filesystem::temp_directory_path() /
           ("kvcache_tiers_test_" + std::to_string(::getpid()));
    std::filesystem::create_directories(dir_);
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }

  v1::ServerConfig WithSsdAt(const std::filesystem::path& path) const {
    v1::ServerConfig c = DefaultConfig();
    c.mutable_ssd_tier()->set_path(path.string());
    c.mutable_ssd_tier()->set_capacity_bytes(uint64_t{32} << 20);
    c.mutable_ssd_tier()->set_region_bytes(uint64_t{1} << 20);
    c.mutable_ssd_tier()->set_direct_io(false);
    return c;
  }

  std::filesystem::path dir_;
  ManualClock clock_;
};

TEST_F(TiersTest, TheDefaultHasNoLevelBelowHost) {
  auto levels = LowerLevelsFromConfig(DefaultConfig(), &clock_);
  ASSERT_TRUE(levels.ok()) << levels.status();
  EXPECT_TRUE(levels->empty());
}

TEST_F(TiersTest, SsdInTheListOpensTheSsdTierWithItsOwnPolicy) {
  v1::ServerConfig c = WithSsdAt(dir_ / "ssd.bin");
  c.add_tiers("host");
  c.add_tiers("ssd");
  ASSERT_TRUE(ValidateConfig(c).ok()) << ValidateConfig(c);
  auto levels = LowerLevelsFromConfig(c, &clock_);
  ASSERT_TRUE(levels.ok()) << levels.status();
  ASSERT_EQ(levels->size(), 1u);
  EXPECT_EQ((*levels)[0].tier->GetStats().kind, "ssd");
  EXPECT_NE((*levels)[0].policy, nullptr);
  EXPECT_TRUE(std::filesystem::exists(dir_ / "ssd.bin"));
}

TEST_F(TiersTest, AStoreThatCannotOpenIsRefusedOrSkipped) {
  v1::ServerConfig c = WithSsdAt(dir_ / "no" / "such" / "dir" / "ssd.bin");
  auto refused = LowerLevelsFromConfig(c, &clock_);
  EXPECT_FALSE(refused.ok());
  EXPECT_NE(refused.status().message().find("ssd tier at"), std::string::npos) << refused.status();
  c.mutable_ssd_tier()->set_on_open_failure("skip");
  auto skipped = LowerLevelsFromConfig(c, &clock_);
  ASSERT_TRUE(skipped.ok()) << skipped.status();
  EXPECT_TRUE(skipped->empty());
}

}  // namespace
}  // namespace kvcache
