#include "server/tier/ssd_store.h"

#include <fcntl.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <linux/magic.h>
#include <sys/statfs.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <random>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "server/common/status_macros.h"
#include "server/tier/ssd_io.h"
#include "server/tier/ssd_layout.h"
#include "xxhash.h"

namespace kvcache {
namespace {

using ::testing::HasSubstr;
using ::testing::StartsWith;

constexpr uint64_t kKiB = 1024;
constexpr uint64_t kMiB = 1024 * kKiB;

// Store files live under $TMPDIR when set, else in the build tree (disk-backed,
// so O_DIRECT is exercised for real).
std::string TestDir() {
  const char* tmp = std::getenv("TMPDIR");
  return tmp != nullptr && *tmp != '\0' ? tmp : KVCACHE_SSD_TEST_DIR;
}

std::string UniquePath(const std::string& dir) {
  const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
  std::string name = std::string(info->test_suite_name()) + "." + info->name();
  for (char& c : name) {
    if (c == '/') c = '_';
  }
  return dir + "/ssd_store_test." + std::to_string(getpid()) + "." + name + ".bin";
}

// Deterministic bytes for block `key`.
std::vector<std::byte> Pattern(uint64_t key, uint64_t size) {
  std::vector<std::byte> bytes(size);
  std::mt19937_64 rng(key * 0x9e3779b97f4a7c15ULL + size);
  for (uint64_t i = 0; i < size; i += 8) {
    const uint64_t v = rng();
    std::memcpy(bytes.data() + i, &v, std::min<uint64_t>(8, size - i));
  }
  return bytes;
}

uint64_t Xxh(std::span<const std::byte> bytes) { return XXH3_64bits(bytes.data(), bytes.size()); }

absl::StatusOr<SsdRef> WriteBlock(SsdStore& store, uint64_t key, uint64_t size) {
  const std::vector<std::byte> data = Pattern(key, size);
  return store.Write(key, data, Xxh(data));
}

// Reads `extent` and checks it against Pattern(key, size).
absl::Status ReadAndCheck(SsdStore& store, const SsdExtent& extent) {
  std::vector<std::byte> out(extent.size());
  KVCACHE_RETURN_IF_ERROR(store.Read(extent, out));
  if (out != Pattern(extent.key(), extent.size())) return absl::InternalError("wrong bytes");
  return absl::OkStatus();
}

// Overwrites `bytes` at `offset` of the store's file behind its back.
void Corrupt(const std::string& path, uint64_t offset, std::span<const std::byte> bytes) {
  const int fd = ::open(path.c_str(), O_WRONLY);
  ASSERT_GE(fd, 0) << std::strerror(errno);
  ASSERT_EQ(pwrite(fd, bytes.data(), bytes.size(), offset), static_cast<ssize_t>(bytes.size()));
  close(fd);
}

void FlipByte(const std::string& path, uint64_t offset) {
  const int fd = ::open(path.c_str(), O_RDWR);
  ASSERT_GE(fd, 0) << std::strerror(errno);
  std::byte b;
  ASSERT_EQ(pread(fd, &b, 1, offset), 1);
  b ^= std::byte{0x5a};
  ASSERT_EQ(pwrite(fd, &b, 1, offset), 1);
  close(fd);
}

class SsdStoreTest : public ::testing::TestWithParam<SsdIoEngine> {
 protected:
  void SetUp() override {
    struct statfs fs;
    ASSERT_EQ(statfs(TestDir().c_str(), &fs), 0) << TestDir();
    if (fs.f_type == TMPFS_MAGIC) {
      std::fprintf(stderr, "note: %s is tmpfs; O_DIRECT is not exercised\n", TestDir().c_str());
    }
    path_ = UniquePath(TestDir());
  }
  void TearDown() override {
    store_.reset();
    std::filesystem::remove(path_);
  }

  SsdStore& Open(uint64_t capacity, uint64_t region, uint64_t epoch = 0) {
    SsdStoreOptions options;
    options.path = path_;
    options.capacity_bytes = capacity;
    options.region_bytes = region;
    options.engine = GetParam();
    options.epoch = epoch;
    auto store = SsdStore::Open(options);
    EXPECT_TRUE(store.ok()) << store.status();
    store_ = *std::move(store);
    return *store_;
  }

  // A restart: the store is closed (after every extent of it was released,
  // as the store must outlive them) and another opens the same file.
  SsdStore& Reopen(uint64_t capacity, uint64_t region, uint64_t epoch) {
    store_.reset();
    return Open(capacity, region, epoch);
  }

  std::string path_;
  std::unique_ptr<SsdStore> store_;
};

TEST_P(SsdStoreTest, UsesTheEngineAskedFor) {
  SsdStore& store = Open(4 * kMiB, 1 * kMiB);
  const SsdStoreStats stats = store.GetStats();
  EXPECT_EQ(stats.engine, GetParam() == SsdIoEngine::kThreadPool ? "thread_pool" : "io_uring");
  EXPECT_EQ(stats.capacity_bytes, 4 * kMiB);
  EXPECT_EQ(std::filesystem::file_size(path_), 4 * kMiB);
}

TEST_P(SsdStoreTest, RoundTripsManySizes) {
  SsdStore& store = Open(64 * kMiB, 4 * kMiB);
  std::vector<SsdRef> refs;
  uint64_t key = 1;
  for (uint64_t size : {uint64_t{1}, uint64_t{4095}, uint64_t{4096}, uint64_t{4032}, uint64_t{4033},
                        100 * kKiB, 2 * kMiB, 4 * kMiB - 64}) {
    auto ref = WriteBlock(store, key, size);
    ASSERT_TRUE(ref.ok()) << size << ": " << ref.status();
    const SsdExtent& e = **ref;
    EXPECT_EQ(e.key(), key);
    EXPECT_EQ(e.size(), size);
    EXPECT_EQ(e.offset() % 4096, 0u);
    EXPECT_EQ(e.footprint(), store.RoundedSize(size));
    EXPECT_GE(e.footprint(), size + 64);
    EXPECT_EQ(e.sequence(), key);
    EXPECT_TRUE(ReadAndCheck(store, e).ok()) << size;
    refs.push_back(*std::move(ref));
    ++key;
  }
  for (const SsdRef& ref : refs) {
    EXPECT_TRUE(ReadAndCheck(store, *ref).ok()) << ref->size();
  }
  const SsdStoreStats stats = store.GetStats();
  EXPECT_EQ(stats.live_extents, refs.size());
  EXPECT_EQ(stats.writes, refs.size());
  EXPECT_EQ(stats.reads, 2 * refs.size());
  EXPECT_EQ(stats.checksum_failures, 0u);
}

TEST_P(SsdStoreTest, RejectsSizesOutsideARegion) {
  SsdStore& store = Open(1 * kMiB, 256 * kKiB);
  EXPECT_EQ(store.Write(1, {}, 0).status().code(), absl::StatusCode::kInvalidArgument);
  auto too_big = WriteBlock(store, 2, 256 * kKiB - 63);
  EXPECT_EQ(too_big.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(too_big.status().message(), HasSubstr("region_bytes"));
  EXPECT_EQ(store.RoundedSize(0), 0u);
  EXPECT_EQ(store.RoundedSize(256 * kKiB - 63), 0u);
  auto largest = WriteBlock(store, 3, 256 * kKiB - 64);
  ASSERT_TRUE(largest.ok()) << largest.status();
  EXPECT_EQ((*largest)->footprint(), 256 * kKiB);
}

TEST_P(SsdStoreTest, ReadChecksArguments) {
  SsdStore& store = Open(1 * kMiB, 256 * kKiB);
  auto ref = WriteBlock(store, 1, 1000);
  ASSERT_TRUE(ref.ok());
  std::vector<std::byte> small(999);
  EXPECT_EQ(store.Read(**ref, small).code(), absl::StatusCode::kInvalidArgument);

  SsdStoreOptions other_options;
  other_options.path = path_ + ".other";
  other_options.capacity_bytes = 1 * kMiB;
  other_options.region_bytes = 256 * kKiB;
  auto other = SsdStore::Open(other_options);
  ASSERT_TRUE(other.ok());
  std::vector<std::byte> out(1000);
  EXPECT_EQ((*other)->Read(**ref, out).code(), absl::StatusCode::kInvalidArgument);
  other->reset();
  std::filesystem::remove(other_options.path);
}

TEST_P(SsdStoreTest, ConcurrentWritersAndReaders) {
  SsdStore& store = Open(64 * kMiB, 1 * kMiB);
  constexpr int kThreads = 8;
  constexpr int kBlocksPerThread = 60;
  std::atomic<int> failures{0};
  std::mutex mu;
  std::vector<SsdRef> shared;  // guarded by mu
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      std::mt19937_64 rng(t);
      std::vector<SsdRef> mine;
      for (int i = 0; i < kBlocksPerThread; ++i) {
        const uint64_t key = uint64_t(t) << 32 | i;
        const uint64_t size = 1 + rng() % (96 * kKiB);
        auto ref = WriteBlock(store, key, size);
        if (!ref.ok()) {
          ++failures;
          continue;
        }
        if (!ReadAndCheck(store, **ref).ok()) ++failures;
        SsdRef other;
        {
          std::lock_guard<std::mutex> lock(mu);
          shared.push_back(*ref);
          other = shared[rng() % shared.size()];
          if (shared.size() > 64) shared.erase(shared.begin() + rng() % shared.size());
        }
        if (!ReadAndCheck(store, *other).ok()) ++failures;
        mine.push_back(*std::move(ref));
        if (mine.size() > 20) mine.erase(mine.begin());  // frees slots while others write
      }
      for (const SsdRef& ref : mine) {
        if (!ReadAndCheck(store, *ref).ok()) ++failures;
      }
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(failures.load(), 0);
  shared.clear();
  const SsdStoreStats stats = store.GetStats();
  EXPECT_EQ(stats.writes, uint64_t{kThreads * kBlocksPerThread});
  EXPECT_EQ(stats.live_extents, 0u);
  EXPECT_EQ(stats.allocated_bytes, 0u);
  EXPECT_EQ(stats.reserved_bytes, 0u);
  EXPECT_EQ(stats.checksum_failures, 0u);
}

// Fills a 4-region store with 8 KiB blocks; returns the refs (the last write
// answered RESOURCE_EXHAUSTED).
std::vector<SsdRef> Fill(SsdStore& store, uint64_t first_key) {
  std::vector<SsdRef> refs;
  for (uint64_t key = first_key;; ++key) {
    auto ref = WriteBlock(store, key, 8 * kKiB);
    if (!ref.ok()) {
      EXPECT_EQ(ref.status().code(), absl::StatusCode::kResourceExhausted) << ref.status();
      return refs;
    }
    refs.push_back(*std::move(ref));
  }
}

TEST_P(SsdStoreTest, ReusesExtentsAfterTheLastReferenceDrops) {
  SsdStore& store = Open(256 * kKiB, 64 * kKiB);
  std::vector<SsdRef> first = Fill(store, 1);
  // 8 KiB + header takes a 12 KiB slot: 5 per 64 KiB region.
  ASSERT_EQ(first.size(), 4u * 5);
  std::set<uint64_t> offsets;
  for (const SsdRef& ref : first) offsets.insert(ref->offset());
  EXPECT_EQ(offsets.size(), first.size());

  SsdRef held = first[7];
  first.clear();  // all but `held` freed
  EXPECT_EQ(store.GetStats().live_extents, 1u);
  std::vector<SsdRef> second = Fill(store, 1000);
  EXPECT_EQ(second.size(), 4u * 5 - 1);
  for (const SsdRef& ref : second) {
    EXPECT_NE(ref->offset(), held->offset());
    EXPECT_TRUE(offsets.contains(ref->offset()));
    EXPECT_TRUE(ReadAndCheck(store, *ref).ok());
  }
  EXPECT_TRUE(ReadAndCheck(store, *held).ok());  // never overwritten while referenced

  second.clear();
  held.reset();
  const SsdStoreStats stats = store.GetStats();
  EXPECT_EQ(stats.live_extents, 0u);
  EXPECT_EQ(stats.reserved_bytes, 0u);
  // An empty store serves another class from the same regions.
  auto big = WriteBlock(store, 5000, 64 * kKiB - 64);
  EXPECT_TRUE(big.ok()) << big.status();
}

TEST_P(SsdStoreTest, ResourceExhaustedChangesNothing) {
  SsdStore& store = Open(256 * kKiB, 64 * kKiB);
  std::vector<SsdRef> refs = Fill(store, 1);
  const SsdStoreStats before = store.GetStats();
  EXPECT_EQ(before.reserved_bytes, 256 * kKiB);
  EXPECT_EQ(before.failed_writes, 1u);
  auto small = WriteBlock(store, 99, 100);  // another class: no free region either
  EXPECT_EQ(small.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(small.status().message(), HasSubstr("SSD store full"));
  const SsdStoreStats after = store.GetStats();
  EXPECT_EQ(after.failed_writes, 2u);
  EXPECT_EQ(after.live_extents, before.live_extents);
  EXPECT_EQ(after.allocated_bytes, before.allocated_bytes);
  EXPECT_EQ(after.payload_bytes, before.payload_bytes);
  EXPECT_EQ(after.writes, before.writes);
  for (const SsdRef& ref : refs) {
    EXPECT_TRUE(ReadAndCheck(store, *ref).ok());
  }
}

TEST_P(SsdStoreTest, CorruptPayloadIsDataLoss) {
  SsdStore& store = Open(1 * kMiB, 256 * kKiB);
  auto ref = WriteBlock(store, 7, 10000);
  ASSERT_TRUE(ref.ok());
  FlipByte(path_, (*ref)->offset() + 64 + 9999);  // last payload byte
  std::vector<std::byte> out(10000);
  const absl::Status s = store.Read(**ref, out);
  EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss) << s;
  EXPECT_THAT(s.message(), HasSubstr("payload checksum mismatch"));
  EXPECT_EQ(store.GetStats().checksum_failures, 1u);
  EXPECT_EQ(store.GetStats().reads, 0u);
}

TEST_P(SsdStoreTest, CorruptHeaderIsDataLoss) {
  SsdStore& store = Open(1 * kMiB, 256 * kKiB);
  auto ref = WriteBlock(store, 7, 10000);
  ASSERT_TRUE(ref.ok());
  FlipByte(path_, (*ref)->offset() + 8);  // the key
  std::vector<std::byte> out(10000);
  absl::Status s = store.Read(**ref, out);
  EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss) << s;
  EXPECT_THAT(s.message(), HasSubstr("header checksum mismatch"));
  FlipByte(path_, (*ref)->offset() + 1);  // the magic
  s = store.Read(**ref, out);
  EXPECT_THAT(s.message(), HasSubstr("bad header magic"));
  EXPECT_EQ(store.GetStats().checksum_failures, 2u);
}

TEST_P(SsdStoreTest, WellFormedHeaderOfAnotherBlockIsDataLoss) {
  SsdStore& store = Open(1 * kMiB, 256 * kKiB, /*epoch=*/3);
  auto ref = WriteBlock(store, 7, 5000);
  ASSERT_TRUE(ref.ok());
  const SsdExtent& e = **ref;
  ssd_internal::ExtentHeader header{.key = e.key(),
                                    .payload_bytes = e.size(),
                                    .sequence = e.sequence(),
                                    .epoch = 2,  // an older incarnation of the store
                                    .payload_checksum = e.checksum(),
                                    .footprint = e.footprint()};
  std::vector<std::byte> bytes(64);
  ssd_internal::EncodeHeader(header, bytes);
  Corrupt(path_, e.offset(), bytes);
  std::vector<std::byte> out(5000);
  absl::Status s = store.Read(e, out);
  EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(s.message(), HasSubstr("epoch is 2, expected 3"));
  header.epoch = 3;
  header.sequence = e.sequence() + 1;  // a later write to the same slot
  ssd_internal::EncodeHeader(header, bytes);
  Corrupt(path_, e.offset(), bytes);
  s = store.Read(e, out);
  EXPECT_THAT(s.message(), HasSubstr("sequence"));
  header.sequence = e.sequence();
  ssd_internal::EncodeHeader(header, bytes);
  Corrupt(path_, e.offset(), bytes);
  EXPECT_TRUE(store.Read(e, out).ok());
}

TEST_P(SsdStoreTest, ShortReadIsDataLoss) {
  SsdStore& store = Open(1 * kMiB, 256 * kKiB);
  std::vector<SsdRef> refs;
  for (uint64_t key = 1; key <= 4; ++key) refs.push_back(*WriteBlock(store, key, 200 * kKiB));
  // Cut the file inside the last block.
  ASSERT_EQ(truncate(path_.c_str(), refs[3]->offset() + 4096), 0);
  std::vector<std::byte> out(200 * kKiB);
  const absl::Status s = store.Read(*refs[3], out);
  EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss) << s;
  EXPECT_THAT(s.message(), HasSubstr("short"));
  EXPECT_TRUE(ReadAndCheck(store, *refs[0]).ok());
}

TEST_P(SsdStoreTest, ReadBatchReportsEachRequest) {
  SsdStore& store = Open(64 * kMiB, 1 * kMiB);  // ~30 classes, a region each
  std::vector<SsdRef> refs;
  for (uint64_t key = 0; key < 100; ++key) {
    auto ref = WriteBlock(store, key, 1 + key * 997);
    ASSERT_TRUE(ref.ok()) << ref.status();
    refs.push_back(*std::move(ref));
  }
  FlipByte(path_, refs[10]->offset() + 64);      // payload
  FlipByte(path_, refs[50]->offset() + 60);      // header checksum
  FlipByte(path_, refs[99]->offset() + 64 + 5);  // payload
  std::vector<std::vector<std::byte>> outs(refs.size());
  std::vector<absl::Status> statuses(refs.size());
  std::vector<SsdReadRequest> requests;
  for (size_t i = 0; i < refs.size(); ++i) {
    outs[i].resize(i == 20 ? refs[i]->size() + 1 : refs[i]->size());
    requests.push_back({refs[i].get(), outs[i], &statuses[i]});
  }
  store.ReadBatch(requests);
  for (size_t i = 0; i < refs.size(); ++i) {
    if (i == 10 || i == 50 || i == 99) {
      EXPECT_EQ(statuses[i].code(), absl::StatusCode::kDataLoss) << i;
    } else if (i == 20) {
      EXPECT_EQ(statuses[i].code(), absl::StatusCode::kInvalidArgument) << i;
    } else {
      ASSERT_TRUE(statuses[i].ok()) << i << ": " << statuses[i];
      EXPECT_EQ(outs[i], Pattern(i, refs[i]->size())) << i;
    }
  }
  const SsdStoreStats stats = store.GetStats();
  EXPECT_EQ(stats.checksum_failures, 3u);
  EXPECT_EQ(stats.reads, 96u);
}

// What a checkpoint records of an extent.
SsdReattachRequest RequestFor(const SsdExtent& e) {
  return {.key = e.key(),
          .size = e.size(),
          .checksum = e.checksum(),
          .offset = e.offset(),
          .footprint = e.footprint(),
          .sequence = e.sequence(),
          .epoch = e.epoch()};
}

// Writes a well-formed header saying what `r` says at r.offset (a header
// with no payload behind it: enough for ReattachBatch).
void WriteHeader(const std::string& path, const SsdReattachRequest& r) {
  std::vector<std::byte> bytes(64);
  ssd_internal::EncodeHeader({.key = r.key,
                              .payload_bytes = r.size,
                              .sequence = r.sequence,
                              .epoch = r.epoch,
                              .payload_checksum = r.checksum,
                              .footprint = r.footprint},
                             bytes);
  Corrupt(path, r.offset, bytes);
}

TEST_P(SsdStoreTest, ReattachesEveryBlockAfterARestart) {
  std::vector<SsdReattachRequest> saved;
  uint64_t footprints = 0;
  uint64_t sizes = 0;
  {
    SsdStore& first = Open(64 * kMiB, 1 * kMiB, /*epoch=*/1);
    std::vector<SsdRef> refs;
    for (uint64_t key = 1; key <= 150; ++key) {  // more than one io_uring batch
      auto ref = WriteBlock(first, key * 11, 1 + key * 1237 % (200 * kKiB));
      ASSERT_TRUE(ref.ok()) << ref.status();
      EXPECT_EQ((*ref)->epoch(), 1u);
      saved.push_back(RequestFor(**ref));
      footprints += (*ref)->footprint();
      sizes += (*ref)->size();
      refs.push_back(*std::move(ref));
    }
    ASSERT_TRUE(first.Sync().ok());
  }  // every extent released: only memory changes, the file keeps them
  SsdStore& store = Reopen(64 * kMiB, 1 * kMiB, /*epoch=*/2);
  store.ReattachBatch(std::span<SsdReattachRequest>(saved));
  uint64_t highest = 0;
  for (const SsdReattachRequest& r : saved) {
    ASSERT_TRUE(r.status.ok()) << r.key << ": " << r.status;
    ASSERT_NE(r.extent, nullptr);
    EXPECT_EQ(r.extent->epoch(), 1u);  // its writer's, not the store's
    EXPECT_EQ(r.extent->sequence(), r.sequence);
    EXPECT_EQ(r.extent->offset(), r.offset);
    EXPECT_EQ(r.extent->footprint(), r.footprint);
    EXPECT_TRUE(ReadAndCheck(store, *r.extent).ok()) << r.key;
    highest = std::max(highest, r.sequence);
  }
  SsdStoreStats stats = store.GetStats();
  EXPECT_EQ(stats.live_extents, saved.size());
  EXPECT_EQ(stats.reattached, saved.size());
  EXPECT_EQ(stats.reattach_failures, 0u);
  EXPECT_EQ(stats.allocated_bytes, footprints);
  EXPECT_EQ(stats.payload_bytes, sizes);
  EXPECT_EQ(stats.writes, 0u);
  EXPECT_EQ(stats.reads, saved.size());
  // A write of this process: its own epoch, a sequence above every
  // re-attached one, and a slot of its own.
  auto fresh = WriteBlock(store, 5, 5000);
  ASSERT_TRUE(fresh.ok()) << fresh.status();
  EXPECT_EQ((*fresh)->epoch(), 2u);
  EXPECT_EQ((*fresh)->sequence(), highest + 1);
  EXPECT_TRUE(ReadAndCheck(store, **fresh).ok());
  for (const SsdReattachRequest& r : saved) {
    EXPECT_NE(r.extent->offset(), (*fresh)->offset());
  }
  fresh->reset();
  for (SsdReattachRequest& r : saved) r.extent.reset();
  stats = store.GetStats();
  EXPECT_EQ(stats.live_extents, 0u);
  EXPECT_EQ(stats.allocated_bytes, 0u);
  EXPECT_EQ(stats.reserved_bytes, 0u);
}

TEST_P(SsdStoreTest, ReattachAnswersDataLossForEachHeaderThatDoesNotMatch) {
  std::vector<SsdReattachRequest> saved;
  {
    SsdStore& first = Open(16 * kMiB, 1 * kMiB, /*epoch=*/1);
    std::vector<SsdRef> refs;
    for (uint64_t key = 0; key < 8; ++key) {
      auto ref = WriteBlock(first, key, 10000);
      ASSERT_TRUE(ref.ok());
      saved.push_back(RequestFor(**ref));
      refs.push_back(*std::move(ref));
    }
  }
  std::vector<std::byte> garbage(4096, std::byte{0xa5});
  Corrupt(path_, saved[0].offset, garbage);  // overwritten
  std::vector<SsdReattachRequest> requests = saved;
  requests[1].sequence += 1;
  requests[2].epoch = 2;
  requests[3].key += 100;
  requests[4].size -= 1;  // the same class
  requests[5].checksum ^= 1;
  requests[6].offset = 8 * kMiB;  // a slot never written (the file is zeroes there)
  SsdStore& store = Reopen(16 * kMiB, 1 * kMiB, /*epoch=*/2);
  store.ReattachBatch(std::span<SsdReattachRequest>(requests));
  const char* const expected[] = {
      "bad header magic",       "header sequence is",         "header epoch is 1", "header key is",
      "header payload size is", "header payload checksum is", "bad header magic"};
  for (int i = 0; i < 7; ++i) {
    EXPECT_EQ(requests[i].status.code(), absl::StatusCode::kDataLoss) << i << requests[i].status;
    EXPECT_THAT(requests[i].status.message(), HasSubstr(expected[i])) << i;
    EXPECT_EQ(requests[i].extent, nullptr) << i;
  }
  ASSERT_TRUE(requests[7].status.ok()) << requests[7].status;
  EXPECT_TRUE(ReadAndCheck(store, *requests[7].extent).ok());
  SsdStoreStats stats = store.GetStats();
  EXPECT_EQ(stats.live_extents, 1u);
  EXPECT_EQ(stats.reattach_failures, 7u);
  EXPECT_EQ(stats.checksum_failures, 0u);     // no read failed
  EXPECT_EQ(stats.reserved_bytes, 1 * kMiB);  // the never-written slot took no region
  // A refused request claimed nothing: the right ones attach in a later batch.
  std::vector<SsdReattachRequest> again(saved.begin(), saved.begin() + 6);
  store.ReattachBatch(std::span<SsdReattachRequest>(again));
  EXPECT_EQ(again[0].status.code(), absl::StatusCode::kDataLoss);
  for (int i = 1; i < 6; ++i) {
    ASSERT_TRUE(again[i].status.ok()) << i << ": " << again[i].status;
    EXPECT_TRUE(ReadAndCheck(store, *again[i].extent).ok()) << i;
  }
  EXPECT_EQ(store.GetStats().live_extents, 6u);
}

TEST_P(SsdStoreTest, ReattachRefusesConflictingAndMisplacedSlots) {
  std::vector<SsdReattachRequest> saved;
  {
    SsdStore& first = Open(256 * kKiB, 64 * kKiB, /*epoch=*/1);
    std::vector<SsdRef> refs;
    for (uint64_t key = 1; key <= 2; ++key) {  // 12 KiB slots at 0 and 12 KiB
      auto ref = WriteBlock(first, key, 8 * kKiB);
      ASSERT_TRUE(ref.ok());
      saved.push_back(RequestFor(**ref));
      refs.push_back(*std::move(ref));
    }
  }
  ASSERT_EQ(saved[1].offset, 12 * kKiB);
  // Well-formed headers of 8 KiB-class extents (payload of 5000 bytes): one
  // overlapping the second 12 KiB slot in region 0, one in region 1.
  SsdReattachRequest overlapping{.key = 3,
                                 .size = 5000,
                                 .checksum = 33,
                                 .offset = 16 * kKiB,
                                 .footprint = 8 * kKiB,
                                 .sequence = 7,
                                 .epoch = 1};
  SsdReattachRequest first_in_region1 = overlapping;
  first_in_region1.key = 4;
  first_in_region1.offset = 64 * kKiB;
  // A 12 KiB-class one in region 1, which the one above makes an 8 KiB region.
  SsdReattachRequest second_in_region1 = saved[0];
  second_in_region1.key = 5;
  second_in_region1.offset = 64 * kKiB + 24 * kKiB;
  for (const auto& r : {overlapping, first_in_region1, second_in_region1}) WriteHeader(path_, r);

  SsdStore& store = Reopen(256 * kKiB, 64 * kKiB, /*epoch=*/2);
  std::vector<SsdReattachRequest> requests = {saved[0], saved[0],         overlapping,
                                              saved[1], first_in_region1, second_in_region1};
  // Not slots of this layout.
  SsdReattachRequest past_the_end = saved[0];
  past_the_end.offset = 256 * kKiB;
  SsdReattachRequest off_the_grid = saved[0];
  off_the_grid.offset = 8 * kKiB;
  SsdReattachRequest wrong_class = saved[0];
  wrong_class.footprint = 16 * kKiB;
  requests.insert(requests.end(), {past_the_end, off_the_grid, wrong_class});
  store.ReattachBatch(std::span<SsdReattachRequest>(requests));
  const absl::StatusCode expected[] = {absl::StatusCode::kOk,
                                       absl::StatusCode::kFailedPrecondition,
                                       absl::StatusCode::kFailedPrecondition,
                                       absl::StatusCode::kOk,
                                       absl::StatusCode::kOk,
                                       absl::StatusCode::kFailedPrecondition,
                                       absl::StatusCode::kInvalidArgument,
                                       absl::StatusCode::kInvalidArgument,
                                       absl::StatusCode::kInvalidArgument};
  for (size_t i = 0; i < requests.size(); ++i) {
    EXPECT_EQ(requests[i].status.code(), expected[i]) << i << ": " << requests[i].status;
    EXPECT_EQ(requests[i].extent != nullptr, expected[i] == absl::StatusCode::kOk) << i;
  }
  EXPECT_THAT(requests[1].status.message(), HasSubstr("live already"));
  EXPECT_THAT(requests[2].status.message(), HasSubstr("serves another size class"));
  EXPECT_THAT(requests[5].status.message(), HasSubstr("serves another size class"));
  const SsdStoreStats stats = store.GetStats();
  EXPECT_EQ(stats.live_extents, 3u);
  EXPECT_EQ(stats.reattach_failures, 6u);
  EXPECT_TRUE(ReadAndCheck(store, *requests[0].extent).ok());
  // The overlapping header was written over the second extent's payload:
  // its header still attaches, and its payload fails on read, as the payload
  // of a re-attached extent is verified on every read. A header with no
  // payload behind it attaches and never reads as OK either.
  std::vector<std::byte> out(8 * kKiB);
  absl::Status read = store.Read(*requests[3].extent, out);
  EXPECT_EQ(read.code(), absl::StatusCode::kDataLoss) << read;
  EXPECT_THAT(read.message(), HasSubstr("payload checksum mismatch"));
  out.resize(5000);
  EXPECT_EQ(store.Read(*requests[4].extent, out).code(), absl::StatusCode::kDataLoss);
}

TEST_P(SsdStoreTest, ReattachAfterAWriteIsFailedPrecondition) {
  std::vector<SsdReattachRequest> saved;
  {
    SsdStore& first = Open(1 * kMiB, 256 * kKiB, /*epoch=*/1);
    auto ref = WriteBlock(first, 1, 3000);
    ASSERT_TRUE(ref.ok());
    saved.push_back(RequestFor(**ref));
  }
  SsdStore& store = Reopen(1 * kMiB, 256 * kKiB, /*epoch=*/2);
  auto ref = WriteBlock(store, 2, 100 * kKiB);  // another class: does not touch the old slot
  ASSERT_TRUE(ref.ok());
  store.ReattachBatch(std::span<SsdReattachRequest>(saved));
  EXPECT_EQ(saved[0].status.code(), absl::StatusCode::kFailedPrecondition) << saved[0].status;
  EXPECT_THAT(saved[0].status.message(), HasSubstr("first Write"));
  EXPECT_EQ(saved[0].extent, nullptr);
  EXPECT_EQ(store.GetStats().live_extents, 1u);
}

TEST_P(SsdStoreTest, NewWritesNeverOverlapReattachedExtents) {
  std::vector<SsdReattachRequest> saved;
  std::mt19937_64 rng(7);
  {
    SsdStore& first = Open(8 * kMiB, 256 * kKiB, /*epoch=*/1);
    std::vector<SsdRef> refs;
    for (uint64_t key = 1; key <= 400; ++key) {
      auto ref = WriteBlock(first, key, 1 + rng() % (40 * kKiB));
      if (!ref.ok()) continue;                               // a class without a region
      if (key % 3 == 0) saved.push_back(RequestFor(**ref));  // what a checkpoint kept
      refs.push_back(*std::move(ref));
    }
  }
  ASSERT_GT(saved.size(), 50u);
  SsdStore& store = Reopen(8 * kMiB, 256 * kKiB, /*epoch=*/2);
  store.ReattachBatch(std::span<SsdReattachRequest>(saved));
  struct Range {
    uint64_t begin, end;
    bool reattached;
  };
  std::vector<Range> ranges;
  for (const SsdReattachRequest& r : saved) {
    ASSERT_TRUE(r.status.ok()) << r.status;
    ranges.push_back({r.offset, r.offset + r.footprint, true});
  }
  std::vector<SsdRef> fresh;
  for (uint64_t key = 10000; key < 11500; ++key) {
    auto ref = WriteBlock(store, key, 1 + rng() % (40 * kKiB));
    if (!ref.ok()) {
      ASSERT_EQ(ref.status().code(), absl::StatusCode::kResourceExhausted) << ref.status();
      continue;
    }
    ranges.push_back({(*ref)->offset(), (*ref)->offset() + (*ref)->footprint(), false});
    fresh.push_back(*std::move(ref));
  }
  EXPECT_GT(fresh.size(), 100u);
  std::sort(ranges.begin(), ranges.end(),
            [](const Range& a, const Range& b) { return a.begin < b.begin; });
  for (size_t i = 1; i < ranges.size(); ++i) {
    EXPECT_LE(ranges[i - 1].end, ranges[i].begin)
        << "[" << ranges[i - 1].begin << ", " << ranges[i - 1].end
        << ") reattached=" << ranges[i - 1].reattached << " overlaps [" << ranges[i].begin << ", "
        << ranges[i].end << ") reattached=" << ranges[i].reattached;
  }
  for (const SsdReattachRequest& r : saved) {
    EXPECT_TRUE(ReadAndCheck(store, *r.extent).ok()) << r.key;
  }
  for (const SsdRef& ref : fresh) {
    EXPECT_TRUE(ReadAndCheck(store, *ref).ok()) << ref->key();
  }
  EXPECT_EQ(store.GetStats().live_extents, saved.size() + fresh.size());
}

TEST_P(SsdStoreTest, RetentionKeepsFreedSlotsUntilReleased) {
  SsdStore& store = Open(256 * kKiB, 64 * kKiB);
  std::vector<SsdRef> refs = Fill(store, 1);  // 20 slots of 12 KiB, all live
  ASSERT_EQ(refs.size(), 20u);
  store.SetRetention(true);
  const uint64_t before_any = store.CheckpointStarted();
  const uint64_t a = refs[3]->offset();
  refs[3].reset();  // free number before_any + 1
  SsdStoreStats stats = store.GetStats();
  EXPECT_EQ(stats.retained_bytes, 12 * kKiB);
  EXPECT_EQ(stats.retained_extents, 1u);
  EXPECT_EQ(stats.live_extents, 19u);
  EXPECT_EQ(stats.allocated_bytes, 19 * 12 * kKiB);
  auto refused = WriteBlock(store, 100, 8 * kKiB);
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(refused.status().message(), HasSubstr("retained"));
  store.CheckpointCommitted(before_any);  // a mark taken before the free keeps it
  EXPECT_EQ(store.GetStats().retained_extents, 1u);
  EXPECT_EQ(WriteBlock(store, 101, 8 * kKiB).status().code(), absl::StatusCode::kResourceExhausted);

  const uint64_t after_a = store.CheckpointStarted();
  EXPECT_EQ(after_a, before_any + 1);
  const uint64_t b = refs[11]->offset();
  refs[11].reset();
  store.CheckpointCommitted(after_a);  // frees a, keeps b
  stats = store.GetStats();
  EXPECT_EQ(stats.retained_extents, 1u);
  EXPECT_EQ(stats.retained_bytes, 12 * kKiB);
  auto reuse_a = WriteBlock(store, 102, 8 * kKiB);
  ASSERT_TRUE(reuse_a.ok()) << reuse_a.status();
  EXPECT_EQ((*reuse_a)->offset(), a);
  EXPECT_EQ(WriteBlock(store, 103, 8 * kKiB).status().code(), absl::StatusCode::kResourceExhausted);
  store.CheckpointCommitted(store.CheckpointStarted());
  EXPECT_EQ(store.GetStats().retained_bytes, 0u);
  auto reuse_b = WriteBlock(store, 104, 8 * kKiB);
  ASSERT_TRUE(reuse_b.ok()) << reuse_b.status();
  EXPECT_EQ((*reuse_b)->offset(), b);

  // Off again: a release frees at once; nothing retained before stays.
  store.SetRetention(false);
  const uint64_t c = refs[0]->offset();
  refs[0].reset();
  EXPECT_EQ(store.GetStats().retained_bytes, 0u);
  auto reuse_c = WriteBlock(store, 105, 8 * kKiB);
  ASSERT_TRUE(reuse_c.ok()) << reuse_c.status();
  EXPECT_EQ((*reuse_c)->offset(), c);
  for (const SsdRef& ref : refs) {
    if (ref != nullptr) {
      EXPECT_TRUE(ReadAndCheck(store, *ref).ok());
    }
  }
}

TEST_P(SsdStoreTest, RetainedRegionsReturnWhenReleased) {
  SsdStore& store = Open(256 * kKiB, 64 * kKiB);
  store.SetRetention(true);
  std::vector<SsdRef> refs = Fill(store, 1);
  store.CheckpointStarted();  // it may capture any of them
  refs.clear();
  SsdStoreStats stats = store.GetStats();
  EXPECT_EQ(stats.live_extents, 0u);
  EXPECT_EQ(stats.retained_extents, 20u);
  EXPECT_EQ(stats.reserved_bytes, 256 * kKiB);
  store.CheckpointCommitted(store.CheckpointStarted());
  stats = store.GetStats();
  EXPECT_EQ(stats.retained_extents, 0u);
  EXPECT_EQ(stats.reserved_bytes, 0u);
  EXPECT_TRUE(store.Sync().ok());
}

// Only what a checkpoint may list is retained: a copy written after the last
// commit and freed while no checkpoint is being taken is in none, and its
// slot is free at once.
TEST_P(SsdStoreTest, RetainsOnlyWhatACheckpointMayList) {
  SsdStore& store = Open(256 * kKiB, 64 * kKiB);
  store.SetRetention(true);
  std::vector<SsdRef> refs;
  for (uint64_t key = 1; key <= 10; ++key) {
    auto ref = WriteBlock(store, key, 8 * kKiB);
    ASSERT_TRUE(ref.ok()) << ref.status();
    refs.push_back(*std::move(ref));
  }
  // No checkpoint yet: nothing lists them.
  refs[0].reset();
  EXPECT_EQ(store.GetStats().retained_extents, 0u);
  // Freed while a checkpoint is being taken: it may have captured it.
  const uint64_t mark = store.CheckpointStarted();
  refs[1].reset();
  EXPECT_EQ(store.GetStats().retained_extents, 1u);
  store.CheckpointCommitted(mark);  // freed after the mark: still retained
  EXPECT_EQ(store.GetStats().retained_extents, 1u);
  // Written before the commit: the committed checkpoint may list it.
  refs[2].reset();
  EXPECT_EQ(store.GetStats().retained_extents, 2u);
  // Written after it: in no checkpoint.
  auto later = WriteBlock(store, 50, 8 * kKiB);
  ASSERT_TRUE(later.ok()) << later.status();
  later->reset();
  SsdStoreStats stats = store.GetStats();
  EXPECT_EQ(stats.retained_extents, 2u);
  EXPECT_EQ(stats.retained_bytes, 2 * 12 * kKiB);
  EXPECT_EQ(stats.live_extents, 7u);
}

// Past the retention budget a write that finds no free slot reuses the
// oldest retained slots, and counts them; within it, it is refused.
TEST_P(SsdStoreTest, WritesReuseTheOldestRetainedSlotsPastTheBudget) {
  SsdStore& store = Open(256 * kKiB, 64 * kKiB);
  std::vector<SsdRef> refs = Fill(store, 1);  // 20 slots of 12 KiB, all live
  ASSERT_EQ(refs.size(), 20u);
  store.SetRetention(true);
  store.SetRetentionBudget(2 * 12 * kKiB);
  store.CheckpointCommitted(store.CheckpointStarted());  // lists all 20
  std::vector<uint64_t> freed;
  for (int i : {7, 2, 15, 4, 9}) {
    freed.push_back(refs[i]->offset());
    refs[i].reset();
  }
  ASSERT_EQ(store.GetStats().retained_extents, 5u);
  for (int w = 0; w < 3; ++w) {
    auto ref = WriteBlock(store, 100 + w, 8 * kKiB);
    ASSERT_TRUE(ref.ok()) << "write " << w << ": " << ref.status();
    EXPECT_EQ((*ref)->offset(), freed[w]) << "write " << w << " took another slot";
    EXPECT_TRUE(ReadAndCheck(store, **ref).ok());
    refs.push_back(*std::move(ref));
  }
  SsdStoreStats stats = store.GetStats();
  EXPECT_EQ(stats.retained_reused, 3u);
  EXPECT_EQ(stats.retained_extents, 2u);
  EXPECT_EQ(stats.retained_bytes, 2 * 12 * kKiB);
  auto refused = WriteBlock(store, 200, 8 * kKiB);
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(store.GetStats().retained_reused, 3u);
  // A budget of zero: every retained slot may be reused.
  store.SetRetentionBudget(0);
  for (int w = 0; w < 2; ++w) {
    auto ref = WriteBlock(store, 300 + w, 8 * kKiB);
    ASSERT_TRUE(ref.ok()) << ref.status();
    EXPECT_EQ((*ref)->offset(), freed[3 + w]);
    refs.push_back(*std::move(ref));
  }
  EXPECT_EQ(store.GetStats().retained_bytes, 0u);
  EXPECT_EQ(WriteBlock(store, 400, 8 * kKiB).status().code(), absl::StatusCode::kResourceExhausted);
}

// A failed checkpoint frees what was retained only for it (copies written
// since the last commit) and keeps what the committed one lists.
TEST_P(SsdStoreTest, AFailedCheckpointFreesWhatOnlyItRetained) {
  SsdStore& store = Open(256 * kKiB, 64 * kKiB);
  store.SetRetention(true);
  std::vector<SsdRef> refs;
  for (uint64_t key = 1; key <= 15; ++key) {
    if (key == 11) store.CheckpointCommitted(store.CheckpointStarted());  // lists 1..10
    auto ref = WriteBlock(store, key, 8 * kKiB);
    ASSERT_TRUE(ref.ok()) << ref.status();
    refs.push_back(*std::move(ref));
  }
  store.CheckpointStarted();
  for (int i : {0, 1, 10, 11, 12}) refs[i].reset();  // two listed, three not
  ASSERT_EQ(store.GetStats().retained_extents, 5u);
  store.CheckpointFailed();
  SsdStoreStats stats = store.GetStats();
  EXPECT_EQ(stats.retained_extents, 2u);
  EXPECT_EQ(stats.retained_bytes, 2 * 12 * kKiB);
  // No checkpoint runs any more: a copy written since the commit is freed
  // at once, one the committed checkpoint lists is retained.
  refs[13].reset();
  refs[2].reset();
  EXPECT_EQ(store.GetStats().retained_extents, 3u);
  // The freed slots serve writes; the retained ones do not (no budget set).
  std::vector<SsdRef> more = Fill(store, 100);
  EXPECT_EQ(more.size(), 20u - 8 - 3);  // 8 live, 3 retained
}

INSTANTIATE_TEST_SUITE_P(Engines, SsdStoreTest,
                         ::testing::Values(SsdIoEngine::kIoUring, SsdIoEngine::kThreadPool),
                         [](const auto& info) {
                           return info.param == SsdIoEngine::kIoUring ? "IoUring" : "ThreadPool";
                         });

TEST(SsdStoreOptionsTest, ValidateNamesTheField) {
  SsdStoreOptions ok;
  ok.path = "/tmp/x";
  EXPECT_TRUE(ok.Validate().ok());
  auto expect_bad = [&](auto mutate, std::string_view field) {
    SsdStoreOptions options = ok;
    mutate(options);
    const absl::Status s = options.Validate();
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << field;
    EXPECT_THAT(s.message(), HasSubstr(field));
  };
  expect_bad([](SsdStoreOptions& o) { o.path = ""; }, "ssd_store.path");
  expect_bad([](SsdStoreOptions& o) { o.region_bytes = 3 << 20; }, "ssd_store.region_bytes");
  expect_bad([](SsdStoreOptions& o) { o.region_bytes = 32 << 10; }, "ssd_store.region_bytes");
  expect_bad([](SsdStoreOptions& o) { o.region_bytes = uint64_t{2} << 30; },
             "ssd_store.region_bytes");
  expect_bad([](SsdStoreOptions& o) { o.capacity_bytes = 8 << 20; }, "ssd_store.capacity_bytes");
  expect_bad([](SsdStoreOptions& o) { o.io_threads = 0; }, "ssd_store.io_threads");
  expect_bad([](SsdStoreOptions& o) { o.queue_depth = 0; }, "ssd_store.queue_depth");
  expect_bad([](SsdStoreOptions& o) { o.queue_depth = 5000; }, "ssd_store.queue_depth");
  SsdStoreOptions bad = ok;
  bad.io_threads = 0;
  EXPECT_EQ(SsdStore::Open(bad).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(SsdStoreOpenTest, UnopenablePathIsUnavailable) {
  SsdStoreOptions options;
  options.path = TestDir() + "/no/such/dir/store.bin";
  options.capacity_bytes = 1 * kMiB;
  options.region_bytes = 1 * kMiB;
  auto store = SsdStore::Open(options);
  EXPECT_EQ(store.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(store.status().message(), HasSubstr("No such file or directory"));
}

// A file system that refuses O_DIRECT at open, the way some do (EINVAL).
int OpenRefusingDirect(const char* path, int flags, mode_t mode) {
  if (flags & O_DIRECT) {
    errno = EINVAL;
    return -1;
  }
  return ::open(path, flags, mode);
}

int IoUringMissing(unsigned) { return -ENOSYS; }

class SsdStoreFallbackTest : public ::testing::Test {
 protected:
  void TearDown() override { std::filesystem::remove(path_); }
  std::string path_ = UniquePath(TestDir());
};

TEST_F(SsdStoreFallbackTest, BufferedIoWhenODirectIsRefused) {
  SsdStoreOptions options;
  options.path = path_;
  options.capacity_bytes = 1 * kMiB;
  options.region_bytes = 256 * kKiB;
  ssd_internal::SsdSyscalls syscalls = ssd_internal::RealSyscalls();
  syscalls.open = &OpenRefusingDirect;
  auto store = ssd_internal::OpenSsdStore(options, syscalls);
  ASSERT_TRUE(store.ok()) << store.status();
  EXPECT_FALSE((*store)->GetStats().direct_io);
  auto ref = WriteBlock(**store, 1, 12345);
  ASSERT_TRUE(ref.ok());
  EXPECT_TRUE(ReadAndCheck(**store, **ref).ok());
}

TEST_F(SsdStoreFallbackTest, ThreadPoolWhenIoUringIsUnavailable) {
  SsdStoreOptions options;
  options.path = path_;
  options.capacity_bytes = 1 * kMiB;
  options.region_bytes = 256 * kKiB;
  ssd_internal::SsdSyscalls syscalls = ssd_internal::RealSyscalls();
  syscalls.probe_io_uring = &IoUringMissing;
  auto store = ssd_internal::OpenSsdStore(options, syscalls);
  ASSERT_TRUE(store.ok()) << store.status();
  EXPECT_THAT((*store)->GetStats().engine, StartsWith("thread_pool (io_uring unavailable: "));
  auto ref = WriteBlock(**store, 1, 12345);
  ASSERT_TRUE(ref.ok());
  EXPECT_TRUE(ReadAndCheck(**store, **ref).ok());
}

TEST(SsdStoreTmpfsTest, WorksOnDevShm) {
  if (!std::filesystem::is_directory("/dev/shm")) GTEST_SKIP() << "no /dev/shm";
  const std::string path = UniquePath("/dev/shm");
  SsdStoreOptions options;
  options.path = path;
  options.capacity_bytes = 1 * kMiB;
  options.region_bytes = 256 * kKiB;
  auto store = SsdStore::Open(options);
  ASSERT_TRUE(store.ok()) << store.status();
  // Kernels before 6.6 refuse O_DIRECT on tmpfs (buffered fallback); later
  // ones accept it. Either way the store works.
  std::fprintf(stderr, "note: /dev/shm direct_io=%d\n", (*store)->GetStats().direct_io);
  auto ref = WriteBlock(**store, 1, 3000);
  ASSERT_TRUE(ref.ok());
  EXPECT_TRUE(ReadAndCheck(**store, **ref).ok());
  ref->reset();
  store->reset();
  std::filesystem::remove(path);
}

TEST(SsdLayoutTest, SizeClassesKeepPowerOfTwoBlocksTight) {
  const std::vector<uint64_t> classes = ssd_internal::MakeSizeClasses(64 * kMiB);
  auto footprint = [&](uint64_t payload) {
    return classes[*ssd_internal::ClassFor(classes, 64 + payload)];
  };
  EXPECT_EQ(footprint(1), 4 * kKiB);
  EXPECT_EQ(footprint(4032), 4 * kKiB);
  EXPECT_EQ(footprint(4033), 8 * kKiB);
  EXPECT_EQ(footprint(256 * kKiB), 260 * kKiB);
  EXPECT_EQ(footprint(4 * kMiB), 4 * kMiB + 4 * kKiB);
  EXPECT_EQ(footprint(64 * kMiB - 64), 64 * kMiB);
  EXPECT_FALSE(ssd_internal::ClassFor(classes, 64 * kMiB + 1).has_value());
  for (uint64_t payload = 1; payload < 64 * kMiB; payload = payload * 9 / 8 + 1) {
    const uint64_t page_rounded = ssd_internal::RoundUpToPage(64 + payload);
    EXPECT_LE(footprint(payload), page_rounded * 5 / 4 + 4 * kKiB) << payload;
    EXPECT_EQ(footprint(payload) % 4096, 0u);
  }
}

TEST(SsdLayoutTest, AllocatesLowestOffsetFirst) {
  ssd_internal::SsdSlots slots(64 * kKiB, 2);
  const int c = *ssd_internal::ClassFor(slots.classes(), 8 * kKiB);  // 8 KiB slots
  EXPECT_EQ(slots.classes()[c], 8 * kKiB);
  EXPECT_EQ(*slots.Allocate(c), 0u);
  EXPECT_EQ(*slots.Allocate(c), 8 * kKiB);
  EXPECT_EQ(*slots.Allocate(c), 16 * kKiB);
  EXPECT_TRUE(slots.Free(8 * kKiB));
  EXPECT_FALSE(slots.Free(8 * kKiB));
  EXPECT_FALSE(slots.Free(4 * kKiB));
  EXPECT_EQ(*slots.Allocate(c), 8 * kKiB);
  const int big = *ssd_internal::ClassFor(slots.classes(), 64 * kKiB);
  EXPECT_EQ(*slots.Allocate(big), 64 * kKiB);  // the next free region
  EXPECT_FALSE(slots.Allocate(big).has_value());
  EXPECT_EQ(slots.reserved_regions(), 2u);
  EXPECT_TRUE(slots.Free(64 * kKiB));
  EXPECT_EQ(slots.reserved_regions(), 1u);
}

TEST(SsdLayoutTest, ClaimTakesTheSlotAndGivesAFreeRegionItsClass) {
  using Result = ssd_internal::SsdSlots::ClaimResult;
  ssd_internal::SsdSlots slots(64 * kKiB, 3);
  const int c8 = *ssd_internal::ClassFor(slots.classes(), 8 * kKiB);
  const int c12 = *ssd_internal::ClassFor(slots.classes(), 12 * kKiB);
  EXPECT_EQ(slots.Claim(64 * kKiB + 8 * kKiB, c8), Result::kClaimed);  // region 1 serves 8 KiB
  EXPECT_EQ(slots.Claim(64 * kKiB + 8 * kKiB, c8), Result::kTaken);
  EXPECT_EQ(slots.Claim(64 * kKiB + 24 * kKiB, c12), Result::kOtherClass);
  EXPECT_EQ(slots.Claim(12 * kKiB + 4 * kKiB, c12), Result::kNotASlot);  // off the grid
  EXPECT_EQ(slots.Claim(60 * kKiB, c12), Result::kNotASlot);             // the slack of region 0
  EXPECT_EQ(slots.Claim(192 * kKiB, c8), Result::kNotASlot);             // past the last region
  EXPECT_EQ(slots.reserved_regions(), 1u);
  // Allocation fills around claimed slots, in their region first.
  EXPECT_EQ(*slots.Allocate(c8), 64 * kKiB);
  EXPECT_EQ(*slots.Allocate(c8), 64 * kKiB + 16 * kKiB);
  EXPECT_EQ(*slots.Allocate(c12), 0u);  // region 0, the lowest free one
  EXPECT_TRUE(slots.Free(64 * kKiB + 8 * kKiB));
  EXPECT_FALSE(slots.Free(64 * kKiB + 8 * kKiB));
}

}  // namespace
}  // namespace kvcache
