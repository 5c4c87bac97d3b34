#include "progress.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <sstream>

namespace kvcache::ctl {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

TEST(FormatProgressTest, BarCountsBytesRateAndEta) {
  ProgressState s;
  s.label = "verify";
  s.unit = "blocks";
  s.done = 250;
  s.total = 1000;
  s.bytes = 25 << 20;
  s.elapsed = absl::Seconds(10);
  EXPECT_EQ(FormatProgress(s, 0),
            "verify  [#######.......................]  25%  250/1000 blocks  25.0 MiB  "
            "2.5 MiB/s  ETA 30s");
}

TEST(FormatProgressTest, RateInUnitsWithoutBytesAndLongEtas) {
  ProgressState s;
  s.label = "dump";
  s.unit = "blocks";
  s.done = 10;
  s.total = 10000;
  s.elapsed = absl::Seconds(4);
  const std::string line = FormatProgress(s, 0);
  EXPECT_THAT(line, HasSubstr("10/10000 blocks  2.5 blocks/s  ETA 1h06m"));
  EXPECT_THAT(line, HasSubstr("[..............................]   0%"));
}

TEST(FormatProgressTest, DoneShowsElapsedInsteadOfEta) {
  ProgressState s;
  s.label = "verify";
  s.unit = "blocks";
  s.done = s.total = 8;
  s.elapsed = absl::Seconds(75);
  const std::string line = FormatProgress(s, 0);
  EXPECT_THAT(line, HasSubstr("[##############################] 100%  8/8 blocks"));
  EXPECT_THAT(line, HasSubstr("elapsed 1m15s"));
  EXPECT_THAT(line, Not(HasSubstr("ETA")));
}

TEST(FormatProgressTest, SpinnerWithoutTotal) {
  ProgressState s;
  s.label = "checkpoint now";
  s.elapsed = absl::Milliseconds(3200);
  EXPECT_EQ(FormatProgress(s, 0), "checkpoint now  |  elapsed 3.2s");
  s.spinner_frame = 1;
  EXPECT_EQ(FormatProgress(s, 0), "checkpoint now  /  elapsed 3.2s");
  s.spinner_frame = 6;
  EXPECT_EQ(FormatProgress(s, 0), "checkpoint now  -  elapsed 3.2s");
}

TEST(FormatProgressTest, BarShrinksToTheWidthAndGoesWhenTooNarrow) {
  ProgressState s;
  s.label = "verify";
  s.unit = "blocks";
  s.done = 1;
  s.total = 2;
  s.elapsed = absl::Seconds(1);
  const std::string wide = FormatProgress(s, 0);
  const std::string fit = FormatProgress(s, 60);
  EXPECT_LE(fit.size(), 60u) << fit;
  EXPECT_THAT(fit, HasSubstr("["));
  EXPECT_LT(fit.size(), wide.size());
  const std::string narrow = FormatProgress(s, 30);
  EXPECT_THAT(narrow, Not(HasSubstr("[")));
  EXPECT_THAT(narrow, HasSubstr(" 50%  1/2 blocks"));
}

TEST(ShortDurationTest, Units) {
  EXPECT_EQ(ShortDuration(absl::Seconds(7)), "7s");
  EXPECT_EQ(ShortDuration(absl::Seconds(144)), "2m24s");
  EXPECT_EQ(ShortDuration(absl::Seconds(3900)), "1h05m");
  EXPECT_EQ(ShortDuration(-absl::Seconds(3)), "0s");
}

// A clock the test moves by hand.
struct FakeClock {
  absl::Time now = absl::FromUnixSeconds(1000);
  std::function<absl::Time()> Fn() {
    return [this] { return now; };
  }
};

TEST(ProgressBarTest, SilentWhenNotATerminal) {
  std::ostringstream err;
  FakeClock clock;
  {
    ProgressBar bar({.label = "verify",
                     .unit = "blocks",
                     .total = 10,
                     .out = &err,
                     .terminal = false,
                     .now = clock.Fn()});
    EXPECT_FALSE(bar.enabled());
    clock.now += absl::Seconds(1);
    bar.Update(5);
    EXPECT_THAT(bar.Line(), HasSubstr("5/10 blocks"));  // still computed
    bar.Finish();
  }
  EXPECT_EQ(err.str(), "");
}

TEST(ProgressBarTest, DrawsOnOneLineAndErasesItAtTheEnd) {
  std::ostringstream err;
  FakeClock clock;
  ProgressBar bar({.label = "verify",
                   .unit = "blocks",
                   .total = 4,
                   .out = &err,
                   .terminal = true,
                   .now = clock.Fn(),
                   .width = 100});
  clock.now += absl::Seconds(2);
  bar.Update(1, 1024);
  EXPECT_EQ(err.str(),
            "\r"
            "verify  [#######.......................]  25%  1/4 blocks  1.0 KiB  512 B/s  ETA 6s");
  // Within min_redraw: nothing drawn.
  clock.now += absl::Milliseconds(10);
  bar.Update(2, 2048);
  EXPECT_EQ(err.str().find('\r', 1), std::string::npos);
  clock.now += absl::Seconds(1);
  bar.Update(4, 4096, /*total=*/4);
  const std::string drawn = err.str();
  const size_t last = drawn.rfind('\r');
  EXPECT_THAT(drawn.substr(last), HasSubstr("4/4 blocks"));
  EXPECT_THAT(drawn.substr(last), HasSubstr("elapsed 3s"));
  bar.Finish();
  // Blanked: carriage return, spaces over the line, carriage return.
  EXPECT_THAT(err.str().substr(drawn.size()), ::testing::MatchesRegex("\r +\r"));
  const size_t finished = err.str().size();
  bar.Finish();  // idempotent, and nothing is drawn after it
  clock.now += absl::Seconds(1);
  bar.Update(5);
  EXPECT_EQ(err.str().size(), finished);
}

TEST(ProgressBarTest, ShorterLinePadsOverTheLongerOne) {
  std::ostringstream err;
  FakeClock clock;
  ProgressBar bar({.label = "x", .out = &err, .terminal = true, .now = clock.Fn(), .width = 100});
  clock.now += absl::Seconds(1);
  bar.Update(0, uint64_t{5} << 30);  // long: bytes and a byte rate
  const size_t first = err.str().size();
  clock.now += absl::Seconds(1);
  bar.Update(0, 0);  // shorter
  const std::string second = err.str().substr(first);
  EXPECT_EQ(second.size(), first) << "the second draw covers the first one's columns";
}

TEST(RunWithSpinnerTest, RunsTheCallWhenNotATerminal) {
  std::ostringstream err;
  int calls = 0;
  RunWithSpinner("checkpoint now", [&] { ++calls; }, {.out = &err, .terminal = false});
  EXPECT_EQ(calls, 1);
  EXPECT_EQ(err.str(), "");
}

TEST(RunWithSpinnerTest, SpinsWhileTheCallRunsOnATerminal) {
  std::ostringstream err;
  int calls = 0;
  RunWithSpinner("checkpoint now",
                 [&] {
                   absl::SleepFor(absl::Milliseconds(700));
                   ++calls;
                 },
                 {.out = &err, .terminal = true, .min_redraw = absl::ZeroDuration()});
  EXPECT_EQ(calls, 1);
  EXPECT_THAT(err.str(), HasSubstr("checkpoint now  /  elapsed"));
  EXPECT_EQ(err.str().back(), '\r');  // erased at the end
}

}  // namespace
}  // namespace kvcache::ctl
