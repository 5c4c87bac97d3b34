#include "server/shm/copy_engine.h"

#include <cstring>
#include <thread>
#include <vector>

#include "gtest/gtest.h"

namespace kvcache {
namespace {

std::vector<std::byte> Pattern(size_t n, uint8_t seed) {
  std::vector<std::byte> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = std::byte(static_cast<uint8_t>(i * 31 + seed));
  return v;
}

// Copies `sizes` ranges from patterned sources into zeroed destinations with
// `engine` and checks every byte.
void CopyAndCheck(CopyEngine& engine, const std::vector<size_t>& sizes, uint8_t seed) {
  std::vector<std::vector<std::byte>> src, dst;
  std::vector<CopyRange> ranges;
  for (size_t i = 0; i < sizes.size(); ++i) {
    src.push_back(Pattern(sizes[i], static_cast<uint8_t>(seed + i)));
    dst.emplace_back(sizes[i]);
  }
  for (size_t i = 0; i < sizes.size(); ++i) {
    ranges.push_back({dst[i].data(), src[i].data(), sizes[i]});
  }
  engine.Copy(ranges);
  for (size_t i = 0; i < sizes.size(); ++i) ASSERT_EQ(src[i], dst[i]) << "range " << i;
}

TEST(CopyEngineTest, CopiesAloneWithoutHelpers) {
  CopyEngine engine(0, 0);
  CopyAndCheck(engine, {1, 4096, 3 << 20, 0, 777}, 1);
}

TEST(CopyEngineTest, HelpersSplitLargeRangesIntoPieces) {
  CopyEngine engine(3, 1 << 20);
  // Uneven sizes: pieces of 1 MiB and remainders.
  CopyAndCheck(engine, {(5 << 20) + 123, 1 << 20, 17, (2 << 20) - 1}, 2);
}

TEST(CopyEngineTest, SmallRequestsStayOnTheCallersThread) {
  CopyEngine engine(2, 64 << 20);
  CopyAndCheck(engine, {1 << 20, 1 << 20}, 3);
}

TEST(CopyEngineTest, ConcurrentCallersShareTheHelpers) {
  CopyEngine engine(2, 1 << 20);
  std::vector<std::thread> callers;
  for (int t = 0; t < 6; ++t) {
    callers.emplace_back([&engine, t] {
      for (int round = 0; round < 5; ++round) {
        CopyAndCheck(engine, {(3 << 20) + static_cast<size_t>(t), 4096},
                     static_cast<uint8_t>(t * 7 + round));
      }
    });
  }
  for (std::thread& t : callers) t.join();
}

}  // namespace
}  // namespace kvcache
