// ShmSession's requests that wait: neither a data-path slot nor a read from a
// level below host memory is waited for on the thread that handed the
// request over; the answer comes from the thread that finishes it.
#include <gmock/gmock.h>

#include <chrono>
#include <cstring>
#include <future>
#include <thread>

#include "server/core/cache_test_util.h"
#include "server/core/memory_tier.h"
#include "server/shm/shm_session_test_util.h"

namespace kvcache {
namespace {

using namespace cache_test;  // NOLINT: the cache tests' models and patterns

// An answer, and the thread that gave it.
struct Answered {
  v1::ShmResponse response;
  std::thread::id thread;
};

class ShmSessionWaitTest : public CacheTest {
 protected:
  // A cache over a lower level (host memory for the SSD) whose migrator
  // demotes every block it can, and a session admitted by `fair_`.
  void SetUp() override {
    CacheOptions options;
    options.tiers.host_high_watermark = 0.001;
    options.tiers.host_low_watermark = 0.001;
    options.tiers.fetch_read_threads = 1;
    auto pool = SlabPool::Create({.capacity_bytes = 4 * kSlab, .slab_bytes = kSlab});
    ASSERT_TRUE(pool.ok()) << pool.status();
    cache_ = std::make_unique<Cache>(options, *std::move(pool), NewLruPolicy(), &clock_,
                                     MemoryTier::Create(64 * kSlab, "ssd"));
    Register(Mid());
    session_ = std::make_unique<ShmSession>(
        ShmLimits{.max_regions = 4, .max_region_bytes = 1 << 24}, cache_.get(), &copier_,
        &observer_, ShmPeer{.peer = "shm:test", .fair = &fair_});
  }

  // `tokens`' blocks appended, then all moved below host memory.
  void CacheBelowHostMemory(const std::vector<Token>& tokens) {
    ASSERT_TRUE(Append(*cache_, Mid(), tokens).ok());
    while (cache_->tiers().NeedsMigration()) cache_->tiers().Migrate();
    auto lookup = cache_->Lookup(Mid().key, tokens);
    ASSERT_TRUE(lookup.ok());
    ASSERT_EQ(lookup->blocks.size(), tokens.size() / kBt);
    for (const BlockInfo& b : lookup->blocks) ASSERT_EQ(b.tier, BlockTier::kLower);
  }

  // Hands over a fetch_into of `tokens` into `region` (attached as `id`);
  // the future gets its answer whichever thread gives it.
  std::future<Answered> StartFetchInto(const std::vector<Token>& tokens, uint64_t id,
                                       uint64_t bytes) {
    v1::ShmRequest request;
    v1::FetchIntoRequest* f = request.mutable_fetch_into();
    f->set_model_id(Mid().key.model_id);
    f->mutable_tokens()->Add(tokens.begin(), tokens.end());
    f->mutable_destination()->set_region_id(id);
    f->mutable_destination()->set_length(bytes);
    auto answer = std::make_shared<std::promise<Answered>>();
    std::future<Answered> future = answer->get_future();
    session_->Handle(std::move(request), {}, [answer](v1::ShmResponse response) {
      answer->set_value({std::move(response), std::this_thread::get_id()});
    });
    return future;
  }

  uint64_t AttachRegion(WorkerRegion& region, uint64_t bytes) {
    v1::ShmRequest request;
    request.mutable_attach_region()->set_bytes(bytes);
    v1::ShmResponse response = Answer(*session_, request, region.Passed());
    EXPECT_EQ(response.code(), 0) << response.message();
    return response.attach_region().region_id();
  }

  // Every block of `tokens` at the start of `region`, byte for byte, with
  // the checksums the answer gives.
  static void ExpectFetched(const v1::FetchIntoResponse& f, WorkerRegion& region,
                            const std::vector<Token>& tokens) {
    const size_t blocks = tokens.size() / kBt;
    ASSERT_EQ(f.blocks_size(), static_cast<int>(blocks));
    EXPECT_EQ(f.matched_tokens(), tokens.size());
    for (size_t b = 0; b < blocks; ++b) {
      const std::vector<std::byte> expected = Pattern(Mid(), tokens, b);
      EXPECT_EQ(std::memcmp(region.data() + b * f.block_bytes(), expected.data(), expected.size()),
                0)
          << "block " << b;
      EXPECT_EQ(f.blocks(static_cast<int>(b)).checksum(), Checksum(expected)) << "block " << b;
    }
  }

  CopyEngine copier_{0, 0};
  NullRpcObserver observer_;
  FairScheduler fair_{{.slots = 1, .threads = 1}};
  std::unique_ptr<ShmSession> session_;
};

const uint64_t kBlock = Mid().layout.BlockBytes();

TEST_F(ShmSessionWaitTest, AFetchOfBlocksBelowHostMemoryIsAnsweredByAFetchReadThread) {
  const std::vector<Token> tokens = Seq({1, 2, 3, 4});
  CacheBelowHostMemory(tokens);
  WorkerRegion region(1 << 20);
  const uint64_t id = AttachRegion(region, 1 << 20);
  std::future<Answered> future = StartFetchInto(tokens, id, 4 * kBlock);
  ASSERT_EQ(future.wait_for(std::chrono::seconds(10)), std::future_status::ready);
  const Answered answered = future.get();
  ASSERT_EQ(answered.response.code(), 0) << answered.response.message();
  EXPECT_NE(answered.thread, std::this_thread::get_id());
  ExpectFetched(answered.response.fetch_into(), region, tokens);
  EXPECT_GE(cache_->GetStats().fetch_reads.issued, 1u);
}

TEST_F(ShmSessionWaitTest, AFetchFromHostMemoryIsAnsweredAtOnce) {
  const std::vector<Token> tokens = Seq({5, 6});
  ASSERT_TRUE(Append(*cache_, Mid(), tokens).ok());
  WorkerRegion region(1 << 20);
  const uint64_t id = AttachRegion(region, 1 << 20);
  std::future<Answered> future = StartFetchInto(tokens, id, 2 * kBlock);
  ASSERT_EQ(future.wait_for(std::chrono::seconds(0)), std::future_status::ready);
  const Answered answered = future.get();
  ASSERT_EQ(answered.response.code(), 0) << answered.response.message();
  EXPECT_EQ(answered.thread, std::this_thread::get_id());
  ExpectFetched(answered.response.fetch_into(), region, tokens);
  EXPECT_EQ(cache_->GetStats().fetch_reads.issued, 0u);
}

TEST_F(ShmSessionWaitTest, ARequestWaitingForADataPathSlotDoesNotHoldTheCallersThread) {
  const std::vector<Token> tokens = Seq({7, 8});
  ASSERT_TRUE(Append(*cache_, Mid(), tokens).ok());
  WorkerRegion region(1 << 20);
  const uint64_t id = AttachRegion(region, 1 << 20);
  // A gRPC stream holds the only data-path slot.
  absl::StatusOr<FairScheduler::Slot> held =
      fair_.Acquire(fair_.Join("other", "grpc#1", DataPathKind::kGrpc));
  ASSERT_TRUE(held.ok()) << held.status();
  std::future<Answered> future = StartFetchInto(tokens, id, 2 * kBlock);
  // Handle returned without an answer: the fetch waits in the scheduler's
  // queue, not on this thread.
  EXPECT_EQ(future.wait_for(std::chrono::milliseconds(50)), std::future_status::timeout);
  EXPECT_EQ(fair_.stats().paths[static_cast<int>(DataPathKind::kSharedMemory)].waiting, 1u);
  // The thread that gives the slot back runs the step it grants (or a
  // kv-fair thread does): the fetch is answered there.
  std::thread::id releaser_id;
  std::thread releaser([&] {
    releaser_id = std::this_thread::get_id();
    held->Release();
  });
  releaser.join();
  ASSERT_EQ(future.wait_for(std::chrono::seconds(10)), std::future_status::ready);
  const Answered answered = future.get();
  ASSERT_EQ(answered.response.code(), 0) << answered.response.message();
  EXPECT_NE(answered.thread, std::this_thread::get_id());
  EXPECT_EQ(answered.thread, releaser_id);
  ExpectFetched(answered.response.fetch_into(), region, tokens);
}

TEST_F(ShmSessionWaitTest, ARequestWaitingWhenTheSchedulerShutsDownIsAnsweredUnavailable) {
  WorkerRegion region(1 << 20);
  const uint64_t id = AttachRegion(region, 1 << 20);
  absl::StatusOr<FairScheduler::Slot> held =
      fair_.Acquire(fair_.Join("other", "grpc#1", DataPathKind::kGrpc));
  ASSERT_TRUE(held.ok()) << held.status();
  std::future<Answered> future = StartFetchInto(Seq({9}), id, kBlock);
  EXPECT_EQ(future.wait_for(std::chrono::milliseconds(20)), std::future_status::timeout);
  fair_.Shutdown();
  ASSERT_EQ(future.wait_for(std::chrono::seconds(10)), std::future_status::ready);
  const v1::ShmResponse response = future.get().response;
  EXPECT_EQ(response.code(), static_cast<int>(absl::StatusCode::kUnavailable));
  EXPECT_THAT(response.message(), ::testing::HasSubstr("request id"));
}

}  // namespace
}  // namespace kvcache
