#include "server/frontdoor/fair_scheduler.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <atomic>
#include <string>
#include <thread>
#include <vector>

#include "absl/synchronization/notification.h"

namespace kvcache {
namespace {

using ::testing::ElementsAre;

// Records the order steps ran in; each step releases its slot as it returns.
class Recorder {
 public:
  FairScheduler::Step Step(std::string name) {
    return [this, name = std::move(name)](absl::StatusOr<FairScheduler::Slot> slot) {
      MutexLock lock(&mu_);
      order_.push_back(slot.ok() ? name : name + "!");
      if (order_.size() == expected_) done_.Notify();
    };
  }
  void Expect(size_t n) { expected_ = n; }
  std::vector<std::string> Wait() {
    EXPECT_TRUE(done_.WaitForNotificationWithTimeout(absl::Seconds(10)));
    MutexLock lock(&mu_);
    return order_;
  }

 private:
  Mutex mu_;
  std::vector<std::string> order_ ABSL_GUARDED_BY(mu_);
  size_t expected_ = 0;
  absl::Notification done_;
};

TEST(FairSchedulerTest, RunsAtOnceOnTheCallersThreadWhenASlotIsFree) {
  FairScheduler scheduler({.slots = 2});
  auto flow = scheduler.Join("t", "c", DataPathKind::kGrpc);
  std::thread::id ran_on;
  scheduler.Submit(flow, [&](absl::StatusOr<FairScheduler::Slot> slot) {
    ASSERT_TRUE(slot.ok());
    ran_on = std::this_thread::get_id();
  });
  EXPECT_EQ(ran_on, std::this_thread::get_id());
  EXPECT_EQ(scheduler.stats().paths[1].admitted, 1u);
  EXPECT_EQ(scheduler.stats().paths[1].queued, 0u);
  EXPECT_EQ(scheduler.stats().paths[1].in_flight, 0u);  // released as the step returned
}

TEST(FairSchedulerTest, GrantsRoundRobinOverTenantsThenConnections) {
  FairScheduler scheduler({.slots = 1});
  auto a1 = scheduler.Join("A", "a1", DataPathKind::kSharedMemory);
  auto a2 = scheduler.Join("A", "a2", DataPathKind::kGrpc);
  auto b = scheduler.Join("B", "b", DataPathKind::kGrpc);
  absl::StatusOr<FairScheduler::Slot> held = scheduler.Acquire(a1);
  ASSERT_TRUE(held.ok());
  Recorder rec;
  rec.Expect(6);
  // Tenant A has two connections, one with three steps; B has one with two.
  scheduler.Submit(a1, rec.Step("a1"));
  scheduler.Submit(a1, rec.Step("a1"));
  scheduler.Submit(a1, rec.Step("a1"));
  scheduler.Submit(a2, rec.Step("a2"));
  scheduler.Submit(b, rec.Step("b"));
  scheduler.Submit(b, rec.Step("b"));
  EXPECT_EQ(scheduler.stats().paths[0].waiting, 3u);
  EXPECT_EQ(scheduler.stats().paths[1].waiting, 3u);
  held->Release();
  EXPECT_THAT(rec.Wait(), ElementsAre("a1", "b", "a2", "b", "a1", "a1"));
}

TEST(FairSchedulerTest, AFlowThatWasAwayGoesAheadOfThoseServedSince) {
  FairScheduler scheduler({.slots = 1});
  auto away = scheduler.Join("A", "away", DataPathKind::kGrpc);
  auto p = scheduler.Join("A", "p", DataPathKind::kSharedMemory);
  auto q = scheduler.Join("A", "q", DataPathKind::kSharedMemory);
  {
    absl::StatusOr<FairScheduler::Slot> held = scheduler.Acquire(p);
    ASSERT_TRUE(held.ok());
    Recorder rec;
    rec.Expect(3);
    scheduler.Submit(away, rec.Step("away"));
    scheduler.Submit(p, rec.Step("p"));
    scheduler.Submit(q, rec.Step("q"));
    held->Release();
    EXPECT_THAT(rec.Wait(), ElementsAre("away", "p", "q"));
  }
  // p and q come back first, but `away` was served before both.
  while (scheduler.stats().paths[0].in_flight + scheduler.stats().paths[1].in_flight > 0) {
    std::this_thread::yield();  // the last step's slot is given back as it returns
  }
  absl::StatusOr<FairScheduler::Slot> held = scheduler.Acquire(p);
  ASSERT_TRUE(held.ok());
  Recorder rec;
  rec.Expect(4);
  scheduler.Submit(p, rec.Step("p"));
  scheduler.Submit(q, rec.Step("q"));
  scheduler.Submit(away, rec.Step("away"));
  scheduler.Submit(p, rec.Step("p"));
  held->Release();
  EXPECT_THAT(rec.Wait(), ElementsAre("away", "p", "q", "p"));
}

TEST(FairSchedulerTest, ShmHoldsItsShareOfTheSlotsWhileGrpcOperationsRun) {
  FairScheduler scheduler({.slots = 2});
  auto g = scheduler.Join("t", "grpc", DataPathKind::kGrpc);
  auto s1 = scheduler.Join("t", "shm1", DataPathKind::kSharedMemory);
  auto s2 = scheduler.Join("t", "shm2", DataPathKind::kSharedMemory);
  // A gRPC operation starts (its first step runs and returns; the stream
  // goes on): shm may now hold one slot of two.
  scheduler.Submit(g, [](absl::StatusOr<FairScheduler::Slot> slot) { ASSERT_TRUE(slot.ok()); });
  EXPECT_EQ(scheduler.stats().grpc_operations, 1u);
  EXPECT_EQ(scheduler.stats().shm_limit, 1u);
  absl::StatusOr<FairScheduler::Slot> first = scheduler.Acquire(s1);
  ASSERT_TRUE(first.ok());
  absl::Notification second_granted;
  std::thread second([&] {
    absl::StatusOr<FairScheduler::Slot> slot = scheduler.Acquire(s2);
    EXPECT_TRUE(slot.ok());
    second_granted.Notify();
  });
  while (scheduler.stats().paths[0].waiting == 0) std::this_thread::yield();
  EXPECT_FALSE(second_granted.HasBeenNotified());  // a slot is free, but not shm's
  // A gRPC stream's first step is not held back by shm waiting for its share.
  bool ran = false;
  scheduler.Submit(g, [&](absl::StatusOr<FairScheduler::Slot> slot) { ran = slot.ok(); });
  EXPECT_TRUE(ran);
  EXPECT_EQ(scheduler.stats().grpc_operations, 2u);
  scheduler.EndOperation(g);
  EXPECT_FALSE(second_granted.HasBeenNotified());
  scheduler.EndOperation(g);  // no gRPC operation left: shm may use both
  ASSERT_TRUE(second_granted.WaitForNotificationWithTimeout(absl::Seconds(10)));
  second.join();
  EXPECT_EQ(scheduler.stats().shm_limit, 2u);
}

TEST(FairSchedulerTest, TheSameConnectionIsOneFlow) {
  FairScheduler scheduler({.slots = 1});
  auto x = scheduler.Join("A", "peer", DataPathKind::kGrpc);
  auto y = scheduler.Join("A", "peer", DataPathKind::kGrpc);
  auto other_path = scheduler.Join("A", "peer", DataPathKind::kSharedMemory);
  EXPECT_EQ(x, y);
  EXPECT_NE(x, other_path);
}

TEST(FairSchedulerTest, BlockingThreadsDoNotStarveASubmittedStep) {
  FairScheduler scheduler({.slots = 1, .threads = 1});
  std::atomic<bool> stop{false};
  std::atomic<uint64_t> hog_steps{0};
  std::vector<std::thread> hogs;
  // Eight threads of one tenant (like shm sessions) take the slot back to back.
  for (int i = 0; i < 8; ++i) {
    hogs.emplace_back([&, i] {
      auto flow = scheduler.Join("hog", "conn" + std::to_string(i), DataPathKind::kSharedMemory);
      while (!stop.load()) {
        absl::StatusOr<FairScheduler::Slot> slot = scheduler.Acquire(flow);
        if (!slot.ok()) return;
        hog_steps.fetch_add(1);
        std::this_thread::sleep_for(std::chrono::microseconds(200));
      }
    });
  }
  while (hog_steps.load() < 50) std::this_thread::yield();
  auto flow = scheduler.Join("other", "grpc", DataPathKind::kGrpc);
  // Each of 20 steps, submitted behind eight busy threads, runs within
  // about two rounds of grants (the other tenant comes next in the ring).
  for (int i = 0; i < 20; ++i) {
    absl::Notification ran;
    const uint64_t before = hog_steps.load();
    uint64_t at_run = 0;
    scheduler.Submit(flow, [&](absl::StatusOr<FairScheduler::Slot> slot) {
      EXPECT_TRUE(slot.ok());
      at_run = hog_steps.load();
      ran.Notify();
    });
    ASSERT_TRUE(ran.WaitForNotificationWithTimeout(absl::Seconds(10)));
    EXPECT_LE(at_run - before, 3u) << "step " << i;
  }
  stop = true;
  for (auto& t : hogs) t.join();
  EXPECT_EQ(scheduler.stats().paths[1].admitted, 20u);
}

TEST(FairSchedulerTest, CountsSlotsWaitsAndWaitTimes) {
  ManualClock clock;
  FairScheduler scheduler({.slots = 2, .clock = &clock});
  auto shm = scheduler.Join("t", "s", DataPathKind::kSharedMemory);
  auto grpc = scheduler.Join("t", "g", DataPathKind::kGrpc);
  absl::StatusOr<FairScheduler::Slot> s1 = scheduler.Acquire(shm);
  absl::StatusOr<FairScheduler::Slot> s2 = scheduler.Acquire(shm);
  ASSERT_TRUE(s1.ok() && s2.ok());
  FairScheduler::Stats st = scheduler.stats();
  EXPECT_EQ(st.slots, 2u);
  EXPECT_EQ(st.paths[0].in_flight, 2u);
  EXPECT_EQ(st.paths[0].admitted, 2u);

  absl::Notification ran;
  FairScheduler::Slot kept;
  scheduler.Submit(grpc, [&](absl::StatusOr<FairScheduler::Slot> slot) {
    ASSERT_TRUE(slot.ok());
    kept = *std::move(slot);  // keeps the slot past the step
    ran.Notify();
  });
  EXPECT_EQ(scheduler.stats().paths[1].waiting, 1u);
  clock.Advance(absl::Milliseconds(5));
  s1->Release();
  ASSERT_TRUE(ran.WaitForNotificationWithTimeout(absl::Seconds(10)));
  st = scheduler.stats();
  EXPECT_EQ(st.paths[0].in_flight, 1u);
  EXPECT_EQ(st.paths[1].in_flight, 1u);
  EXPECT_EQ(st.paths[1].waiting, 0u);
  EXPECT_EQ(st.paths[1].queued, 1u);
  EXPECT_EQ(st.paths[1].waited, absl::Milliseconds(5));
  EXPECT_EQ(st.paths[1].waits_by_bucket[2], 1u);  // (1 ms, 10 ms]
  kept.Release();
  s2->Release();
  st = scheduler.stats();
  EXPECT_EQ(st.paths[0].in_flight + st.paths[1].in_flight, 0u);
  // A moved-from slot releases nothing twice.
  absl::StatusOr<FairScheduler::Slot> s3 = scheduler.Acquire(shm);
  ASSERT_TRUE(s3.ok());
  FairScheduler::Slot moved = *std::move(s3);
  s3->Release();
  EXPECT_EQ(scheduler.stats().paths[0].in_flight, 1u);
}

TEST(FairSchedulerTest, ShutdownFailsWaitersAndLaterSteps) {
  FairScheduler scheduler({.slots = 1});
  auto flow = scheduler.Join("t", "c", DataPathKind::kSharedMemory);
  absl::StatusOr<FairScheduler::Slot> held = scheduler.Acquire(flow);
  ASSERT_TRUE(held.ok());
  absl::Status blocked_status;
  std::thread blocked([&] { blocked_status = scheduler.Acquire(flow).status(); });
  Recorder rec;
  rec.Expect(2);
  scheduler.Submit(scheduler.Join("t", "g", DataPathKind::kGrpc), rec.Step("queued"));
  while (scheduler.stats().paths[0].waiting == 0) std::this_thread::yield();
  scheduler.Shutdown();
  blocked.join();
  EXPECT_TRUE(absl::IsUnavailable(blocked_status)) << blocked_status;
  scheduler.Submit(flow, rec.Step("later"));
  EXPECT_THAT(rec.Wait(), ElementsAre("queued!", "later!"));
  EXPECT_TRUE(absl::IsUnavailable(scheduler.Acquire(flow).status()));
  held->Release();  // a slot held through shutdown is still given back
  EXPECT_EQ(scheduler.stats().paths[0].in_flight, 0u);
}

}  // namespace
}  // namespace kvcache
