// The behaviour suite every BlockStore passes (server/core/block_store.h):
// the heap-backed MemoryBlockStore and the SSD tier over a real file.
#include "server/core/block_store.h"

#include <gtest/gtest.h>

#include <atomic>
#include <filesystem>
#include <random>
#include <thread>
#include <vector>

#include "server/core/memory_block_store.h"
#include "server/tier/ssd_block_store.h"

namespace kvcache {
namespace {

constexpr uint64_t kCapacity = uint64_t{8} << 20;

// A sealed heap payload of `size` bytes derived from `seed`.
BlockRef MakePayload(uint64_t size, uint64_t seed, bool compressed = false) {
  BlockRef p = BlockPayload::FromHeap(size);
  std::mt19937_64 rng(seed);
  for (std::byte& b : p->mutable_data()) b = static_cast<std::byte>(rng());
  const uint64_t sum = Checksum(p->data());
  if (compressed) {
    p->Seal(sum, seed, seed + 1);
    p->set_compressed(true);
  } else {
    p->Seal(sum);
  }
  return p;
}

struct MemoryStoreFactory {
  static std::shared_ptr<BlockStore> Make(const std::string&) {
    return MemoryBlockStore::Create(kCapacity);
  }
};

struct SsdStoreFactory {
  static std::shared_ptr<BlockStore> Make(const std::string& path) {
    SsdStoreOptions options{
        .path = path, .capacity_bytes = kCapacity, .region_bytes = uint64_t{1} << 20};
    auto store = OpenSsdBlockStore(options);
    EXPECT_TRUE(store.ok()) << store.status();
    return store.ok() ? *store : nullptr;
  }
};

template <typename Factory>
class BlockStoreTest : public ::testing::Test {
 protected:
  void SetUp() override {
    path_ = ::testing::TempDir() + "/block_store_test_" +
            std::to_string(reinterpret_cast<uintptr_t>(this)) + ".bin";
    std::filesystem::remove(path_);
    store_ = Factory::Make(path_);
    ASSERT_NE(store_, nullptr);
  }
  void TearDown() override {
    store_.reset();
    std::filesystem::remove(path_);
  }

  std::string path_;
  std::shared_ptr<BlockStore> store_;
};

using Factories = ::testing::Types<MemoryStoreFactory, SsdStoreFactory>;
TYPED_TEST_SUITE(BlockStoreTest, Factories);

TYPED_TEST(BlockStoreTest, ACopyReadsBackExactlyWithItsSeal) {
  for (uint64_t size : {uint64_t{1}, uint64_t{4095}, uint64_t{4096}, uint64_t{100} << 10}) {
    const BlockRef p = MakePayload(size, size, /*compressed=*/size == 4096);
    auto copy = this->store_->Write(size * 7, *p);
    ASSERT_TRUE(copy.ok()) << size << ": " << copy.status();
    EXPECT_EQ((*copy)->key(), size * 7);
    EXPECT_EQ((*copy)->seal().size, size);
    EXPECT_EQ((*copy)->seal().checksum, p->checksum());
    EXPECT_EQ((*copy)->seal().raw_checksum, p->raw_checksum());
    EXPECT_EQ((*copy)->seal().compressed, p->compressed());
    EXPECT_GE((*copy)->footprint(), size);
    std::vector<std::byte> out(size);
    ASSERT_TRUE(this->store_->Read(**copy, out).ok());
    EXPECT_TRUE(std::equal(out.begin(), out.end(), p->data().begin())) << size;
  }
}

TYPED_TEST(BlockStoreTest, CopiesCountAgainstCapacityUntilTheLastReferenceDrops) {
  const BlockRef p = MakePayload(64 << 10, 1);
  std::vector<StoredRef> copies;
  while (true) {
    auto copy = this->store_->Write(copies.size(), *p);
    if (!copy.ok()) {
      EXPECT_TRUE(absl::IsResourceExhausted(copy.status())) << copy.status();
      break;
    }
    copies.push_back(*std::move(copy));
    ASSERT_LT(copies.size(), 1000u) << "the store never filled";
  }
  ASSERT_GT(copies.size(), 10u);
  const BlockStoreStats full = this->store_->GetStats();
  EXPECT_EQ(full.live_copies, copies.size());
  EXPECT_LE(full.allocated_bytes, full.capacity_bytes);
  EXPECT_GE(full.failed_writes, 1u);
  // A reader's reference keeps a copy's space; dropping the rest frees room.
  StoredRef kept = copies[3];
  copies.clear();
  EXPECT_EQ(this->store_->GetStats().live_copies, 1u);
  auto again = this->store_->Write(99, *p);
  ASSERT_TRUE(again.ok()) << again.status();
  std::vector<std::byte> out(p->size());
  EXPECT_TRUE(this->store_->Read(*kept, out).ok());
  EXPECT_TRUE(std::equal(out.begin(), out.end(), p->data().begin()));
}

TYPED_TEST(BlockStoreTest, ReadBatchSetsEveryStatus) {
  std::vector<BlockRef> payloads;
  std::vector<StoredRef> copies;
  for (int i = 0; i < 12; ++i) {
    payloads.push_back(MakePayload(8192 + i * 1000, i));
    auto copy = this->store_->Write(i, *payloads.back());
    ASSERT_TRUE(copy.ok());
    copies.push_back(*copy);
  }
  std::vector<std::vector<std::byte>> outs(copies.size());
  std::vector<StoredRead> reads;
  for (size_t i = 0; i < copies.size(); ++i) {
    outs[i].resize(payloads[i]->size());
    reads.push_back({.copy = copies[i].get(), .out = outs[i], .status = absl::UnknownError("")});
  }
  this->store_->ReadBatch(std::span<StoredRead>(reads));
  for (size_t i = 0; i < copies.size(); ++i) {
    EXPECT_TRUE(reads[i].status.ok()) << i << ": " << reads[i].status;
    EXPECT_TRUE(std::equal(outs[i].begin(), outs[i].end(), payloads[i]->data().begin())) << i;
  }
  EXPECT_EQ(this->store_->GetStats().reads, copies.size());
}

TYPED_TEST(BlockStoreTest, ConcurrentWritersAndReadersSeeOnlyTheirBytes) {
  std::atomic<int> bad{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < 8; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < 40; ++i) {
        const BlockRef p = MakePayload(4096 + 977 * ((t + i) % 17), t * 1000 + i);
        auto copy = this->store_->Write(t * 1000 + i, *p);
        if (!copy.ok()) {
          if (!absl::IsResourceExhausted(copy.status())) ++bad;
          continue;
        }
        std::vector<std::byte> out(p->size());
        if (!this->store_->Read(**copy, out).ok() ||
            !std::equal(out.begin(), out.end(), p->data().begin())) {
          ++bad;
        }
      }
    });
  }
  for (std::thread& t : threads) t.join();
  EXPECT_EQ(bad.load(), 0);
  EXPECT_EQ(this->store_->GetStats().live_copies, 0u);
}

// The SSD tier in particular: a byte flipped on disk, in the payload or the
// header, is DATA_LOSS and counted.
class SsdBlockStoreTest : public BlockStoreTest<SsdStoreFactory> {
 protected:
  void FlipByteAt(uint64_t offset) {
    std::FILE* f = std::fopen(path_.c_str(), "r+b");
    ASSERT_NE(f, nullptr);
    ASSERT_EQ(std::fseek(f, static_cast<long>(offset), SEEK_SET), 0);
    const int c = std::fgetc(f);
    ASSERT_NE(c, EOF);
    ASSERT_EQ(std::fseek(f, static_cast<long>(offset), SEEK_SET), 0);
    std::fputc(c ^ 0x40, f);
    std::fclose(f);
  }
};

TEST_F(SsdBlockStoreTest, CorruptionOnDiskIsDataLoss) {
  const BlockRef p = MakePayload(20000, 5);
  auto a = store_->Write(1, *p);
  auto b = store_->Write(2, *p);
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_EQ(SsdStatsOf(*store_).live_extents, 2u);
  std::vector<std::byte> out(p->size());
  ASSERT_TRUE(store_->Read(**a, out).ok());
  // Copy a: its last payload byte (after the 64-byte header). Copy b: a
  // byte of its header.
  FlipByteAt(SsdExtentOf(**a).offset() + 64 + p->size() - 1);
  FlipByteAt(SsdExtentOf(**b).offset() + 8);
  EXPECT_TRUE(absl::IsDataLoss(store_->Read(**a, out)));
  EXPECT_TRUE(absl::IsDataLoss(store_->Read(**b, out)));
  EXPECT_EQ(store_->GetStats().checksum_failures, 2u);
}

}  // namespace
}  // namespace kvcache
