// The Cache service against a real gRPC server in this process: Append and
// Fetch streams are in the in-flight registry (with the client's request id,
// their peer and the bytes moved) exactly while they run, and every call
// echoes its request id in the trailers.
#include <gmock/gmock.h>
#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <optional>
#include <string>
#include <thread>

#include "absl/time/clock.h"
#include "kvcache/v1/kvcache.grpc.pb.h"
#include "server/core/cache.h"
#include "server/core/eviction_policy.h"
#include "server/core/slab_pool.h"
#include "server/frontdoor/inflight_calls.h"
#include "server/rpc/server.h"

namespace kvcache {
namespace {

using ::testing::MatchesRegex;

constexpr uint32_t kBlockTokens = 16;
constexpr uint32_t kHeadDim = 1024;
constexpr uint64_t kBlockBytes = 2 * kBlockTokens * kHeadDim * 2;  // 64 KiB, fp16
constexpr uint32_t kTokens = 256 * kBlockTokens;                   // 256 blocks: 16 MiB

std::optional<InflightCalls::Entry> Find(const InflightCalls& calls, std::string_view id) {
  for (InflightCalls::Entry& e : calls.Snapshot()) {
    if (e.request_id == id) return e;
  }
  return std::nullopt;
}

// Waits (up to 10 s) until `done` holds.
template <typename F>
bool Eventually(F done) {
  const absl::Time deadline = absl::Now() + absl::Seconds(10);
  while (!done()) {
    if (absl::Now() > deadline) return false;
    absl::SleepFor(absl::Milliseconds(5));
  }
  return true;
}

std::string TrailerId(const grpc::ClientContext& ctx) {
  const auto& trailers = ctx.GetServerTrailingMetadata();
  auto it = trailers.find("x-request-id");
  return it == trailers.end() ? "" : std::string(it->second.data(), it->second.size());
}

class InflightServiceTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto pool = SlabPool::Create({.capacity_bytes = uint64_t{128} << 20,
                                  .slab_bytes = uint64_t{4} << 20,
                                  .min_class_bytes = 64});
    ASSERT_TRUE(pool.ok()) << pool.status();
    cache_ = std::make_unique<Cache>(CacheOptions{}, *std::move(pool), NewLruPolicy(),
                                     SystemClock::Get());
    socket_ = ::testing::TempDir() + "/inflight_service_test." + std::to_string(::getpid());
    auto server =
        GrpcServer::Start({.unix_socket = socket_, .inflight = &calls_}, cache_.get(), &observer_);
    ASSERT_TRUE(server.ok()) << server.status();
    server_ = *std::move(server);
    grpc::ChannelArguments args;
    // A reader that stops reading stalls the daemon's writes after a small window.
    args.SetInt(GRPC_ARG_HTTP2_BDP_PROBE, 0);
    args.SetInt(GRPC_ARG_HTTP2_STREAM_LOOKAHEAD_BYTES, 64 << 10);
    args.SetMaxReceiveMessageSize(64 << 20);
    stub_ = v1::Cache::NewStub(
        grpc::CreateCustomChannel("unix:" + socket_, grpc::InsecureChannelCredentials(), args));
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
    for (uint32_t i = 0; i < kTokens; ++i) tokens_.push_back(i);
  }
  void TearDown() override {
    stub_.reset();
    if (server_ != nullptr) {
      server_->Shutdown(absl::Seconds(1));
      server_->Wait();
    }
    server_.reset();
    cache_.reset();
  }

  InflightCalls calls_;
  NullRpcObserver observer_;
  std::unique_ptr<Cache> cache_;
  std::string socket_;
  std::unique_ptr<GrpcServer> server_;
  std::unique_ptr<v1::Cache::Stub> stub_;
  std::vector<uint32_t> tokens_;
};

TEST_F(InflightServiceTest, AppendAndFetchAreListedWhileInFlight) {
  // An append whose client has sent its header and one block, and waits.
  grpc::ClientContext append_ctx;
  append_ctx.AddMetadata("x-request-id", "append-1");
  v1::AppendResponse appended;
  std::unique_ptr<grpc::ClientWriter<v1::AppendRequest>> writer =
      stub_->Append(&append_ctx, &appended);
  v1::AppendRequest header;
  header.mutable_header()->set_model_id("m");
  header.mutable_header()->mutable_tokens()->Add(tokens_.begin(), tokens_.end());
  ASSERT_TRUE(writer->Write(header));
  v1::AppendRequest chunk;
  chunk.set_kv_chunk(std::string(kBlockBytes, '\x5a'));
  ASSERT_TRUE(writer->Write(chunk));
  ASSERT_TRUE(Eventually([&] {
    auto e = Find(calls_, "append-1");
    return e.has_value() && e->bytes == kBlockBytes;
  }));
  const InflightCalls::Entry append = *Find(calls_, "append-1");
  EXPECT_EQ(append.method, "Append");
  EXPECT_FALSE(append.peer.empty());
  for (uint32_t b = 1; b < kTokens / kBlockTokens; ++b) ASSERT_TRUE(writer->Write(chunk));
  ASSERT_TRUE(writer->WritesDone());
  const grpc::Status append_status = writer->Finish();
  ASSERT_TRUE(append_status.ok()) << append_status.error_message();
  EXPECT_EQ(appended.stored_blocks(), kTokens / kBlockTokens);
  EXPECT_EQ(TrailerId(append_ctx), "append-1");
  EXPECT_TRUE(Eventually([&] { return !Find(calls_, "append-1").has_value(); }));

  // A fetch of 16 MiB whose reader does not read: the daemon's writes stall.
  grpc::ClientContext fetch_ctx;
  fetch_ctx.AddMetadata("x-request-id", "fetch-1");
  v1::FetchRequest fetch;
  fetch.set_model_id("m");
  fetch.mutable_tokens()->Add(tokens_.begin(), tokens_.end());
  std::unique_ptr<grpc::ClientReader<v1::FetchResponse>> reader = stub_->Fetch(&fetch_ctx, fetch);
  ASSERT_TRUE(Eventually([&] {
    auto e = Find(calls_, "fetch-1");
    return e.has_value() && e->bytes > 0;
  }));
  absl::SleepFor(absl::Milliseconds(200));
  const std::optional<InflightCalls::Entry> stalled = Find(calls_, "fetch-1");
  ASSERT_TRUE(stalled.has_value()) << "the fetch ended though nothing was read";
  EXPECT_EQ(stalled->method, "Fetch");
  EXPECT_LT(stalled->bytes, uint64_t{kTokens} / kBlockTokens * kBlockBytes);
  v1::FetchResponse msg;
  uint64_t received = 0;
  while (reader->Read(&msg)) received += msg.data().size();
  ASSERT_TRUE(reader->Finish().ok());
  EXPECT_EQ(received, uint64_t{kTokens} / kBlockTokens * kBlockBytes);
  EXPECT_EQ(TrailerId(fetch_ctx), "fetch-1");
  EXPECT_TRUE(Eventually([&] { return calls_.size() == 0; }));
}

TEST_F(InflightServiceTest, EveryCallEchoesItsRequestIdOrGetsOne) {
  v1::LookupRequest req;
  req.set_model_id("unknown");
  req.add_tokens(1);
  v1::LookupResponse resp;
  grpc::ClientContext with_id;
  with_id.AddMetadata("x-request-id", "mine-42");
  EXPECT_EQ(stub_->Lookup(&with_id, req, &resp).error_code(), grpc::StatusCode::NOT_FOUND);
  EXPECT_EQ(TrailerId(with_id), "mine-42");

  grpc::ClientContext without_id;
  EXPECT_EQ(stub_->Lookup(&without_id, req, &resp).error_code(), grpc::StatusCode::NOT_FOUND);
  EXPECT_THAT(TrailerId(without_id), MatchesRegex("[0-9a-f]{16}"));
  EXPECT_EQ(calls_.size(), 0u);  // unary calls are not registered
}

}  // namespace
}  // namespace kvcache
