// RpcTally: per-method counts, and every report passed on unchanged.
#include "server/rpc/rpc_tally.h"

#include <gtest/gtest.h>

#include <thread>
#include <vector>

namespace kvcache {
namespace {

class Recorder final : public RpcObserver {
 public:
  void OnRpcDone(std::string_view method, absl::StatusCode, absl::Duration, uint64_t) override {
    done.emplace_back(method);
  }
  void OnStreamTimeout(std::string_view method) override { timeouts.emplace_back(method); }
  void OnLimitReached(std::string_view, std::string_view limit) override {
    limits.emplace_back(limit);
  }
  std::vector<std::string> done, timeouts, limits;
};

TEST(RpcTallyTest, CountsCallsErrorsBytesAndLatencyPerMethod) {
  Recorder next;
  RpcTally tally(&next);
  tally.OnRpcDone("Fetch", absl::StatusCode::kOk, absl::Microseconds(300), 2048);
  tally.OnRpcDone("Fetch", absl::StatusCode::kDataLoss, absl::Microseconds(100), 0);
  tally.OnRpcDone("Lookup", absl::StatusCode::kOk, absl::Microseconds(20), 0);
  tally.OnStreamTimeout("Append");
  tally.OnLimitReached("Fetch", "max_concurrent_streams");

  const std::vector<RpcCount> counts = tally.Counts();
  ASSERT_EQ(counts.size(), 2u);  // by name; timeouts and limits are not calls
  EXPECT_EQ(counts[0].method, "Fetch");
  EXPECT_EQ(counts[0].calls, 2u);
  EXPECT_EQ(counts[0].errors, 1u);
  EXPECT_EQ(counts[0].payload_bytes, 2048u);
  EXPECT_EQ(counts[0].latency_us_sum, 400u);
  EXPECT_EQ(counts[1].method, "Lookup");
  EXPECT_EQ(counts[1].calls, 1u);
  EXPECT_EQ(next.done, (std::vector<std::string>{"Fetch", "Fetch", "Lookup"}));
  EXPECT_EQ(next.timeouts, (std::vector<std::string>{"Append"}));
  EXPECT_EQ(next.limits, (std::vector<std::string>{"max_concurrent_streams"}));
}

TEST(RpcTallyTest, ConcurrentReportsAreAllCounted) {
  RpcTally tally(nullptr);
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&] {
      for (int i = 0; i < 1000; ++i)
        tally.OnRpcDone("Lookup", absl::StatusCode::kOk, absl::ZeroDuration(), 1);
    });
  }
  for (std::thread& t : threads) t.join();
  ASSERT_EQ(tally.Counts().size(), 1u);
  EXPECT_EQ(tally.Counts()[0].calls, 4000u);
  EXPECT_EQ(tally.Counts()[0].payload_bytes, 4000u);
}

}  // namespace
}  // namespace kvcache
