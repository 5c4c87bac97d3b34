// PREFETCH_WAIT lookups and fetches of demoted blocks through a real gRPC
// server in this process, over a lower tier whose reads are held back: the
// waiting calls occupy no gRPC callback thread (other calls keep being
// answered), each lookup is answered once its read-back is done or at its
// timeout, a batch of them waits once, and each fetch streams the exact
// bytes once its reads are in.
#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <atomic>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/time/clock.h"
#include "kvcache/v1/kvcache.grpc.pb.h"
#include "server/core/cache.h"
#include "server/core/eviction_policy.h"
#include "server/core/gated_tier.h"
#include "server/core/memory_tier.h"
#include "server/core/slab_pool.h"
#include "server/rpc/server.h"

namespace kvcache {
namespace {

constexpr uint32_t kBlockTokens = 16;
constexpr uint32_t kHeadDim = 128;
constexpr uint64_t kBlockBytes = 2 * kBlockTokens * kHeadDim * 2;  // 8 KiB, fp16
constexpr uint64_t kSlab = uint64_t{64} << 10;
constexpr uint32_t kSequences = 12;  // 4 blocks each: 48 blocks over a 32-block host tier

class PrefetchWaitServiceTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto pool =
        SlabPool::Create({.capacity_bytes = 4 * kSlab, .slab_bytes = kSlab, .min_class_bytes = 64});
    ASSERT_TRUE(pool.ok()) << pool.status();
    store_ = std::make_shared<GatedTier>(MemoryTier::Create(uint64_t{8} << 20));
    cache_ = std::make_unique<Cache>(CacheOptions{}, *std::move(pool), NewLruPolicy(),
                                     SystemClock::Get(), store_, NewLruPolicy());
    socket_ = ::testing::TempDir() + "/prefetch_wait_test." + std::to_string(::getpid());
    auto server = GrpcServer::Start({.unix_socket = socket_}, cache_.get(), &observer_);
    ASSERT_TRUE(server.ok()) << server.status();
    server_ = *std::move(server);
    stub_ = v1::Cache::NewStub(
        grpc::CreateChannel("unix:" + socket_, grpc::InsecureChannelCredentials()));
    grpc::ClientContext ctx;
    v1::RegisterModelRequest req;
    req.set_model_id("m");
    v1::ModelLayout* l = req.mutable_layout();
    l->set_num_layers(1);
    l->set_num_kv_heads(1);
    l->set_head_dim(kHeadDim);
    l->set_dtype(v1::DTYPE_FP16);
    l->set_block_tokens(kBlockTokens);
    v1::RegisterModelResponse resp;
    ASSERT_TRUE(stub_->RegisterModel(&ctx, req, &resp).ok());
    ASSERT_EQ(resp.block_bytes(), kBlockBytes);
    for (uint32_t s = 0; s < kSequences; ++s) {
      std::vector<Token> tokens = Sequence(s);
      auto session = cache_->BeginAppend({"default", "m"}, tokens, 0, {}, {});
      ASSERT_TRUE(session.ok()) << session.status();
      ASSERT_TRUE((*session)->Write(std::vector<std::byte>(4 * kBlockBytes, std::byte(s))).ok());
      ASSERT_TRUE((*session)->Commit().ok());
    }
    while (cache_->tiers().NeedsMigration()) cache_->tiers().Migrate();  // room to promote into
  }
  void TearDown() override {
    store_->Open();
    stub_.reset();
    server_->Shutdown(absl::Seconds(1));
    server_->Wait();
    server_.reset();
    cache_.reset();
  }

  static std::vector<Token> Sequence(uint32_t s) {
    std::vector<Token> t(4 * kBlockTokens);
    for (size_t i = 0; i < t.size(); ++i) t[i] = s * 1000 + static_cast<Token>(i) + 1;
    return t;
  }
  static v1::LookupRequest WaitingLookup(uint32_t s, uint32_t timeout_ms) {
    v1::LookupRequest req;
    req.set_model_id("m");
    std::vector<Token> t = Sequence(s);
    req.mutable_tokens()->Add(t.begin(), t.end());
    req.set_prefetch(v1::PREFETCH_WAIT);
    req.set_prefetch_timeout_ms(timeout_ms);
    return req;
  }
  // How long a plain lookup of sequence `s` takes to be answered.
  absl::Duration PlainLookup(uint32_t s) {
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(20));
    v1::LookupRequest req = WaitingLookup(s, 0);
    req.set_prefetch(v1::PREFETCH_NONE);
    v1::LookupResponse resp;
    const absl::Time start = absl::Now();
    EXPECT_TRUE(stub_->Lookup(&ctx, req, &resp).ok());
    return absl::Now() - start;
  }

  NullRpcObserver observer_;
  std::shared_ptr<GatedTier> store_;
  std::unique_ptr<Cache> cache_;
  std::string socket_;
  std::unique_ptr<GrpcServer> server_;
  std::unique_ptr<v1::Cache::Stub> stub_;
};

TEST_F(PrefetchWaitServiceTest, WaitingLookupsHoldNoThreadAndAnswerWhenTheReadBackIsDone) {
  store_->Close();
  // More waiting lookups than gRPC has callback threads on this machine.
  constexpr int kWaiting = 32;
  std::vector<std::thread> waiting;
  std::atomic<int> answered{0};
  std::atomic<int> ok{0};
  for (int i = 0; i < kWaiting; ++i) {
    waiting.emplace_back([&, i] {
      grpc::ClientContext ctx;
      ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(30));
      v1::LookupResponse resp;
      const grpc::Status s = stub_->Lookup(&ctx, WaitingLookup(i % 4, 0), &resp);
      if (s.ok() && resp.matched_tokens() == 4 * kBlockTokens) ok.fetch_add(1);
      answered.fetch_add(1);
    });
  }
  absl::SleepFor(absl::Milliseconds(300));  // let them all reach the daemon
  EXPECT_EQ(answered.load(), 0);            // they wait for the gated reads
  // Other calls are answered meanwhile.
  EXPECT_LT(PlainLookup(11), absl::Seconds(2));
  store_->Open();
  for (std::thread& t : waiting) t.join();
  EXPECT_EQ(ok.load(), kWaiting);
}

TEST_F(PrefetchWaitServiceTest, FetchesWaitingOnTheLowerTierHoldNoThread) {
  store_->Close();
  // More fetches of demoted sequences than gRPC has callback threads here.
  constexpr int kFetches = 32;
  std::vector<std::thread> fetches;
  std::atomic<int> answered{0};
  std::atomic<int> exact{0};
  for (int i = 0; i < kFetches; ++i) {
    fetches.emplace_back([&, i] {
      const uint32_t s = i % 4;
      grpc::ClientContext ctx;
      ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(30));
      v1::FetchRequest req;
      req.set_model_id("m");
      std::vector<Token> t = Sequence(s);
      req.mutable_tokens()->Add(t.begin(), t.end());
      auto reader = stub_->Fetch(&ctx, req);
      v1::FetchResponse chunk;
      uint64_t bytes = 0;
      bool same = true;
      while (reader->Read(&chunk)) {
        bytes += chunk.data().size();
        for (char c : chunk.data()) same = same && static_cast<uint8_t>(c) == s;
      }
      if (reader->Finish().ok() && same && bytes == 4 * kBlockBytes) exact.fetch_add(1);
      answered.fetch_add(1);
    });
  }
  absl::SleepFor(absl::Milliseconds(300));  // let them all reach the daemon
  EXPECT_EQ(answered.load(), 0);            // they wait for the gated reads
  EXPECT_LT(PlainLookup(11), absl::Seconds(2));
  store_->Open();
  for (std::thread& t : fetches) t.join();
  EXPECT_EQ(exact.load(), kFetches);
  EXPECT_GT(cache_->GetStats().fetch_reads.issued, 0u);
}

TEST_F(PrefetchWaitServiceTest, AWaitingLookupIsAnsweredAtItsTimeout) {
  store_->Close();
  grpc::ClientContext ctx;
  v1::LookupResponse resp;
  const absl::Time start = absl::Now();
  const grpc::Status s = stub_->Lookup(&ctx, WaitingLookup(0, 200), &resp);
  const absl::Duration took = absl::Now() - start;
  ASSERT_TRUE(s.ok()) << s.error_message();
  EXPECT_EQ(resp.matched_tokens(), 4 * kBlockTokens);  // still answered, from the lower tier
  EXPECT_GE(took, absl::Milliseconds(180));
  EXPECT_LT(took, absl::Seconds(5));
  EXPECT_EQ(cache_->GetStats().prefetch.late, 1u);
}

TEST_F(PrefetchWaitServiceTest, ShutdownAnswersWaitingLookupsInsteadOfWaitingOutTheirTimeouts) {
  store_->Close();
  std::atomic<bool> ok{false};
  std::thread waiting([&] {
    grpc::ClientContext ctx;
    v1::LookupResponse resp;
    const grpc::Status s = stub_->Lookup(&ctx, WaitingLookup(0, 30000), &resp);
    ok = s.ok() && resp.matched_tokens() == 4 * kBlockTokens;
  });
  absl::SleepFor(absl::Milliseconds(300));  // the lookup waits for its gated read-back
  const absl::Time start = absl::Now();
  server_->Shutdown(absl::Seconds(20));
  server_->Wait();
  EXPECT_LT(absl::Now() - start, absl::Seconds(10));  // not its 30 s timeout
  waiting.join();
  EXPECT_TRUE(ok.load());
}

TEST_F(PrefetchWaitServiceTest, ABatchWaitsForAllItsPrefetchesAtOnce) {
  v1::BatchLookupRequest batch;
  // Two demoted sequences.
  for (uint32_t s = 0; s < 2; ++s) *batch.add_lookups() = WaitingLookup(s, 10000);
  grpc::ClientContext ctx;
  v1::BatchLookupResponse resp;
  ASSERT_TRUE(stub_->BatchLookup(&ctx, batch, &resp).ok());
  // Answered after both read-backs ran (each counts as completed before
  // its waiters are told), with what they promoted.
  EXPECT_EQ(cache_->GetStats().prefetch.completed, 2u);
  EXPECT_EQ(cache_->GetStats().prefetch.late, 0u);
  EXPECT_GT(cache_->GetStats().tiers.lower[0].promotions, 0u);
  ASSERT_EQ(resp.outcomes_size(), 2);
  for (const v1::LookupOutcome& o : resp.outcomes()) {
    EXPECT_EQ(o.code(), 0) << o.message();
    EXPECT_EQ(o.response().matched_tokens(), 4 * kBlockTokens);
  }
}

}  // namespace
}  // namespace kvcache
