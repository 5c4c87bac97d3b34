// TouchBuffer: touches come back leaf first and in the order recorded, a
// stripe with no room refuses a path whole, and touches recorded by many
// readers at once under a shared lock all come back to the drainer.
#include "server/core/touch_buffer.h"

#include <gtest/gtest.h>

#include <atomic>
#include <thread>
#include <vector>

#include "absl/container/flat_hash_map.h"
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

TEST(TouchBufferTest, AThreadDrainsOnlyItsOwnStripe) {
  TouchBuffer buffer;
  const absl::Time t = absl::FromUnixSeconds(1);
  // Two threads that record for the first time get stripes of their own.
  std::vector<IndexNode*> mine = {Node(1)};
  std::vector<IndexNode*> theirs = {Node(2)};
  std::thread([&] { ASSERT_TRUE(buffer.Record(theirs, t)); }).join();
  std::vector<std::pair<IndexNode*, absl::Time>> drained;
  std::thread([&] {
    ASSERT_TRUE(buffer.Record(mine, t));
    buffer.DrainStripeOfThisThread(
        [&](IndexNode* n, absl::Time at) { drained.emplace_back(n, at); });
  }).join();
  EXPECT_EQ(drained, (std::vector<std::pair<IndexNode*, absl::Time>>{{Node(1), t}}));
  EXPECT_FALSE(buffer.empty());
  EXPECT_EQ(DrainAll(buffer), (std::vector<std::pair<IndexNode*, absl::Time>>{{Node(2), t}}));
}

// Readers record under the shared lock, and apply their own full stripe
// still holding it (taking turns, as the cache does), while a drainer takes
// the exclusive lock now and then; every touch recorded is applied exactly
// once (run under TSan with the core suites).
TEST(TouchBufferTest, ConcurrentReadersLoseNoTouch) {
  TouchBuffer buffer;
  SharedMutex mu;
  constexpr int kReaders = 6;
  constexpr int kPathsPerReader = 4000;  // 20,000 touches each: stripes fill
  std::vector<std::vector<IndexNode*>> paths(kReaders);
  for (int r = 0; r < kReaders; ++r) {
    for (int d = 0; d < 5; ++d) paths[r].push_back(Node(1 + r * 10 + d));
  }
  Mutex turn;  // the appliers' turns; `applied` is the policy they change
  absl::flat_hash_map<IndexNode*, int> applied;
  auto count = [&](IndexNode* n, absl::Time) { ++applied[n]; };
  auto drain = [&] { buffer.Drain(count); };
  std::atomic<int> reader_drains{0};
  std::vector<std::thread> readers;
  for (int r = 0; r < kReaders; ++r) {
    readers.emplace_back([&, r] {
      for (int i = 0; i < kPathsPerReader; ++i) {
        ReaderMutexLock lock(&mu);
        if (buffer.Record(paths[r], absl::Now())) continue;
        {
          MutexLock my_turn(&turn);
          buffer.DrainStripeOfThisThread(count);
        }
        ++reader_drains;
        EXPECT_TRUE(buffer.Record(paths[r], absl::Now()));
      }
    });
  }
  std::thread drainer([&] {
    // Each reader records more than a stripe holds, so some reader applies
    // its own stripe before the exclusive drains begin.
    while (reader_drains.load() == 0) std::this_thread::yield();
    for (int i = 0; i < 200; ++i) {
      WriterMutexLock lock(&mu);
      drain();
    }
  });
  for (auto& t : readers) t.join();
  drainer.join();
  WriterMutexLock lock(&mu);
  drain();
  for (int r = 0; r < kReaders; ++r) {
    for (IndexNode* n : paths[r]) EXPECT_EQ(applied[n], kPathsPerReader);
  }
  EXPECT_GT(reader_drains.load(), 0);  // the readers' own path ran
}

}  // namespace
}  // namespace kvcache
