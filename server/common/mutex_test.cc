// Mutex: AssertHeld() checks the caller in debug builds (the thread-safety
// analysis trusts it, so a wrong assertion must not pass silently).
#include "server/common/mutex.h"

#include <gtest/gtest.h>

#include <condition_variable>
#include <thread>

namespace kvcache {
namespace {

TEST(MutexTest, AssertHeldPassesForTheHolder) {
  Mutex mu;
  MutexLock lock(&mu);
  mu.AssertHeld();
}

TEST(MutexTest, AssertHeldFollowsAConditionVariableWait) {
  Mutex mu;
  std::condition_variable_any cv;
  bool ready = false;
  std::thread t([&] {
    MutexLock lock(&mu);
    ready = true;
    cv.notify_all();
  });
  {
    std::unique_lock<Mutex> lock(mu);
    cv.wait(lock, [&] {
      mu.AssertHeld();
      return ready;
    });
    mu.AssertHeld();
  }
  t.join();
}

TEST(MutexTest, TryLockTakesOnlyAFreeMutex) {
  Mutex mu;
  ASSERT_TRUE(mu.TryLock());
  mu.AssertHeld();
  std::thread([&] {
    if (mu.TryLock()) {
      mu.Unlock();
      ADD_FAILURE() << "took a held mutex";
    }
  }).join();
  mu.Unlock();
}

#ifndef NDEBUG
TEST(MutexDeathTest, AssertHeldAbortsWhenTheMutexIsFree) {
  Mutex mu;
  EXPECT_DEATH(mu.AssertHeld(), "does not hold the mutex");
}

TEST(MutexDeathTest, AssertHeldAbortsWhenAnotherThreadHoldsIt) {
  Mutex mu;
  MutexLock lock(&mu);
  EXPECT_DEATH(
      {
        std::thread t([&] { mu.AssertHeld(); });
        t.join();
      },
      "does not hold the mutex");
}
#endif

}  // namespace
}  // namespace kvcache
