#include "server/rpc/stream_watchdog.h"

#include <gtest/gtest.h>

#include <atomic>
#include <thread>

#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"

namespace kvcache {
namespace {

TEST(StreamWatchdogTest, ExpiresOnlyStreamsWithoutProgress) {
  ManualClock clock;
  StreamWatchdog watchdog(absl::Seconds(10), &clock, /*start_reaper=*/false);
  int idle_a = 0, idle_b = 0;
  const StreamWatchdog::Id a = watchdog.Watch([&] { ++idle_a; });
  const StreamWatchdog::Id b = watchdog.Watch([&] { ++idle_b; });
  EXPECT_EQ(watchdog.watched(), 2u);

  clock.Advance(absl::Seconds(6));
  EXPECT_EQ(watchdog.ExpireIdle(), 0);
  watchdog.Touch(b);  // b made progress: its deadline moves to 16 s
  clock.Advance(absl::Seconds(5));
  EXPECT_EQ(watchdog.ExpireIdle(), 1);  // a, idle for 11 s
  EXPECT_EQ(idle_a, 1);
  EXPECT_EQ(idle_b, 0);
  EXPECT_EQ(watchdog.watched(), 1u);

  clock.Advance(absl::Seconds(4));  // b idle for 9 s
  EXPECT_EQ(watchdog.ExpireIdle(), 0);
  clock.Advance(absl::Seconds(1));
  EXPECT_EQ(watchdog.ExpireIdle(), 1);
  EXPECT_EQ(idle_b, 1);

  // Each callback runs once; touching or unwatching an expired stream is harmless.
  clock.Advance(absl::Seconds(60));
  EXPECT_EQ(watchdog.ExpireIdle(), 0);
  watchdog.Touch(a);
  watchdog.Unwatch(a);
  EXPECT_EQ(watchdog.watched(), 0u);
}

TEST(StreamWatchdogTest, UnwatchedStreamsNeverExpire) {
  ManualClock clock;
  StreamWatchdog watchdog(absl::Seconds(1), &clock, /*start_reaper=*/false);
  int idle = 0;
  const StreamWatchdog::Id id = watchdog.Watch([&] { ++idle; });
  watchdog.Unwatch(id);
  clock.Advance(absl::Seconds(5));
  EXPECT_EQ(watchdog.ExpireIdle(), 0);
  EXPECT_EQ(idle, 0);
}

TEST(StreamWatchdogTest, CallbackMayUnwatchItself) {
  ManualClock clock;
  StreamWatchdog watchdog(absl::Seconds(1), &clock, /*start_reaper=*/false);
  StreamWatchdog::Id id = 0;
  bool ran = false;
  // What a reactor does when gRPC runs its OnDone inline from the cancel.
  id = watchdog.Watch([&] {
    watchdog.Unwatch(id);
    ran = true;
  });
  clock.Advance(absl::Seconds(2));
  EXPECT_EQ(watchdog.ExpireIdle(), 1);
  EXPECT_TRUE(ran);
}

TEST(StreamWatchdogTest, UnwatchWaitsForARunningCallback) {
  ManualClock clock;
  StreamWatchdog watchdog(absl::Seconds(1), &clock, /*start_reaper=*/false);
  absl::Notification started, release;
  std::atomic<bool> finished{false};
  const StreamWatchdog::Id id = watchdog.Watch([&] {
    started.Notify();
    release.WaitForNotification();
    finished = true;
  });
  clock.Advance(absl::Seconds(2));
  std::thread reaper([&] { watchdog.ExpireIdle(); });
  started.WaitForNotification();
  std::thread unwatcher([&] {
    watchdog.Unwatch(id);
    // The callback may use the stream until it returns: Unwatch waited.
    EXPECT_TRUE(finished.load());
  });
  absl::SleepFor(absl::Milliseconds(50));
  release.Notify();
  unwatcher.join();
  reaper.join();
}

TEST(StreamWatchdogTest, ReaperThreadFiresOnTheSystemClock) {
  StreamWatchdog watchdog(absl::Milliseconds(50), SystemClock::Get());
  absl::Notification idle;
  watchdog.Watch([&] { idle.Notify(); });
  EXPECT_TRUE(idle.WaitForNotificationWithTimeout(absl::Seconds(10)));
  EXPECT_EQ(watchdog.watched(), 0u);
}

}  // namespace
}  // namespace kvcache
