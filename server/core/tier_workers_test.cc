// TierWorkers: a bounded queue that refuses rather than waits, hands a
// refused job back to its caller, and at shutdown runs each queued job's
// `drop` so that whoever submitted it hears back.
#include "server/core/tier_workers.h"

#include <atomic>
#include <future>
#include <memory>
#include <thread>

#include "gtest/gtest.h"

namespace kvcache {
namespace {

// A job that holds its worker thread until Release().
class Gate {
 public:
  TierWorkers::Job Hold() {
    return [this] {
      entered_.set_value();
      released_.wait();
    };
  }
  void AwaitEntered() { entered_future_.wait(); }
  void Release() { release_.set_value(); }

 private:
  std::promise<void> entered_;
  std::future<void> entered_future_ = entered_.get_future();
  std::promise<void> release_;
  std::shared_future<void> released_ = release_.get_future().share();
};

TEST(TierWorkersTest, AJobRunsOnAWorkerAndItsTicketSaysSo) {
  TierWorkers workers(1, 4);
  std::atomic<bool> ran = false;
  std::shared_ptr<WorkTicket> ticket = workers.Submit([&ran] { ran = true; });
  ASSERT_NE(ticket, nullptr);
  ASSERT_TRUE(ticket->WaitFor(absl::Seconds(10)));
  EXPECT_TRUE(ran);
  std::promise<void> called;
  ticket->OnDone([&called] { called.set_value(); });  // already done: runs here
  EXPECT_EQ(called.get_future().wait_for(std::chrono::seconds(0)), std::future_status::ready);
  EXPECT_EQ(workers.GetStats().completed, 1u);
}

TEST(TierWorkersTest, AFullQueueHandsTheJobBackUntouched) {
  Gate gate;
  TierWorkers workers(1, 1);
  ASSERT_NE(workers.Submit(gate.Hold()), nullptr);
  gate.AwaitEntered();  // the worker is busy; the queue is empty
  ASSERT_NE(workers.Submit([] {}), nullptr);
  int runs = 0, drops = 0;
  TierWorkers::Job run = [&runs] { ++runs; };
  TierWorkers::Job drop = [&drops] { ++drops; };
  EXPECT_EQ(workers.TrySubmit(run, drop), nullptr);
  // Both are still the caller's: it may run the work itself.
  ASSERT_TRUE(run);
  ASSERT_TRUE(drop);
  std::move(run)();
  EXPECT_EQ(runs, 1);
  EXPECT_EQ(drops, 0);
  EXPECT_EQ(workers.GetStats().dropped, 1u);
  gate.Release();
}

TEST(TierWorkersTest, ShutdownRunsTheDropOfEachQueuedJobAndNotifiesItsTicket) {
  Gate gate;
  bool ran = false, dropped = false;
  std::shared_ptr<WorkTicket> ticket;
  std::thread releaser;
  {
    TierWorkers workers(1, 1 << 20);
    ASSERT_NE(workers.Submit(gate.Hold()), nullptr);
    gate.AwaitEntered();
    TierWorkers::Job run = [&ran] { ran = true; };
    TierWorkers::Job drop = [&dropped] { dropped = true; };
    ticket = workers.TrySubmit(run, drop);
    ASSERT_NE(ticket, nullptr);
    // The destructor finishes the running job: let it go once shutdown has
    // begun, which is when the pool refuses work (the destructor waits for
    // the gate, so `workers` outlives these calls).
    releaser = std::thread([&gate, &workers] {
      while (workers.Submit([] {}) != nullptr) {
        std::this_thread::sleep_for(std::chrono::milliseconds(1));
      }
      gate.Release();
    });
  }
  releaser.join();
  EXPECT_FALSE(ran);
  EXPECT_TRUE(dropped);
  EXPECT_TRUE(ticket->WaitFor(absl::ZeroDuration()));
}

}  // namespace
}  // namespace kvcache
