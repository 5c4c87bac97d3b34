// The ordered list of levels (ServerConfig.tiers): its default, and the
// lists ValidateConfig refuses, each with an error that names the problem.
#include "server/config/tier_list.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "server/config/config.h"

namespace kvcache {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

v1::ServerConfig WithSsd() {
  v1::ServerConfig c = DefaultConfig();
  c.mutable_ssd_tier()->set_path("/var/lib/kvcached/ssd.bin");
  return c;
}

std::string ErrorOf(const v1::ServerConfig& c) {
  const absl::Status s = ValidateConfig(c);
  EXPECT_TRUE(absl::IsInvalidArgument(s)) << s;
  return std::string(s.message());
}

TEST(TierListTest, TheDefaultIsHostThenSsdWhenItHasAPath) {
  EXPECT_THAT(TierListOf(DefaultConfig()), ElementsAre("host"));
  EXPECT_THAT(TierListOf(WithSsd()), ElementsAre("host", "ssd"));
  EXPECT_TRUE(ValidateConfig(DefaultConfig()).ok());
  EXPECT_TRUE(ValidateConfig(WithSsd()).ok());
}

TEST(TierListTest, AnExplicitListIsTakenAsWritten) {
  v1::ServerConfig c = WithSsd();
  c.add_tiers("host");
  c.add_tiers("ssd");
  EXPECT_THAT(TierListOf(c), ElementsAre("host", "ssd"));
  EXPECT_TRUE(ValidateConfig(c).ok()) << ValidateConfig(c);
  v1::ServerConfig host_only = DefaultConfig();
  host_only.add_tiers("host");
  EXPECT_TRUE(ValidateConfig(host_only).ok()) << ValidateConfig(host_only);
}

TEST(TierListTest, BadListsAreRefusedByName) {
  v1::ServerConfig ssd_first = WithSsd();
  ssd_first.add_tiers("ssd");
  ssd_first.add_tiers("host");
  EXPECT_THAT(ErrorOf(ssd_first), HasSubstr("the first level must be \"host\""));

  v1::ServerConfig unknown = DefaultConfig();
  unknown.add_tiers("host");
  unknown.add_tiers("tape");
  EXPECT_THAT(ErrorOf(unknown), HasSubstr("\"tape\" is not a level kvcached has (host, ssd)"));

  v1::ServerConfig twice = WithSsd();
  for (const char* t : {"host", "ssd", "ssd"}) twice.add_tiers(t);
  EXPECT_THAT(ErrorOf(twice), HasSubstr("\"ssd\" is listed twice"));

  v1::ServerConfig no_path = DefaultConfig();
  no_path.add_tiers("host");
  no_path.add_tiers("ssd");
  EXPECT_THAT(ErrorOf(no_path), HasSubstr("\"ssd\" needs ssd_tier.path"));

  v1::ServerConfig unlisted = WithSsd();
  unlisted.add_tiers("host");
  EXPECT_THAT(ErrorOf(unlisted), HasSubstr("ssd_tier.path is set but \"ssd\" is not listed"));
}

}  // namespace
}  // namespace kvcache
