// The daemon's logs against the real binary: json lines, a failed call's
// request id in the client's error and in exactly one log line, the log level
// changed at runtime (Admin SetLogLevel and kvcachectl log-level).
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <fstream>
#include <nlohmann/json.hpp>
#include <regex>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "tests/integration/daemon_process.h"
#include "tests/integration/kv_pattern.h"

namespace kvcache::testing {
namespace {

using nlohmann::json;
using ::testing::HasSubstr;

// The request id a client error names: "... (request id ID)".
std::string RequestIdIn(const absl::Status& s) {
  static const std::regex kId(R"(\(request id ([0-9a-f]{16})\)$)");
  std::smatch m;
  const std::string message(s.message());
  return std::regex_search(message, m, kId) ? m[1].str() : "";
}

class LogsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto d = DaemonProcess::Start({.extra_flags = {"--log-format", "json"}});
    ASSERT_TRUE(d.ok()) << d.status();
    daemon_ = *std::move(d);
  }
  void TearDown() override {
    if (daemon_ != nullptr) {
      EXPECT_EQ(daemon_->Stop(), 0);
    }
  }

  // Every line of the daemon's log, each parsed (a line that is not JSON fails the test).
  std::vector<json> Lines() {
    std::vector<json> lines;
    std::ifstream in(daemon_->log_path());
    std::string line;
    while (std::getline(in, line)) {
      if (!json::accept(line)) {
        ADD_FAILURE() << "not a JSON line: " << line;
        continue;
      }
      lines.push_back(json::parse(line));
    }
    return lines;
  }
  std::vector<json> LinesWith(std::string_view key, std::string_view value) {
    std::vector<json> found;
    for (json& j : Lines()) {
      if (j.contains(key) && j[std::string(key)] == value) found.push_back(std::move(j));
    }
    return found;
  }
  // Waits (up to 5 s) until `n` lines carry key=value: the daemon writes a
  // call's line as the call ends, maybe just after the client saw the status.
  std::vector<json> WaitForLines(std::string_view key, std::string_view value, size_t n = 1) {
    const absl::Time deadline = absl::Now() + absl::Seconds(5);
    std::vector<json> found = LinesWith(key, value);
    while (found.size() < n && absl::Now() < deadline) {
      absl::SleepFor(absl::Milliseconds(20));
      found = LinesWith(key, value);
    }
    return found;
  }
  size_t CountDebugCallLines(std::string_view method) {
    size_t n = 0;
    for (const json& j : Lines()) {
      if (j["level"] == "debug" && j.value("method", "") == method) ++n;
    }
    return n;
  }
  CommandResult Ctl(const std::string& args) {
    return RunCommand(
        absl::StrCat(KVCACHECTL_BINARY, " --target ", daemon_->unix_target(), " ", args));
  }

  std::unique_ptr<DaemonProcess> daemon_;
};

TEST_F(LogsTest, FailedCallNamesItsRequestIdInTheErrorAndInOneLogLine) {
  for (const DataPath path : {DataPath::kGrpc, DataPath::kSharedMemory}) {
    std::unique_ptr<Client> client = daemon_->NewClient("", path);
    absl::StatusOr<LookupResult> r = client->Lookup("no-such-model", MakeTokens(1, 64));
    ASSERT_EQ(r.status().code(), absl::StatusCode::kNotFound);
    const std::string id = RequestIdIn(r.status());
    ASSERT_FALSE(id.empty()) << "the error names no request id: " << r.status();

    const std::vector<json> lines = WaitForLines("request_id", id);
    ASSERT_EQ(lines.size(), 1u) << "request " << id;
    const json& line = lines[0];
    EXPECT_EQ(line["msg"], "call failed");
    EXPECT_EQ(line["level"], "info");
    EXPECT_EQ(line["method"], path == DataPath::kGrpc ? "Lookup" : "ShmLookup");
    EXPECT_EQ(line["code"], "NOT_FOUND");
    EXPECT_EQ(line["model"], "default/no-such-model");
    EXPECT_THAT(line["message"].get<std::string>(), HasSubstr("is not registered"));
    EXPECT_FALSE(line["peer"].get<std::string>().empty());
    EXPECT_TRUE(line["ts"].is_string());
  }
}

TEST_F(LogsTest, LogLevelChangesAtRuntime) {
  std::unique_ptr<Client> client = daemon_->NewClient("", DataPath::kGrpc);
  const v1::ModelLayout layout = MakeLayout(1, 1, 16, v1::DTYPE_FP16, 16);
  ASSERT_TRUE(client->RegisterModel("m", layout).ok());
  EXPECT_EQ(CountDebugCallLines("RegisterModel"), 0u);  // info: successes are not logged

  absl::StatusOr<v1::SetLogLevelResponse> read = client->SetLogLevel("");
  ASSERT_TRUE(read.ok()) << read.status();
  EXPECT_EQ(read->level(), "info");

  absl::StatusOr<v1::SetLogLevelResponse> set = client->SetLogLevel("debug");
  ASSERT_TRUE(set.ok()) << set.status();
  EXPECT_EQ(set->level(), "debug");
  EXPECT_EQ(set->previous_level(), "info");
  const std::vector<json> changed = WaitForLines("msg", "log level changed");
  ASSERT_EQ(changed.size(), 1u);
  EXPECT_EQ(changed[0]["level"], "warn");
  EXPECT_EQ(changed[0]["previous_level"], "info");
  EXPECT_EQ(changed[0]["msg"], "log level changed");

  ASSERT_TRUE(client->RegisterModel("m", layout).ok());
  const absl::Time deadline = absl::Now() + absl::Seconds(5);
  while (CountDebugCallLines("RegisterModel") == 0 && absl::Now() < deadline) {
    absl::SleepFor(absl::Milliseconds(20));
  }
  ASSERT_EQ(CountDebugCallLines("RegisterModel"), 1u);

  set = client->SetLogLevel("info");
  ASSERT_TRUE(set.ok()) << set.status();
  EXPECT_EQ(set->previous_level(), "debug");
  ASSERT_TRUE(client->RegisterModel("m", layout).ok());
  absl::SleepFor(absl::Milliseconds(200));
  EXPECT_EQ(CountDebugCallLines("RegisterModel"), 1u);  // none since

  absl::StatusOr<v1::SetLogLevelResponse> bad = client->SetLogLevel("loud");
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(bad.status().message()),
              HasSubstr("trace, debug, info, warn, error, critical or off"));
  EXPECT_EQ(client->SetLogLevel("")->level(), "info");
}

TEST_F(LogsTest, KvcachectlLogLevel) {
  CommandResult r = Ctl("log-level");
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_EQ(r.output, "log level: info\n");

  r = Ctl("log-level warn");
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_EQ(r.output, "log level: warn (was info)\n");

  r = Ctl("--json log-level");
  EXPECT_EQ(r.exit_code, 0) << r.output;
  const json j = json::parse(r.output);
  EXPECT_EQ(j["level"], "warn");

  r = Ctl("log-level loud");
  EXPECT_EQ(r.exit_code, 2) << r.output;

  r = RunCommand(absl::StrCat(KVCACHECTL_BINARY, " --target unix://", daemon_->dir(),
                              "/nothing.sock --timeout 1 log-level"));
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_THAT(r.output, HasSubstr("kvcachectl: log-level: UNAVAILABLE"));
  EXPECT_THAT(r.output, HasSubstr("(request id "));

  // A failed call's request id, as kvcachectl prints it, is in the daemon's log.
  ASSERT_EQ(Ctl("log-level info").exit_code, 0);
  r = Ctl("--data-path grpc lookup -m nope --tokens 1-64");
  EXPECT_EQ(r.exit_code, 1) << r.output;
  std::smatch m;
  ASSERT_TRUE(std::regex_search(r.output, m, std::regex(R"(request id ([0-9a-f]{16}))")))
      << r.output;
  const std::vector<json> lines = WaitForLines("request_id", m[1].str());
  ASSERT_EQ(lines.size(), 1u);
  EXPECT_EQ(lines[0]["method"], "Lookup");
}

}  // namespace
}  // namespace kvcache::testing
