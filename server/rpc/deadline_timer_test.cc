#include "server/rpc/deadline_timer.h"

#include <gtest/gtest.h>

#include <atomic>
#include <memory>
#include <vector>

#include "absl/synchronization/notification.h"

namespace kvcache {
namespace {

TEST(DeadlineTimerTest, RunsAPassedDeadlineAtOnce) {
  DeadlineTimer timer;
  absl::Notification ran;
  timer.Schedule(absl::InfinitePast(), [&] { ran.Notify(); });
  EXPECT_TRUE(ran.WaitForNotificationWithTimeout(absl::Seconds(10)));
}

TEST(DeadlineTimerTest, RunsCallbacksInDeadlineOrder) {
  DeadlineTimer timer;
  std::vector<int> order;
  absl::Notification done;
  const absl::Time now = absl::Now();
  timer.Schedule(now + absl::Milliseconds(30), [&] {
    order.push_back(3);
    done.Notify();
  });
  timer.Schedule(now + absl::Milliseconds(20), [&] { order.push_back(2); });
  timer.Schedule(now + absl::Milliseconds(10), [&] { order.push_back(1); });
  ASSERT_TRUE(done.WaitForNotificationWithTimeout(absl::Seconds(10)));
  EXPECT_EQ(order, (std::vector<int>{1, 2, 3}));
}

TEST(DeadlineTimerTest, ACancelledCallbackNeverRuns) {
  std::atomic<int> runs{0};
  {
    DeadlineTimer timer;
    const DeadlineTimer::Id id = timer.Schedule(absl::InfiniteFuture(), [&] { runs.fetch_add(1); });
    EXPECT_EQ(timer.pending(), 1u);
    EXPECT_TRUE(timer.Cancel(id));
    EXPECT_FALSE(timer.Cancel(id));
    EXPECT_EQ(timer.pending(), 0u);
  }
  EXPECT_EQ(runs.load(), 0);
}

TEST(DeadlineTimerTest, DestructionRunsWhatIsPendingAtOnce) {
  std::atomic<int> runs{0};
  const absl::Time start = absl::Now();
  {
    DeadlineTimer timer;
    for (int i = 0; i < 3; ++i) timer.Schedule(absl::InfiniteFuture(), [&] { runs.fetch_add(1); });
  }
  EXPECT_EQ(runs.load(), 3);
  EXPECT_LT(absl::Now() - start, absl::Seconds(10));
}

TEST(DeadlineTimerTest, FireAllNowRunsWhatIsPendingWithoutWaitingForItsDeadline) {
  DeadlineTimer timer;
  std::atomic<int> runs{0};
  absl::Notification both;
  for (int i = 0; i < 2; ++i) {
    timer.Schedule(absl::InfiniteFuture(), [&] {
      if (runs.fetch_add(1) == 1) both.Notify();
    });
  }
  timer.FireAllNow();
  EXPECT_TRUE(both.WaitForNotificationWithTimeout(absl::Seconds(10)));
  // Later callbacks keep their deadlines.
  std::atomic<bool> later{false};
  timer.Schedule(absl::InfiniteFuture(), [&] { later = true; });
  absl::SleepFor(absl::Milliseconds(50));
  EXPECT_FALSE(later.load());
  EXPECT_EQ(timer.pending(), 1u);
}

TEST(DeadlineTimerTest, ACallbackMaySchedule) {
  DeadlineTimer timer;
  absl::Notification second;
  timer.Schedule(absl::InfinitePast(),
                 [&] { timer.Schedule(absl::InfinitePast(), [&] { second.Notify(); }); });
  EXPECT_TRUE(second.WaitForNotificationWithTimeout(absl::Seconds(10)));
}

}  // namespace
}  // namespace kvcache
