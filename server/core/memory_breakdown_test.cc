#include "server/core/memory_breakdown.h"

#include <map>
#include <numeric>
#include <string>

#include "gtest/gtest.h"

namespace kvcache {
namespace {

constexpr uint64_t kMiB = uint64_t{1} << 20;

MemoryInputs Inputs() {
  MemoryInputs in;
  in.process = {.vm_rss_bytes = 400 * kMiB,
                .rss_anon_bytes = 330 * kMiB,
                .rss_file_bytes = 20 * kMiB,
                .rss_shmem_bytes = 50 * kMiB,
                .threads = 64};
  in.malloc = {.in_use_bytes = 40 * kMiB, .free_bytes = 6 * kMiB, .mapped_bytes = 10 * kMiB};
  in.malloc_trims = 7;
  in.capacity_bytes = 256 * kMiB;
  in.pool_reserved_bytes = 256 * kMiB;
  in.metadata_bytes = 5 * kMiB;
  in.ssd_staging_bytes = 8 * kMiB;
  in.checkpoint_writer_bytes = 3 * kMiB;
  in.shm_connections = 16;
  return in;
}

TEST(MemoryBreakdownTest, TheBoundIsCapacityTimesOnePointOnePlus64MiB) {
  EXPECT_EQ(MemoryBoundBytes(256 * kMiB), 256 * kMiB + 256 * kMiB / 10 + 64 * kMiB);
  EXPECT_EQ(MemoryBoundBytes(0), 64 * kMiB);
}

TEST(MemoryBreakdownTest, PartsAddUpToTheDaemonsOwnMemory) {
  const MemoryBreakdown b = BreakDownMemory(Inputs());
  EXPECT_EQ(b.own_bytes, 350 * kMiB);
  EXPECT_EQ(b.part(MemoryPart::kHostPool), 256 * kMiB);
  EXPECT_EQ(b.part(MemoryPart::kIndexMetadata), 5 * kMiB);
  EXPECT_EQ(b.part(MemoryPart::kSsdStaging), 8 * kMiB);
  EXPECT_EQ(b.part(MemoryPart::kCheckpointWriter), 3 * kMiB);
  // The heap in use minus the heap parts counted above.
  EXPECT_EQ(b.part(MemoryPart::kConnections), 24 * kMiB);
  EXPECT_EQ(b.part(MemoryPart::kThreadStacks), 64 * kThreadStackResidentBytes);
  EXPECT_EQ(b.part(MemoryPart::kAllocatorFree), 6 * kMiB);
  EXPECT_EQ(b.part(MemoryPart::kBinary), 20 * kMiB);
  EXPECT_EQ(std::accumulate(b.parts.begin(), b.parts.end(), uint64_t{0}), b.own_bytes);
  EXPECT_EQ(b.part(MemoryPart::kUnattributed), 350 * kMiB - 318 * kMiB - 6 * kMiB);
  EXPECT_EQ(b.bound_bytes, MemoryBoundBytes(256 * kMiB));
  EXPECT_TRUE(b.over_bound());  // 350 MiB > 345.6 MiB
}

TEST(MemoryBreakdownTest, CountedHeapPartsAreCappedByTheHeapInUse) {
  MemoryInputs in = Inputs();
  in.metadata_bytes = 100 * kMiB;  // an over-estimate: only 40 MiB of heap is in use
  const MemoryBreakdown b = BreakDownMemory(in);
  EXPECT_EQ(b.part(MemoryPart::kIndexMetadata), 40 * kMiB);
  EXPECT_EQ(b.part(MemoryPart::kSsdStaging), 0u);
  EXPECT_EQ(b.part(MemoryPart::kConnections), 0u);
  EXPECT_EQ(std::accumulate(b.parts.begin(), b.parts.end(), uint64_t{0}), b.own_bytes);
}

TEST(MemoryBreakdownTest, PartsPastTheMeasuredTotalAreCutInOrder) {
  MemoryInputs in = Inputs();
  in.pool_reserved_bytes = 340 * kMiB;  // leaves 10 MiB: binary takes it all
  const MemoryBreakdown b = BreakDownMemory(in);
  EXPECT_EQ(b.part(MemoryPart::kHostPool), 340 * kMiB);
  EXPECT_EQ(b.part(MemoryPart::kBinary), 10 * kMiB);
  EXPECT_EQ(b.part(MemoryPart::kConnections), 0u);
  EXPECT_EQ(b.part(MemoryPart::kUnattributed), 0u);
  EXPECT_EQ(std::accumulate(b.parts.begin(), b.parts.end(), uint64_t{0}), b.own_bytes);
}

TEST(MemoryBreakdownTest, AllocatorFreeTakesOnlyWhatTheMeasuredPartsLeave) {
  MemoryInputs in = Inputs();
  in.malloc.free_bytes = 500 * kMiB;  // mostly trimmed already
  const MemoryBreakdown b = BreakDownMemory(in);
  EXPECT_EQ(b.part(MemoryPart::kAllocatorFree), 350 * kMiB - 318 * kMiB);
  EXPECT_EQ(b.part(MemoryPart::kUnattributed), 0u);
}

TEST(MemoryBreakdownTest, OverTheBoundIsSaid) {
  MemoryInputs in = Inputs();
  in.process.vm_rss_bytes = 395 * kMiB;  // own 345 MiB
  EXPECT_FALSE(BreakDownMemory(in).over_bound());
  in.process.vm_rss_bytes = 396 * kMiB;  // own 346 MiB
  EXPECT_TRUE(BreakDownMemory(in).over_bound());
}

class Recorder : public CounterVisitor {
 public:
  std::map<std::string, double> samples;

 private:
  void OnSample(const CounterFamily& family, std::span<const CounterLabel> labels,
                double value) override {
    std::string key(family.name);
    for (const CounterLabel& l : labels) {
      key += "{" + std::string(l.name) + "=" + std::string(l.value) + "}";
    }
    samples[key] = value;
  }
};

TEST(MemoryBreakdownTest, VisitsEveryPartAndTheProcessNumbers) {
  const MemoryBreakdown b = BreakDownMemory(Inputs());
  Recorder r;
  b.VisitCounters(r);
  for (size_t i = 0; i < kMemoryParts; ++i) {
    const std::string name(MemoryPartName(static_cast<MemoryPart>(i)));
    EXPECT_EQ(r.samples.count("kvcached_memory_bytes{part=" + name + "}"), 1u) << name;
  }
  EXPECT_EQ(r.samples["kvcached_memory_bytes{part=host_pool}"], 256.0 * kMiB);
  EXPECT_EQ(r.samples["kvcached_memory_resident_bytes{kind=own}"], 350.0 * kMiB);
  EXPECT_EQ(r.samples["kvcached_memory_resident_bytes{kind=shared}"], 50.0 * kMiB);
  EXPECT_EQ(r.samples["kvcached_process_threads"], 64);
  EXPECT_EQ(r.samples["kvcached_malloc_trims_total"], 7);
  EXPECT_EQ(r.samples["kvcached_memory_bound_bytes"], static_cast<double>(b.bound_bytes));
}

}  // namespace
}  // namespace kvcache
