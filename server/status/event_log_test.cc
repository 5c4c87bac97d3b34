#include "server/status/event_log.h"

#include <spdlog/logger.h>

#include <string>
#include <thread>
#include <vector>

#include "gtest/gtest.h"

namespace kvcache {
namespace {

TEST(EventLogTest, KeepsTheNewestEntriesNewestFirst) {
  EventLog log(3);
  for (int i = 0; i < 5; ++i) {
    log.AddMessage({.when = absl::FromUnixSeconds(i), .level = "error", .text = std::to_string(i)});
    log.AddMove({.when = absl::FromUnixSeconds(i),
                 .key = static_cast<uint64_t>(i),
                 .from = "host",
                 .to = "ssd",
                 .reason = "pressure",
                 .bytes = 10});
  }
  std::vector<LoggedMessage> messages = log.RecentMessages();
  ASSERT_EQ(messages.size(), 3u);
  EXPECT_EQ(messages[0].text, "4");
  EXPECT_EQ(messages[2].text, "2");
  std::vector<LoggedMove> moves = log.RecentMoves();
  ASSERT_EQ(moves.size(), 3u);
  EXPECT_EQ(moves[0].key, 4u);
  EXPECT_EQ(moves[0].to, "ssd");
  EXPECT_EQ(log.messages_total(), 5u);
  EXPECT_EQ(log.moves_total(), 5u);
}

TEST(EventLogTest, CutsLongMessages) {
  EventLog log(1);
  log.AddMessage({.level = "warning", .text = std::string(10000, 'x')});
  EXPECT_EQ(log.RecentMessages()[0].text.size(), EventLog::kMaxMessageBytes + 3);
}

TEST(EventLogTest, TheSinkKeepsWarningsAndErrorsOnly) {
  auto log = std::make_shared<EventLog>(10);
  spdlog::logger logger("test", NewEventLogSink(log));
  logger.set_level(spdlog::level::trace);
  logger.debug("debug {}", 1);
  logger.info("info {}", 2);
  logger.warn("warn {}", 3);
  logger.error("error {}", 4);
  logger.critical("critical {}", 5);
  std::vector<LoggedMessage> messages = log->RecentMessages();
  ASSERT_EQ(messages.size(), 3u);
  EXPECT_EQ(messages[0].level, "critical");
  EXPECT_EQ(messages[0].text, "critical 5");
  EXPECT_EQ(messages[1].level, "error");
  EXPECT_EQ(messages[2].level, "warning");
  EXPECT_EQ(messages[2].text, "warn 3");
  EXPECT_LT(absl::Now() - messages[0].when, absl::Minutes(1));
}

TEST(EventLogTest, IsSafeToUseFromManyThreads) {
  EventLog log(50);
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&] {
      for (int i = 0; i < 1000; ++i) {
        log.AddMessage({.level = "error", .text = "x"});
        (void)log.RecentMessages();
      }
    });
  }
  for (std::thread& t : threads) t.join();
  EXPECT_EQ(log.messages_total(), 4000u);
  EXPECT_EQ(log.RecentMessages().size(), 50u);
}

}  // namespace
}  // namespace kvcache
