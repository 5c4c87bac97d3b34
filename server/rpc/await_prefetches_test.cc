#include "server/rpc/await_prefetches.h"

#include <gtest/gtest.h>

#include <atomic>

#include "absl/synchronization/notification.h"

namespace kvcache {
namespace {

TEST(AwaitPrefetchesTest, AnswersInTimeOnceEveryTicketIsDone) {
  DeadlineTimer timer;
  TierWorkers prefetcher(2, 16);
  absl::Notification release;
  std::vector<std::shared_ptr<WorkTicket>> tickets;
  for (int i = 0; i < 3; ++i) {
    tickets.push_back(prefetcher.Submit([&] { release.WaitForNotification(); }));
  }
  std::atomic<int> answers{0};
  std::atomic<bool> in_time{false};
  absl::Notification answered;
  AwaitPrefetches(timer, tickets, absl::Seconds(60), [&](bool t) {
    in_time = t;
    answers.fetch_add(1);
    answered.Notify();
  });
  EXPECT_FALSE(answered.HasBeenNotified());  // the call returned without waiting
  release.Notify();
  ASSERT_TRUE(answered.WaitForNotificationWithTimeout(absl::Seconds(10)));
  EXPECT_TRUE(in_time.load());
  EXPECT_EQ(timer.pending(), 0u);  // the deadline was cancelled
  EXPECT_EQ(answers.load(), 1);
}

TEST(AwaitPrefetchesTest, AnswersLateAtTheDeadlineAndOnlyOnce) {
  DeadlineTimer timer;
  TierWorkers prefetcher(1, 16);
  absl::Notification release;
  auto ticket = prefetcher.Submit([&] { release.WaitForNotification(); });
  std::atomic<int> answers{0};
  std::atomic<bool> in_time{true};
  absl::Notification answered;
  AwaitPrefetches(timer, {ticket}, absl::Milliseconds(20), [&](bool t) {
    in_time = t;
    answers.fetch_add(1);
    answered.Notify();
  });
  ASSERT_TRUE(answered.WaitForNotificationWithTimeout(absl::Seconds(10)));
  EXPECT_FALSE(in_time.load());
  release.Notify();
  ASSERT_TRUE(ticket->WaitFor(absl::Seconds(10)));
  EXPECT_EQ(answers.load(), 1);
}

TEST(AwaitPrefetchesTest, NothingToWaitForAnswersAtOnce) {
  DeadlineTimer timer;
  bool in_time = false;
  AwaitPrefetches(timer, {}, absl::Seconds(1), [&](bool t) { in_time = t; });
  EXPECT_TRUE(in_time);
}

}  // namespace
}  // namespace kvcache
