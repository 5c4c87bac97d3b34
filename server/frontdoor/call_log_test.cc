// Request ids and the call log: ids are 16 hex digits, models are named as
// the cache names them, and a failed call is one event with its fields.
#include "server/frontdoor/call_log.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <spdlog/sinks/ostream_sink.h>
#include <spdlog/spdlog.h>

#include <set>
#include <sstream>

#include "server/logging/log_format.h"

namespace kvcache {
namespace {

using ::testing::HasSubstr;
using ::testing::MatchesRegex;
using ::testing::Not;

TEST(CallLogTest, NewRequestIdsAreRandomHex) {
  std::set<std::string> ids;
  for (int i = 0; i < 1000; ++i) {
    const std::string id = NewRequestId();
    EXPECT_THAT(id, MatchesRegex("[0-9a-f]{16}"));
    ids.insert(id);
  }
  EXPECT_EQ(ids.size(), 1000u);
}

TEST(CallLogTest, ModelFieldNamesTheNamespace) {
  EXPECT_EQ(ModelField({"", "llama"}), "default/llama");
  EXPECT_EQ(ModelField({"team-a", "llama"}), "team-a/llama");
  EXPECT_EQ(ModelField({"team-a", ""}), "");
}

class CallLogEventsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    previous_ = spdlog::default_logger();
    auto logger = std::make_shared<spdlog::logger>(
        "", std::make_shared<spdlog::sinks::ostream_sink_st>(stream_));
    logger->set_formatter(NewLogFormatter(LogFormat::kLogfmt));
    logger->set_level(spdlog::level::info);
    spdlog::set_default_logger(logger);
  }
  void TearDown() override { spdlog::set_default_logger(previous_); }

  std::ostringstream stream_;
  std::shared_ptr<spdlog::logger> previous_;
};

TEST_F(CallLogEventsTest, FailedCallIsOneEventWithItsFields) {
  LogCallDone({.method = "Lookup",
               .request_id = "5f3a",
               .peer = "unix:",
               .model = "default/m",
               .status = absl::NotFoundError("model \"m\" is not registered"),
               .latency = absl::Microseconds(1500)});
  const std::string out = stream_.str();
  EXPECT_EQ(std::count(out.begin(), out.end(), '\n'), 1);
  EXPECT_THAT(out, HasSubstr("level=info msg=\"call failed\" request_id=5f3a method=Lookup "
                             "code=NOT_FOUND peer=unix: model=default/m latency_ms=1.5 "
                             "message=\"model \\\"m\\\" is not registered\""));
}

TEST_F(CallLogEventsTest, LevelsFollowTheCode) {
  EXPECT_TRUE(ShouldLogCall(absl::StatusCode::kInvalidArgument));
  EXPECT_FALSE(ShouldLogCall(absl::StatusCode::kOk));  // debug
  LogCallDone({.method = "Fetch", .request_id = "a", .status = absl::OkStatus()});
  LogCallDone({.method = "Append",
               .request_id = "b",
               .status = absl::ResourceExhaustedError("x"),
               .bytes = 4096});
  LogCallDone({.method = "Fetch", .request_id = "c", .status = absl::DataLossError("y")});
  const std::string out = stream_.str();
  EXPECT_THAT(out, Not(HasSubstr("request_id=a")));
  EXPECT_THAT(out, HasSubstr("level=warn msg=\"call failed\" request_id=b method=Append "
                             "code=RESOURCE_EXHAUSTED"));
  EXPECT_THAT(out, HasSubstr("bytes=4096"));
  EXPECT_THAT(out, HasSubstr("level=error msg=\"call failed\" request_id=c"));
  spdlog::default_logger()->set_level(spdlog::level::debug);
  LogCallDone({.method = "Fetch", .request_id = "d", .status = absl::OkStatus()});
  EXPECT_THAT(stream_.str(), HasSubstr("level=debug msg=\"call done\" request_id=d method=Fetch "
                                       "code=OK"));
}

}  // namespace
}  // namespace kvcache
