// TouchBuffer: touches come back leaf first and in the order recorded, a
// stripe with no room refuses a path whole, a use applies at once when no
// one else is applying its model's touches and is recorded otherwise
// (waiting for the turn only when its stripe is full), uses of different
// models apply side by side, and no use by many readers at once is lost.
#include "server/core/touch_buffer.h"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <mutex>
#include <thread>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "gmock/gmock.h"
#include "server/common/mutex.h"
#include "server/common/shared_mutex.h"

namespace kvcache {
namespace {

// Stand-ins: the buffer never dereferences the nodes.
IndexNode* Node(uintptr_t i) { return reinterpret_cast<IndexNode*>(i * 64); }

std::vector<std::pair<IndexNode*, absl::Time>> DrainAll(TouchBuffer& buffer) {
  std::vector<std::pair<IndexNode*, absl::Time>> out;
  buffer.Drain([&](IndexNode* n, absl::Time at) { out.emplace_back(n, at); });
  return out;
}

TEST(TouchBufferTest, APathComesBackLeafFirstAndPathsInOrder) {
  TouchBuffer buffer;
  EXPECT_TRUE(buffer.empty());
  const absl::Time t1 = absl::FromUnixSeconds(100);
  const absl::Time t2 = absl::FromUnixSeconds(200);
  std::vector<IndexNode*> first = {Node(1), Node(2), Node(3)};
  std::vector<IndexNode*> second = {Node(1), Node(4)};
  ASSERT_TRUE(buffer.Record(first, t1));
  ASSERT_TRUE(buffer.Record(second, t2));
  EXPECT_FALSE(buffer.empty());
  const auto drained = DrainAll(buffer);
  const std::vector<std::pair<IndexNode*, absl::Time>> expected = {
      {Node(3), t1}, {Node(2), t1}, {Node(1), t1}, {Node(4), t2}, {Node(1), t2}};
  EXPECT_EQ(drained, expected);
  EXPECT_TRUE(buffer.empty());
  EXPECT_TRUE(DrainAll(buffer).empty());
}

TEST(TouchBufferTest, AFullStripeRefusesAPathWholeUntilDrained) {
  TouchBuffer buffer;
  const absl::Time t = absl::FromUnixSeconds(1);
  std::vector<IndexNode*> almost(TouchBuffer::kStripeCapacity - 1, Node(7));
  ASSERT_TRUE(buffer.Record(almost, t));
  std::vector<IndexNode*> two = {Node(8), Node(9)};
  EXPECT_FALSE(buffer.Record(two, t));  // one slot left: nothing recorded
  std::vector<IndexNode*> one = {Node(10)};
  EXPECT_TRUE(buffer.Record(one, t));  // fits exactly
  const auto drained = DrainAll(buffer);
  ASSERT_EQ(drained.size(), TouchBuffer::kStripeCapacity);
  EXPECT_EQ(drained.back().first, Node(10));
  EXPECT_TRUE(buffer.Record(two, t));  // room again
  EXPECT_EQ(DrainAll(buffer).size(), 2u);
  // Longer than a stripe: never recordable.
  std::vector<IndexNode*> too_long(TouchBuffer::kStripeCapacity + 1, Node(3));
  EXPECT_FALSE(buffer.Record(too_long, t));
  EXPECT_TRUE(buffer.empty());
}

TEST(TouchBufferTest, UseAppliesAtOnceWhenItsModelsTurnIsFree) {
  TouchBuffer buffer;
  Mutex turn;
  const absl::Time t1 = absl::FromUnixSeconds(1);
  const absl::Time t2 = absl::FromUnixSeconds(2);
  // Two threads that record for the first time get stripes of their own.
  std::vector<IndexNode*> theirs = {Node(1)};
  std::vector<IndexNode*> mine_before = {Node(2)};
  std::vector<IndexNode*> mine = {Node(3), Node(4)};
  std::thread([&] { ASSERT_TRUE(buffer.Record(theirs, t1)); }).join();
  std::vector<std::pair<IndexNode*, absl::Time>> applied;
  std::thread([&] {
    ASSERT_TRUE(buffer.Record(mine_before, t1));
    // No one else holds the turn: the path, leaf first. Its stripe may hold
    // other models' touches: it waits for an exclusive drain.
    ASSERT_TRUE(buffer.Use(mine, t2, turn,
                           [&](IndexNode* n, absl::Time at) { applied.emplace_back(n, at); }));
  }).join();
  EXPECT_EQ(applied,
            (std::vector<std::pair<IndexNode*, absl::Time>>{{Node(4), t2}, {Node(3), t2}}));
  EXPECT_THAT(DrainAll(buffer), ::testing::UnorderedElementsAre(std::make_pair(Node(1), t1),
                                                                std::make_pair(Node(2), t1)));
  std::vector<IndexNode*> too_long(TouchBuffer::kStripeCapacity + 1, Node(5));
  EXPECT_FALSE(buffer.Use(too_long, t1, turn, [&](IndexNode*, absl::Time) { ADD_FAILURE(); }));
}

// A reader holding `turn` inside its apply until released.
class TurnHolder {
 public:
  TurnHolder(TouchBuffer& buffer, Mutex& turn) {
    thread_ = std::thread([&] {
      std::vector<IndexNode*> one = {Node(1)};
      buffer.Use(one, absl::FromUnixSeconds(1), turn, [&](IndexNode*, absl::Time) {
        std::unique_lock<std::mutex> lock(mu_);
        holding_ = true;
        cv_.notify_all();
        cv_.wait(lock, [&] { return release_; });
      });
    });
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait(lock, [&] { return holding_; });
  }
  void Release() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      release_ = true;
    }
    cv_.notify_all();
    thread_.join();
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  bool holding_ = false, release_ = false;
  std::thread thread_;
};

// While one reader applies (holds the turn), another of the same model
// records; once its stripe is full it waits for the turn, then applies its
// use (the full stripe waits for an exclusive drain).
TEST(TouchBufferTest, UseRecordsWhileAnotherAppliesAndWaitsItsTurnWhenFull) {
  TouchBuffer buffer;
  Mutex turn;
  const absl::Time t = absl::FromUnixSeconds(1);
  TurnHolder holder(buffer, turn);
  std::atomic<size_t> applied{0};
  std::atomic<bool> done{false};
  std::thread user([&] {
    std::vector<IndexNode*> path = {Node(2), Node(3)};
    // Fills its stripe (recorded, nothing applied), then one more use.
    for (size_t i = 0; i <= TouchBuffer::kStripeCapacity / 2; ++i) {
      buffer.Use(path, t, turn, [&](IndexNode*, absl::Time) { ++applied; });
    }
    done = true;
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  EXPECT_EQ(applied.load(), 0u);  // all recorded while the turn was taken
  EXPECT_FALSE(done.load());      // the use past a full stripe waits its turn
  holder.Release();
  user.join();
  EXPECT_EQ(applied.load(), 2u);  // the use that found the stripe full
  EXPECT_EQ(DrainAll(buffer).size(), TouchBuffer::kStripeCapacity);
}

// Models have turns of their own: while a reader of one applies, a reader
// of another applies at once too.
TEST(TouchBufferTest, UsesOfDifferentModelsApplySideBySide) {
  TouchBuffer buffer;
  Mutex turn_a, turn_b;
  TurnHolder holder(buffer, turn_a);
  std::vector<IndexNode*> path = {Node(2), Node(3)};
  size_t applied = 0;
  std::thread([&] {
    EXPECT_TRUE(buffer.Use(path, absl::FromUnixSeconds(2), turn_b,
                           [&](IndexNode*, absl::Time) { ++applied; }));
  }).join();
  EXPECT_EQ(applied, 2u);  // not recorded: model b's turn was free
  holder.Release();
  EXPECT_TRUE(DrainAll(buffer).empty());
}

// Readers use the buffer under the shared lock while a drainer takes the
// exclusive lock now and then; every use is applied exactly once (run under
// TSan with the core suites).
TEST(TouchBufferTest, ConcurrentReadersLoseNoTouch) {
  TouchBuffer buffer;
  SharedMutex mu;
  // Readers of two models: reader r's paths are model r % 2's.
  Mutex turns[2];
  constexpr int kReaders = 6;
  constexpr int kPathsPerReader = 4000;
  std::vector<std::vector<IndexNode*>> paths(kReaders);
  for (int r = 0; r < kReaders; ++r) {
    for (int d = 0; d < 5; ++d) paths[r].push_back(Node(1 + r * 10 + d));
  }
  // What the applies change (a model's policy, in the cache): only one
  // reader holds a model's turn at a time, and the drainer holds the lock
  // exclusively.
  absl::flat_hash_map<IndexNode*, int> applied[2];
  auto model_of = [](IndexNode* n) { return (reinterpret_cast<uintptr_t>(n) / 64 - 1) / 10 % 2; };
  auto count = [&](IndexNode* n, absl::Time) { ++applied[model_of(n)][n]; };
  std::atomic<int> done{0};
  std::vector<std::thread> readers;
  for (int r = 0; r < kReaders; ++r) {
    readers.emplace_back([&, r] {
      for (int i = 0; i < kPathsPerReader; ++i) {
        ReaderMutexLock lock(&mu);
        EXPECT_TRUE(buffer.Use(paths[r], absl::Now(), turns[r % 2], count));
      }
      ++done;
    });
  }
  std::thread drainer([&] {
    while (done.load() < kReaders) {
      WriterMutexLock lock(&mu);
      buffer.Drain(count);
    }
  });
  for (auto& t : readers) t.join();
  drainer.join();
  WriterMutexLock lock(&mu);
  buffer.Drain(count);
  for (int r = 0; r < kReaders; ++r) {
    for (IndexNode* n : paths[r]) EXPECT_EQ(applied[r % 2][n], kPathsPerReader);
  }
}

}  // namespace
}  // namespace kvcache
