// InflightCalls: registering, counting bytes, unregistering, the oldest-first
// snapshot, and many threads at once.
#include "server/frontdoor/inflight_calls.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <thread>
#include <vector>

namespace kvcache {
namespace {

TEST(InflightCallsTest, RegisteredUntilTheHandleGoes) {
  ManualClock clock;
  InflightCalls calls(&clock);
  EXPECT_EQ(calls.size(), 0u);
  {
    InflightCalls::Handle h = calls.Register("Fetch", "id-1", "unix:");
    EXPECT_TRUE(h.registered());
    h.AddBytes(100);
    h.AddBytes(28);
    const std::vector<InflightCalls::Entry> entries = calls.Snapshot();
    ASSERT_EQ(entries.size(), 1u);
    EXPECT_EQ(entries[0].method, "Fetch");
    EXPECT_EQ(entries[0].request_id, "id-1");
    EXPECT_EQ(entries[0].peer, "unix:");
    EXPECT_EQ(entries[0].start, clock.Now());
    EXPECT_EQ(entries[0].bytes, 128u);
  }
  EXPECT_EQ(calls.size(), 0u);
  EXPECT_TRUE(calls.Snapshot().empty());
}

TEST(InflightCallsTest, ResetAndMoveUnregisterOnce) {
  InflightCalls calls;
  InflightCalls::Handle a = calls.Register("Append", "a", "p");
  InflightCalls::Handle b = std::move(a);
  EXPECT_FALSE(a.registered());  // NOLINT(bugprone-use-after-move): moved from is empty
  a.AddBytes(5);                 // does nothing
  EXPECT_EQ(calls.size(), 1u);
  InflightCalls::Handle c = calls.Register("Fetch", "c", "p");
  b = std::move(c);  // drops the Append
  ASSERT_EQ(calls.size(), 1u);
  EXPECT_EQ(calls.Snapshot()[0].method, "Fetch");
  b.Reset();
  b.Reset();
  EXPECT_EQ(calls.size(), 0u);
  InflightCalls::Handle empty;
  empty.Reset();
}

TEST(InflightCallsTest, SnapshotIsOldestFirstWithAges) {
  ManualClock clock;
  InflightCalls calls(&clock);
  std::vector<InflightCalls::Handle> handles;
  for (int i = 0; i < 40; ++i) {  // more than there are shards
    handles.push_back(calls.Register("Fetch", std::to_string(i), "p"));
    clock.Advance(absl::Milliseconds(10));
  }
  handles[3].Reset();
  const std::vector<InflightCalls::Entry> entries = calls.Snapshot();
  ASSERT_EQ(entries.size(), 39u);
  for (size_t i = 1; i < entries.size(); ++i) EXPECT_LT(entries[i - 1].start, entries[i].start);
  EXPECT_EQ(entries[0].request_id, "0");
  EXPECT_EQ(entries[3].request_id, "4");

  google::protobuf::RepeatedPtrField<v1::InflightCall> out;
  handles[0].AddBytes(7);
  FillInflightCalls(calls, clock.Now(), &out);
  ASSERT_EQ(out.size(), 39);
  EXPECT_EQ(out[0].method(), "Fetch");
  EXPECT_EQ(out[0].request_id(), "0");
  EXPECT_EQ(out[0].peer(), "p");
  EXPECT_EQ(out[0].age_ms(), 400u);
  EXPECT_EQ(out[0].bytes(), 7u);
  EXPECT_EQ(out[38].age_ms(), 10u);
}

TEST(InflightCallsTest, ManyThreadsRegisterCountAndSnapshot) {
  InflightCalls calls;
  std::atomic<bool> stop{false};
  std::thread reader([&] {
    while (!stop.load()) {
      for (const InflightCalls::Entry& e : calls.Snapshot()) EXPECT_EQ(e.method, "Append");
    }
  });
  std::vector<std::thread> workers;
  for (int t = 0; t < 8; ++t) {
    workers.emplace_back([&calls, t] {
      for (int i = 0; i < 2000; ++i) {
        InflightCalls::Handle h = calls.Register("Append", std::to_string(t), "p");
        h.AddBytes(1);
      }
    });
  }
  for (std::thread& w : workers) w.join();
  stop = true;
  reader.join();
  EXPECT_EQ(calls.size(), 0u);
}

}  // namespace
}  // namespace kvcache
