// The daemon's log formats: each format's shape, escaping, fields, one line
// per event, and json lines that parse back.
#include "server/logging/log_format.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <spdlog/sinks/ostream_sink.h>
#include <spdlog/spdlog.h>

#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/str_split.h"
#include "server/logging/log_event.h"
#include "server/logging/logging.h"

namespace kvcache {
namespace {

using ::testing::HasSubstr;
using ::testing::MatchesRegex;
using ::testing::StartsWith;

// A logger writing `format` into a string.
class Capture {
 public:
  explicit Capture(LogFormat format, std::string name = "")
      : logger_(std::move(name), std::make_shared<spdlog::sinks::ostream_sink_st>(stream_)) {
    logger_.set_formatter(NewLogFormatter(format));
    logger_.set_level(spdlog::level::trace);
  }
  spdlog::logger& logger() { return logger_; }
  std::vector<std::string> Lines() const {
    std::vector<std::string> lines = absl::StrSplit(stream_.str(), '\n');
    EXPECT_EQ(lines.back(), "") << "the output ends with a newline";
    lines.pop_back();
    return lines;
  }

 private:
  std::ostringstream stream_;
  spdlog::logger logger_;
};

TEST(LogFormatTest, ParsesFormatNames) {
  EXPECT_EQ(ParseLogFormat("text"), LogFormat::kText);
  EXPECT_EQ(ParseLogFormat("logfmt"), LogFormat::kLogfmt);
  EXPECT_EQ(ParseLogFormat("json"), LogFormat::kJson);
  EXPECT_EQ(ParseLogFormat("JSON"), std::nullopt);
  EXPECT_EQ(ParseLogFormat(""), std::nullopt);
  for (LogFormat f : {LogFormat::kText, LogFormat::kLogfmt, LogFormat::kJson}) {
    EXPECT_EQ(ParseLogFormat(LogFormatName(f)), f);
  }
}

TEST(LogFormatTest, TextKeepsSpdlogsLineAndAppendsFields) {
  Capture c(LogFormat::kText);
  c.logger().info("plain {} line", 1);
  LogEvent(c.logger(), spdlog::level::warn, "append refused",
           {{"request_id", "5f3a"}, {"model", "llama 3"}, {"blocks", 4}});
  const std::vector<std::string> lines = c.Lines();
  ASSERT_EQ(lines.size(), 2u);
  EXPECT_THAT(lines[0], MatchesRegex(R"(\[[0-9-]+ [0-9:.]+\] \[info\] plain 1 line)"));
  EXPECT_THAT(lines[1], HasSubstr("[warning] append refused request_id=5f3a model=\"llama 3\" "
                                  "blocks=4"));
}

TEST(LogFormatTest, PayloadAsTextForSinksWithoutAFormatter) {
  EXPECT_EQ(LogPayloadAsText("plain message"), "plain message");
  EXPECT_EQ(LogPayloadAsText(EncodeLogEvent(
                "call failed", {{"code", "NOT_FOUND"}, {"message", "not \"here\""}, {"bytes", 3}})),
            "call failed code=NOT_FOUND message=\"not \\\"here\\\"\" bytes=3");
}

TEST(LogFormatTest, LogfmtWritesTimeLevelMessageAndFields) {
  Capture c(LogFormat::kLogfmt);
  LogEvent(c.logger(), spdlog::level::info, "append refused",
           {{"request_id", "5f3a"},
            {"model", "m=1"},
            {"code", "RESOURCE_EXHAUSTED"},
            {"empty", ""},
            {"ok", false},
            {"ms", 1.5},
            {"bytes", uint64_t{18446744073709551615u}},
            {"delta", -3}});
  const std::vector<std::string> lines = c.Lines();
  ASSERT_EQ(lines.size(), 1u);
  EXPECT_THAT(
      lines[0],
      MatchesRegex(R"(ts=[0-9]{4}-[0-9]{2}-[0-9]{2}T[0-9]{2}:[0-9]{2}:[0-9]{2}\.[0-9]{3}Z .*)"));
  EXPECT_THAT(lines[0], HasSubstr(" level=info msg=\"append refused\" request_id=5f3a "
                                  "model=\"m=1\" code=RESOURCE_EXHAUSTED empty=\"\" ok=false "
                                  "ms=1.5 bytes=18446744073709551615 delta=-3"));
}

TEST(LogFormatTest, LevelsHaveShortNames) {
  Capture c(LogFormat::kLogfmt);
  c.logger().trace("t");
  c.logger().debug("d");
  c.logger().warn("w");
  c.logger().error("e");
  c.logger().critical("c");
  const std::vector<std::string> lines = c.Lines();
  ASSERT_EQ(lines.size(), 5u);
  EXPECT_THAT(lines[0], HasSubstr("level=trace msg=\"t\""));
  EXPECT_THAT(lines[1], HasSubstr("level=debug msg=\"d\""));
  EXPECT_THAT(lines[2], HasSubstr("level=warn msg=\"w\""));
  EXPECT_THAT(lines[3], HasSubstr("level=error msg=\"e\""));
  EXPECT_THAT(lines[4], HasSubstr("level=critical msg=\"c\""));
}

TEST(LogFormatTest, EscapesQuotesBackslashesAndControlCharacters) {
  std::string out;
  AppendEscaped(std::string_view("a\"b\\c\nd\re\tf\x01g\x7fh\0i", 17), &out);
  EXPECT_EQ(out, "a\\\"b\\\\c\\nd\\re\\tf\\u0001g\\u007fh\\u0000i");
  out.clear();
  AppendEscaped("caf\xc3\xa9 \xe2\x82\xac \xf0\x9f\x98\x80", &out);  // valid UTF-8 stays
  EXPECT_EQ(out, "caf\xc3\xa9 \xe2\x82\xac \xf0\x9f\x98\x80");
  out.clear();
  // A stray continuation byte, a truncated sequence, an overlong form, a surrogate.
  AppendEscaped("a\x80 b\xc3 c\xc0\xaf d\xed\xa0\x80", &out);
  EXPECT_EQ(out, "a\\ufffd b\\ufffd c\\ufffd\\ufffd d\\ufffd\\ufffd\\ufffd");
}

TEST(LogFormatTest, LogfmtQuotesOnlyWhatNeedsIt) {
  const auto value = [](std::string_view v) {
    std::string out;
    AppendLogfmtValue(v, &out);
    return out;
  };
  EXPECT_EQ(value("abc-1.2_x:y/z"), "abc-1.2_x:y/z");
  EXPECT_EQ(value(""), "\"\"");
  EXPECT_EQ(value("a b"), "\"a b\"");
  EXPECT_EQ(value("a=b"), "\"a=b\"");
  EXPECT_EQ(value("say \"hi\""), "\"say \\\"hi\\\"\"");
  EXPECT_EQ(value("two\nlines"), "\"two\\nlines\"");
}

TEST(LogFormatTest, OneLinePerEventWhateverTheMessageHolds) {
  for (LogFormat f : {LogFormat::kLogfmt, LogFormat::kJson}) {
    Capture c(f);
    c.logger().info("config:\n{{\n  \"a\": 1\n}}\n");
    LogEvent(c.logger(), spdlog::level::err, "bad\r\nthing", {{"detail", "x\ny\nz"}});
    EXPECT_EQ(c.Lines().size(), 2u) << LogFormatName(f);
  }
}

TEST(LogFormatTest, JsonLinesParseBack) {
  Capture c(LogFormat::kJson, "checkpoint");
  c.logger().info("plain \"quoted\" \\ message\twith\ttabs");
  LogEvent(c.logger(), spdlog::level::warn, "call failed",
           {{"request_id", "00ff00ff00ff00ff"},
            {"method", "Lookup"},
            {"code", "NOT_FOUND"},
            {"message", "model \"m\"\nis not registered \x01 \xff"},
            {"bytes", uint64_t{42}},
            {"latency_ms", 0.25},
            {"cancelled", true},
            {"msg", "a field named like a member"},
            {"we ird=key", "v"}});
  const std::vector<std::string> lines = c.Lines();
  ASSERT_EQ(lines.size(), 2u);
  for (const std::string& line : lines) {
    EXPECT_TRUE(nlohmann::json::accept(line)) << line;
  }
  const nlohmann::json plain = nlohmann::json::parse(lines[0]);
  EXPECT_EQ(plain["level"], "info");
  EXPECT_EQ(plain["msg"], "plain \"quoted\" \\ message\twith\ttabs");
  EXPECT_EQ(plain["logger"], "checkpoint");
  EXPECT_THAT(plain["ts"].get<std::string>(),
              MatchesRegex(R"([0-9]{4}-[0-9]{2}-[0-9]{2}T[0-9]{2}:[0-9]{2}:[0-9]{2}\.[0-9]{3}Z)"));

  const nlohmann::json event = nlohmann::json::parse(lines[1]);
  EXPECT_EQ(event["level"], "warn");
  EXPECT_EQ(event["msg"], "call failed");
  EXPECT_EQ(event["request_id"], "00ff00ff00ff00ff");
  EXPECT_EQ(event["method"], "Lookup");
  EXPECT_EQ(event["code"], "NOT_FOUND");
  EXPECT_EQ(event["message"], "model \"m\"\nis not registered \x01 \xef\xbf\xbd");
  EXPECT_EQ(event["bytes"], 42);
  EXPECT_DOUBLE_EQ(event["latency_ms"].get<double>(), 0.25);
  EXPECT_EQ(event["cancelled"], true);
  EXPECT_EQ(event["_msg"], "a field named like a member");
  EXPECT_EQ(event["we_ird_key"], "v");
}

TEST(LogFormatTest, NonFiniteNumbersAreStrings) {
  Capture c(LogFormat::kJson);
  LogEvent(c.logger(), spdlog::level::info, "x",
           {{"nan", std::numeric_limits<double>::quiet_NaN()},
            {"inf", std::numeric_limits<double>::infinity()}});
  const nlohmann::json event = nlohmann::json::parse(c.Lines()[0]);
  EXPECT_TRUE(event["nan"].is_string());
  EXPECT_TRUE(event["inf"].is_string());
}

TEST(LogEventTest, MarksInsideTextCannotForgeFields) {
  Capture c(LogFormat::kJson);
  LogEvent(c.logger(), spdlog::level::info,
           "m\x1f"
           "forged\x1e"
           "1",
           {{"k", "v\x1fk2\x1dv2"}});
  const nlohmann::json event = nlohmann::json::parse(c.Lines()[0]);
  EXPECT_EQ(event["msg"], "m?forged?1");
  EXPECT_EQ(event["k"], "v?k2?v2");
  EXPECT_FALSE(event.contains("forged"));
  EXPECT_FALSE(event.contains("k2"));
}

TEST(LogEventTest, BelowTheLevelNothingIsWritten) {
  Capture c(LogFormat::kLogfmt);
  c.logger().set_level(spdlog::level::info);
  LogEvent(c.logger(), spdlog::level::debug, "hidden", {{"k", 1}});
  LogEvent(c.logger(), spdlog::level::info, "shown", {{"k", 1}});
  const std::vector<std::string> lines = c.Lines();
  ASSERT_EQ(lines.size(), 1u);
  EXPECT_THAT(lines[0], HasSubstr("msg=\"shown\" k=1"));
}

TEST(LogEventTest, DecodesWhatItEncodes) {
  const std::string payload = EncodeLogEvent("hello", {{"a", "1"}, {"b", 2}, {"c", ""}});
  const DecodedLogEvent e = DecodeLogEvent(payload);
  EXPECT_EQ(e.message, "hello");
  ASSERT_EQ(e.fields.size(), 3u);
  EXPECT_EQ(e.fields[0].key, "a");
  EXPECT_EQ(e.fields[0].value, "1");
  EXPECT_FALSE(e.fields[0].literal);
  EXPECT_EQ(e.fields[1].value, "2");
  EXPECT_TRUE(e.fields[1].literal);
  EXPECT_EQ(e.fields[2].value, "");
  EXPECT_EQ(DecodeLogEvent("no fields").fields.size(), 0u);
}

TEST(LogLevelTest, ChangesEveryLoggerButTheMigrationLog) {
  auto other = std::make_shared<spdlog::logger>(
      "other", std::make_shared<spdlog::sinks::ostream_sink_st>(std::cerr));
  auto migration = std::make_shared<spdlog::logger>(
      kMigrationLoggerName, std::make_shared<spdlog::sinks::ostream_sink_st>(std::cerr));
  spdlog::register_logger(other);
  spdlog::register_logger(migration);
  migration->set_level(spdlog::level::info);
  ASSERT_TRUE(ChangeLogLevel("info").ok());

  absl::StatusOr<LogLevelChange> change = ChangeLogLevel("debug");
  ASSERT_TRUE(change.ok()) << change.status();
  EXPECT_EQ(change->level, "debug");
  EXPECT_EQ(change->previous_level, "info");
  EXPECT_EQ(spdlog::default_logger()->level(), spdlog::level::debug);
  EXPECT_EQ(other->level(), spdlog::level::debug);
  EXPECT_EQ(migration->level(), spdlog::level::info);

  absl::StatusOr<LogLevelChange> read = ChangeLogLevel("");
  ASSERT_TRUE(read.ok());
  EXPECT_EQ(read->level, "debug");
  EXPECT_EQ(read->previous_level, "debug");

  absl::StatusOr<LogLevelChange> bad = ChangeLogLevel("loud");
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(bad.status().message()),
              HasSubstr("trace, debug, info, warn, error, critical or off"));
  EXPECT_EQ(CurrentLogLevel(), "debug");
  spdlog::drop("other");
  spdlog::drop(kMigrationLoggerName);
  ASSERT_TRUE(ChangeLogLevel("info").ok());
}

TEST(LogLevelTest, SetUpRefusesUnknownFormatsAndLevels) {
  v1::LoggingConfig config;
  config.set_format("xml");
  EXPECT_THAT(std::string(SetUpLogging(config).message()), HasSubstr("logging.format"));
  config.set_format("json");
  config.set_level("loud");
  EXPECT_THAT(std::string(SetUpLogging(config).message()), HasSubstr("logging.level"));
  config.set_format("text");
  config.set_level("info");
  EXPECT_TRUE(SetUpLogging(config).ok());
}

}  // namespace
}  // namespace kvcache
