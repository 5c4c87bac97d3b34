#include "completion.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

namespace kvcache::ctl {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::IsEmpty;
using ::testing::Not;

// A small app shaped like kvcachectl's.
class CompletionTest : public ::testing::Test {
 protected:
  CompletionTest() : app_("test tool", "tool") {
    app_.add_option("-t,--target", target_, "address");
    app_.add_option("--data-path", path_, "path")->check(CLI::IsMember({"auto", "grpc", "shm"}));
    app_.add_flag("--json", json_, "json");
    CLI::App* lookup = app_.add_subcommand("lookup", "look up");
    lookup->add_option("-m,--model", model_, "model")->required();
    lookup->add_option("--tokens-file", file_, "file");
    CLI::App* policy = app_.add_subcommand("policy", "policy");
    policy->add_option("--weights", weights_, "a b g")->expected(3);
    CLI::App* checkpoint = app_.add_subcommand("checkpoint", "checkpoints");
    checkpoint->add_option("action", action_, "action")
        ->check(CLI::IsMember({"list", "verify", "now"}));
    checkpoint->add_option("sequence", sequence_, "seq");
  }
  CLI::App app_;
  std::string target_, path_, model_, file_, action_;
  std::vector<float> weights_;
  uint64_t sequence_ = 0;
  bool json_ = false;
};

TEST_F(CompletionTest, ChoicesComeFromIsMember) {
  EXPECT_THAT(OptionChoices(*app_.get_option("--data-path")), ElementsAre("auto", "grpc", "shm"));
  EXPECT_THAT(OptionChoices(*app_.get_option("--target")), IsEmpty());
}

TEST_F(CompletionTest, BashScriptNamesEverySubcommandAndOption) {
  const std::string script = BashCompletion(app_);
  EXPECT_THAT(script, HasSubstr("local subcommands='lookup policy checkpoint'"));
  EXPECT_THAT(script, HasSubstr("local global_opts='-h --help -t --target --data-path --json'"));
  EXPECT_THAT(script, HasSubstr("    lookup)\n      opts='-h --help -m --model --tokens-file'"));
  EXPECT_THAT(script, HasSubstr("positionals=('list verify now' '')"));
  EXPECT_THAT(script, HasSubstr("--weights) skip=3 ;;"));
  EXPECT_THAT(script, HasSubstr("-t|--target) skip=1 ;;"));
  EXPECT_THAT(script, Not(HasSubstr("--json) skip")));  // a flag takes no value
  EXPECT_THAT(script, HasSubstr("--data-path)\n      COMPREPLY=($(compgen -W 'auto grpc shm'"));
  EXPECT_THAT(script, HasSubstr("--tokens-file)\n      COMPREPLY=($(compgen -f"));
  EXPECT_THAT(script, HasSubstr("complete -F _tool tool\n"));
}

TEST_F(CompletionTest, NewSubcommandsAppearWithoutChangingTheGenerator) {
  app_.add_subcommand("top", "live view");
  EXPECT_THAT(BashCompletion(app_), HasSubstr("local subcommands='lookup policy checkpoint top'"));
}

TEST_F(CompletionTest, ZshLoadsTheBashScriptThroughBashcompinit) {
  const std::string script = ZshCompletion(app_);
  EXPECT_THAT(script, HasSubstr("bashcompinit"));
  EXPECT_THAT(script, HasSubstr(BashCompletion(app_)));
}

}  // namespace
}  // namespace kvcache::ctl
