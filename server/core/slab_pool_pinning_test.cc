// SlabPool with a HostMemoryRegistrar (the GPU tier's pinning): every
// mapping registered once, unregistered exactly before it is unmapped, split
// spans re-registered slab by slab, refusals counted and harmless.
#include <gtest/gtest.h>

#include <cstring>
#include <iterator>
#include <map>
#include <memory>
#include <random>
#include <vector>

#include "server/core/slab_pool.h"

namespace kvcache {
namespace {

constexpr uint64_t kKiB = 1024;
constexpr uint64_t kMiB = 1024 * kKiB;

// Records what a pool registers, and checks the HostMemoryRegistrar contract
// as it goes: ranges never overlap, and each is unregistered with exactly the
// data and bytes it was registered with.
class RecordingRegistrar final : public HostMemoryRegistrar {
 public:
  absl::Status Register(std::byte* data, uint64_t bytes) override {
    if (refuse_) return absl::UnavailableError("refused by the test");
    auto next = ranges_.lower_bound(data);
    EXPECT_TRUE(next == ranges_.end() || next->first >= data + bytes) << "overlaps the next range";
    if (next != ranges_.begin()) {
      EXPECT_LE(std::prev(next)->first + std::prev(next)->second, data) << "overlaps the previous";
    }
    ranges_[data] = bytes;
    ++registered_;
    if (bytes > max_bytes_) max_bytes_ = bytes;
    return absl::OkStatus();
  }
  void Unregister(std::byte* data, uint64_t bytes) override {
    auto it = ranges_.find(data);
    ASSERT_NE(it, ranges_.end()) << "unregister of a range never registered";
    EXPECT_EQ(it->second, bytes);
    ranges_.erase(it);
    ++unregistered_;
  }
  // Whether [data, data + bytes) lies in one registered range.
  bool Covers(const Allocation& a) const {
    auto it = ranges_.upper_bound(a.data);
    if (it == ranges_.begin()) return false;
    --it;
    return a.data + a.bytes <= it->first + it->second;
  }
  uint64_t bytes() const {
    uint64_t total = 0;
    for (const auto& [data, bytes] : ranges_) total += bytes;
    return total;
  }

  bool refuse_ = false;
  std::map<std::byte*, uint64_t> ranges_;
  uint64_t registered_ = 0;
  uint64_t unregistered_ = 0;
  uint64_t max_bytes_ = 0;
};

TEST(SlabPoolPinningTest, EveryLiveAllocationLiesInARegisteredRange) {
  auto registrar = std::make_shared<RecordingRegistrar>();
  constexpr uint64_t kSlab = 256 * kKiB;
  {
    auto pool = SlabPool::Create(
        {.capacity_bytes = 16 * kSlab, .slab_bytes = kSlab, .min_class_bytes = 64}, registrar);
    ASSERT_TRUE(pool.ok()) << pool.status();
    std::mt19937_64 rng(11);
    // Sizes from 64 bytes to runs of several slabs, under capacity pressure:
    // spans are mapped, split into slabs, unmapped for room, runs reused.
    const uint64_t sizes[] = {64, 1000, 3 * kKiB, 40 * kKiB, 200 * kKiB, kSlab, 3 * kSlab};
    std::vector<Allocation> live;
    for (int step = 0; step < 20000; ++step) {
      if (live.empty() || rng() % 100 < 55) {
        absl::StatusOr<Allocation> a = (*pool)->Allocate(sizes[rng() % std::size(sizes)]);
        if (a.ok()) {
          ASSERT_TRUE(registrar->Covers(*a)) << "step " << step;
          live.push_back(*a);
        }
      } else {
        const size_t i = rng() % live.size();
        (*pool)->Free(live[i]);
        live[i] = live.back();
        live.pop_back();
      }
      if (step % 5000 == 0) {
        // A compaction plan drains and releases spans as well.
        ASSERT_TRUE((*pool)->PlanCompaction({}).ok());
      }
    }
    for (const Allocation& a : live) ASSERT_TRUE(registrar->Covers(a));
    const SlabPoolStats stats = (*pool)->GetStats();
    EXPECT_EQ(stats.pinned_bytes, registrar->bytes());
    EXPECT_EQ(stats.pin_failures, 0u);
    EXPECT_GT(registrar->unregistered_, 0u);  // mappings came and went
    EXPECT_GT(registrar->max_bytes_, kSlab);  // multi-slab spans and runs
    for (const Allocation& a : live) (*pool)->Free(a);
  }
  // The pool unregistered everything it registered before unmapping it.
  EXPECT_TRUE(registrar->ranges_.empty());
  EXPECT_EQ(registrar->registered_, registrar->unregistered_);
}

TEST(SlabPoolPinningTest, AFreeSpanSplitIntoSlabsIsRegisteredSlabBySlab) {
  auto registrar = std::make_shared<RecordingRegistrar>();
  constexpr uint64_t kSlab = 64 * kKiB;
  auto pool = SlabPool::Create(
      {.capacity_bytes = 8 * kSlab, .slab_bytes = kSlab, .min_class_bytes = 64}, registrar);
  ASSERT_TRUE(pool.ok());
  // A class whose span takes several slabs (a chunk that does not divide
  // one slab), freed: the span stays mapped, and registered whole.
  const uint64_t odd = (*pool)->RoundedSize(40 * kKiB);
  std::vector<Allocation> held;
  for (;;) {
    absl::StatusOr<Allocation> a = (*pool)->Allocate(odd);
    if (!a.ok()) break;
    held.push_back(*a);
  }
  ASSERT_FALSE(held.empty());
  const uint64_t largest = registrar->max_bytes_;
  ASSERT_GT(largest, kSlab) << "the class should take multi-slab spans";
  for (const Allocation& a : held) (*pool)->Free(a);
  (*pool)->FlushThreadCaches();  // a cached chunk would keep its span reserved
  // A one-slab class now takes a slab of that free span: every slab of it is
  // registered on its own, so each can be unmapped alone later.
  absl::StatusOr<Allocation> small = (*pool)->Allocate(64);
  ASSERT_TRUE(small.ok());
  EXPECT_TRUE(registrar->Covers(*small));
  for (const auto& [data, bytes] : registrar->ranges_) EXPECT_EQ(bytes, kSlab);
  EXPECT_EQ((*pool)->GetStats().pinned_bytes, registrar->bytes());
  (*pool)->Free(*small);
}

TEST(SlabPoolPinningTest, ARefusedRegistrationLeavesTheMemoryUsableAndIsCounted) {
  auto registrar = std::make_shared<RecordingRegistrar>();
  registrar->refuse_ = true;
  auto pool = SlabPool::Create(
      {.capacity_bytes = 4 * kMiB, .slab_bytes = kMiB, .min_class_bytes = 64}, registrar);
  ASSERT_TRUE(pool.ok());
  absl::StatusOr<Allocation> a = (*pool)->Allocate(4096);
  ASSERT_TRUE(a.ok());
  std::memset(a->data, 0x2a, a->bytes);  // writable: mapped all the same
  EXPECT_EQ(a->data[a->bytes - 1], std::byte{0x2a});
  const SlabPoolStats stats = (*pool)->GetStats();
  EXPECT_EQ(stats.pin_failures, 1u);
  EXPECT_EQ(stats.pinned_bytes, 0u);
  (*pool)->Free(*a);
}

}  // namespace
}  // namespace kvcache
