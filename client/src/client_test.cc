// kvcache::Client against an in-process fake kvcached that can fail, stall
// and corrupt on purpose: retries, deadlines, Append framing and checksums,
// Fetch verification, layout caching and error mapping.
#include "kvcache/client.h"

#include <gmock/gmock.h>
#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>

#include <atomic>
#include <cstring>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "kvcache/v1/admin.grpc.pb.h"
#include "kvcache/v1/kvcache.grpc.pb.h"

namespace kvcache {
namespace {

constexpr uint32_t kBlockTokens = 16;
constexpr uint64_t kBlockBytes = 1 * 2 * 1 * kBlockTokens * 16 * 2;  // the layout below

v1::ModelLayout SmallLayout() {
  v1::ModelLayout l;
  l.set_num_layers(1);
  l.set_num_kv_heads(1);
  l.set_head_dim(16);
  l.set_dtype(v1::DTYPE_FP16);
  l.set_block_tokens(kBlockTokens);
  return l;
}

enum class FetchFault { kNone, kFlipByte, kSwapBlocks, kTruncate, kWrongChecksum };

// Serves one model, "m", whose cached prefix is `blocks`.
class FakeServer final : public v1::Cache::Service, public v1::Admin::Service {
 public:
  std::atomic<int> unavailable{0};  // fail this many next calls with UNAVAILABLE
  std::atomic<int> lookups{0}, evicts{0}, list_models{0}, appends{0};
  std::atomic<int> register_delay_ms{0};
  std::atomic<FetchFault> fault{FetchFault::kNone};
  grpc::Status append_status = grpc::Status::OK;
  std::vector<std::string> blocks;
  uint64_t fetch_chunk = 100;
  std::atomic<int> fetch_encoding{v1::BLOCK_ENCODING_RAW};  // what Fetch says it sends
  std::atomic<uint64_t> declared_block_bytes{0};            // nonzero: what Fetch declares

  absl::Mutex mu;
  v1::AppendHeader last_header ABSL_GUARDED_BY(mu);
  std::vector<size_t> chunk_sizes ABSL_GUARDED_BY(mu);
  std::string appended ABSL_GUARDED_BY(mu);
  std::vector<std::string> lookup_request_ids ABSL_GUARDED_BY(mu);  // x-request-id of each

  // A restart of the daemon: every model is unregistered until it is
  // registered again (never, with `registration_is_lost`).
  std::atomic<bool> restarted{false};
  std::atomic<bool> registration_is_lost{false};
  std::atomic<int> registers{0}, fetches{0};
  v1::ModelLayout registered_layout ABSL_GUARDED_BY(mu);

  grpc::Status NotRegistered() {
    return grpc::Status(grpc::StatusCode::NOT_FOUND,
                        "model \"m\" is not registered in namespace \"default\"");
  }

  grpc::Status RegisterModel(grpc::ServerContext*, const v1::RegisterModelRequest* req,
                             v1::RegisterModelResponse* resp) override {
    std::this_thread::sleep_for(std::chrono::milliseconds(register_delay_ms.load()));
    ++registers;
    if (!registration_is_lost) restarted = false;
    {
      absl::MutexLock lock(&mu);
      registered_layout = req->layout();
    }
    resp->set_created(true);
    *resp->mutable_layout() = req->layout();
    resp->set_block_bytes(kBlockBytes);
    return grpc::Status::OK;
  }
  grpc::Status Lookup(grpc::ServerContext* ctx, const v1::LookupRequest*,
                      v1::LookupResponse* resp) override {
    ++lookups;
    {
      absl::MutexLock lock(&mu);
      for (auto [it, end] = ctx->client_metadata().equal_range("x-request-id"); it != end; ++it) {
        lookup_request_ids.emplace_back(it->second.data(), it->second.size());
      }
    }
    if (restarted) return NotRegistered();
    if (Unavailable()) return grpc::Status(grpc::StatusCode::UNAVAILABLE, "try again");
    resp->set_matched_tokens(blocks.size() * kBlockTokens);
    return grpc::Status::OK;
  }
  grpc::Status Evict(grpc::ServerContext*, const v1::EvictRequest*, v1::EvictResponse*) override {
    ++evicts;
    if (Unavailable()) return grpc::Status(grpc::StatusCode::UNAVAILABLE, "try again");
    return grpc::Status::OK;
  }
  grpc::Status Append(grpc::ServerContext*, grpc::ServerReader<v1::AppendRequest>* reader,
                      v1::AppendResponse* resp) override {
    ++appends;
    if (restarted) return NotRegistered();
    v1::AppendRequest msg;
    absl::MutexLock lock(&mu);
    chunk_sizes.clear();
    appended.clear();
    while (reader->Read(&msg)) {
      if (msg.has_header()) {
        last_header = msg.header();
      } else {
        chunk_sizes.push_back(msg.kv_chunk().size());
        appended += msg.kv_chunk();
      }
    }
    resp->set_stored_blocks(static_cast<uint32_t>(appended.size() / kBlockBytes));
    return append_status;
  }
  grpc::Status Fetch(grpc::ServerContext*, const v1::FetchRequest* req,
                     grpc::ServerWriter<v1::FetchResponse>* writer) override {
    ++fetches;
    if (restarted) return NotRegistered();
    if (req->model_id() != "m") return grpc::Status(grpc::StatusCode::NOT_FOUND, "no model");
    std::vector<uint32_t> order(blocks.size());
    for (uint32_t i = 0; i < order.size(); ++i) order[i] = i;
    if (fault == FetchFault::kSwapBlocks) std::swap(order[0], order[1]);
    for (uint32_t i : order) {
      const std::string& b = blocks[i];
      for (uint64_t off = 0; off < b.size(); off += fetch_chunk) {
        if (fault == FetchFault::kTruncate && i + 1 == blocks.size() && off > 0) break;
        v1::FetchResponse m;
        m.set_matched_tokens(blocks.size() * kBlockTokens);
        m.set_block_index(i);
        m.set_block_bytes(declared_block_bytes != 0 ? declared_block_bytes.load() : b.size());
        m.set_encoding(static_cast<v1::BlockEncoding>(fetch_encoding.load()));
        m.set_block_checksum(BlockChecksum(std::as_bytes(std::span(b.data(), b.size()))));
        if (fault == FetchFault::kWrongChecksum) m.set_block_checksum(m.block_checksum() ^ 1);
        m.set_offset(off);
        m.set_data(b.substr(off, fetch_chunk));
        if (fault == FetchFault::kFlipByte && i == 1 && off == 0) (*m.mutable_data())[5] ^= 0x10;
        writer->Write(m);
      }
    }
    return grpc::Status::OK;
  }
  grpc::Status ListModels(grpc::ServerContext*, const v1::ListModelsRequest*,
                          v1::ListModelsResponse* resp) override {
    ++list_models;
    v1::ModelInfo* m = resp->add_models();
    m->set_namespace_("default");
    m->set_model_id("m");
    *m->mutable_layout() = SmallLayout();
    m->set_block_bytes(kBlockBytes);
    return grpc::Status::OK;
  }

 private:
  bool Unavailable() {
    int n = unavailable.load();
    while (n > 0 && !unavailable.compare_exchange_weak(n, n - 1)) {
    }
    return n > 0;
  }
};

class ClientTest : public ::testing::Test {
 protected:
  void SetUp() override {
    for (int b = 0; b < 3; ++b) {
      std::string block(kBlockBytes, '\0');
      for (size_t i = 0; i < block.size(); ++i) block[i] = static_cast<char>(b * 31 + i * 7);
      fake_.blocks.push_back(block);
    }
    grpc::ServerBuilder builder;
    builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port_);
    builder.RegisterService(static_cast<v1::Cache::Service*>(&fake_));
    builder.RegisterService(static_cast<v1::Admin::Service*>(&fake_));
    server_ = builder.BuildAndStart();
    ASSERT_NE(server_, nullptr);
  }
  void TearDown() override { server_->Shutdown(); }

  std::unique_ptr<Client> Connect(ClientOptions o = {}) {
    o.target = "127.0.0.1:" + std::to_string(port_);
    auto c = Client::Connect(o);
    EXPECT_TRUE(c.ok()) << c.status();
    return *std::move(c);
  }
  static std::vector<uint32_t> Tokens(size_t n) {
    std::vector<uint32_t> t(n);
    for (size_t i = 0; i < n; ++i) t[i] = static_cast<uint32_t>(i * 13 + 1);
    return t;
  }

  FakeServer fake_;
  int port_ = 0;
  std::unique_ptr<grpc::Server> server_;
};

TEST_F(ClientTest, ConnectRejectsBadOptions) {
  ClientOptions o;
  o.max_attempts = 0;
  EXPECT_EQ(Client::Connect(o).status().code(), absl::StatusCode::kInvalidArgument);
  o = {};
  o.timeout = absl::ZeroDuration();
  EXPECT_EQ(Client::Connect(o).status().code(), absl::StatusCode::kInvalidArgument);
  o = {};
  o.target = "";
  EXPECT_EQ(Client::Connect(o).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST_F(ClientTest, RetriesIdempotentCallsOnUnavailable) {
  auto c = Connect();
  fake_.unavailable = 2;
  auto r = c->Lookup("m", Tokens(48));
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->matched_tokens, 48u);
  EXPECT_EQ(fake_.lookups, 3);

  fake_.unavailable = 5;
  auto e = c->EvictModel("m");
  EXPECT_EQ(e.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(std::string(e.status().message()),
              ::testing::MatchesRegex("try again \\(request id [0-9a-f]{16}\\)"));
  EXPECT_EQ(fake_.evicts, 3);  // max_attempts
}

TEST_F(ClientTest, EveryCallCarriesARequestIdThatItsErrorNames) {
  auto c = Connect();
  ASSERT_TRUE(c->Lookup("m", Tokens(48)).ok());
  fake_.unavailable = 2;  // two retries: one call, three attempts
  ASSERT_TRUE(c->Lookup("m", Tokens(48)).ok());
  fake_.restarted = true;
  fake_.registration_is_lost = true;
  auto failed = c->Lookup("m", Tokens(48));
  ASSERT_EQ(failed.status().code(), absl::StatusCode::kNotFound);
  absl::MutexLock lock(&fake_.mu);
  ASSERT_EQ(fake_.lookup_request_ids.size(), 5u);
  for (const std::string& id : fake_.lookup_request_ids) {
    EXPECT_THAT(id, ::testing::MatchesRegex("[0-9a-f]{16}"));
  }
  EXPECT_NE(fake_.lookup_request_ids[0], fake_.lookup_request_ids[1]);
  EXPECT_EQ(fake_.lookup_request_ids[1], fake_.lookup_request_ids[2]);  // retries share it
  EXPECT_EQ(fake_.lookup_request_ids[2], fake_.lookup_request_ids[3]);
  EXPECT_EQ(std::string(failed.status().message()),
            absl::StrCat("model \"m\" is not registered in namespace \"default\" (request id ",
                         fake_.lookup_request_ids[4], ")"));
}

TEST_F(ClientTest, AfterADaemonRestartDataCallsRegisterTheModelAgainAndRetryOnce) {
  auto c = Connect();
  v1::ModelLayout layout = SmallLayout();
  ASSERT_TRUE(c->RegisterModel("m", layout).ok());
  EXPECT_EQ(fake_.registers, 1);

  fake_.restarted = true;
  auto looked = c->Lookup("m", Tokens(48));
  ASSERT_TRUE(looked.ok()) << looked.status();
  EXPECT_EQ(fake_.registers, 2);
  EXPECT_EQ(fake_.lookups, 2);
  {
    absl::MutexLock lock(&fake_.mu);
    EXPECT_EQ(fake_.registered_layout.SerializeAsString(), layout.SerializeAsString());
  }

  fake_.restarted = true;
  std::vector<std::byte> out(3 * kBlockBytes);
  auto fetched = c->Fetch("m", Tokens(48), out);
  ASSERT_TRUE(fetched.ok()) << fetched.status();
  EXPECT_EQ(fetched->blocks, 3u);
  EXPECT_EQ(fake_.registers, 3);

  fake_.restarted = true;
  auto blocks = c->FetchBlocks("m", Tokens(48), false);
  ASSERT_TRUE(blocks.ok()) << blocks.status();
  EXPECT_EQ(blocks->size(), 3u);
  EXPECT_EQ(fake_.registers, 4);

  fake_.restarted = true;
  const std::string kv = fake_.blocks[0];
  auto appended =
      c->Append("m", Tokens(kBlockTokens), std::as_bytes(std::span(kv.data(), kv.size())));
  ASSERT_TRUE(appended.ok()) << appended.status();
  EXPECT_EQ(appended->stored_blocks, 1u);
  EXPECT_EQ(fake_.registers, 5);
  EXPECT_EQ(fake_.appends, 2);
}

TEST_F(ClientTest, ReregistersOnlyModelsItRegisteredAndRetriesOnlyOnce) {
  auto c = Connect();
  // Never registered by this client: the NOT_FOUND is returned as is.
  fake_.restarted = true;
  EXPECT_EQ(c->Lookup("m", Tokens(16)).status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(fake_.registers, 0);
  EXPECT_EQ(fake_.lookups, 1);

  // Registered, but the registration does not take: one retry, then the error.
  ASSERT_TRUE(c->RegisterModel("m", SmallLayout()).ok());
  fake_.registration_is_lost = true;
  fake_.restarted = true;
  auto looked = c->Lookup("m", Tokens(16));
  EXPECT_EQ(looked.status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(fake_.registers, 2);
  EXPECT_EQ(fake_.lookups, 3);
}

TEST_F(ClientTest, LeasingLookupIsNotRetried) {
  auto c = Connect();
  fake_.unavailable = 1;
  LookupOptions lo;
  lo.acquire_lease = true;
  EXPECT_EQ(c->Lookup("m", Tokens(16), lo).status().code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(fake_.lookups, 1);
}

TEST_F(ClientTest, DeadlineApplies) {
  ClientOptions o;
  o.timeout = absl::Milliseconds(100);
  auto c = Connect(o);
  fake_.register_delay_ms = 400;
  EXPECT_EQ(c->RegisterModel("m", SmallLayout()).status().code(),
            absl::StatusCode::kDeadlineExceeded);
}

TEST_F(ClientTest, AppendSendsHeaderChecksumsAndChunks) {
  ClientOptions o;
  o.append_chunk_bytes = 300;
  auto c = Connect(o);
  ASSERT_TRUE(c->RegisterModel("m", SmallLayout()).ok());
  std::string kv = fake_.blocks[1] + fake_.blocks[2];
  const auto tokens = Tokens(3 * kBlockTokens + 5);
  AppendOptions ao;
  ao.start_token = kBlockTokens;
  ao.hints.set_priority(7);
  auto r = c->Append("m", tokens, std::as_bytes(std::span(kv.data(), kv.size())), ao);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->stored_blocks, 2u);
  EXPECT_EQ(fake_.list_models, 0);  // the layout came with RegisterModel
  absl::MutexLock lock(&fake_.mu);
  EXPECT_EQ(fake_.appended, kv);
  for (size_t n : fake_.chunk_sizes) EXPECT_LE(n, 300u);
  EXPECT_EQ(fake_.last_header.model_id(), "m");
  EXPECT_EQ(fake_.last_header.start_token(), kBlockTokens);
  EXPECT_EQ(fake_.last_header.hints().priority(), 7);
  EXPECT_EQ(fake_.last_header.tokens_size(), static_cast<int>(tokens.size()));
  ASSERT_EQ(fake_.last_header.block_checksums_size(), 2);
  for (int b = 0; b < 2; ++b) {
    const std::string& blk = fake_.blocks[b + 1];
    EXPECT_EQ(fake_.last_header.block_checksums(b),
              BlockChecksum(std::as_bytes(std::span(blk.data(), blk.size()))));
  }
}

TEST_F(ClientTest, AppendLearnsLayoutOnceAndChecksSize) {
  auto c = Connect();
  std::string kv = fake_.blocks[0];
  auto bytes = std::as_bytes(std::span(kv.data(), kv.size()));
  ASSERT_TRUE(c->Append("m", Tokens(kBlockTokens), bytes).ok());
  ASSERT_TRUE(c->Append("m", Tokens(kBlockTokens), bytes).ok());
  EXPECT_EQ(fake_.list_models, 1);

  // One block of tokens, two blocks of bytes: refused before any byte is sent.
  std::string two = kv + kv;
  auto s = c->Append("m", Tokens(kBlockTokens), std::as_bytes(std::span(two.data(), two.size())));
  EXPECT_EQ(s.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(fake_.appends, 2);

  EXPECT_EQ(c->Append("other", Tokens(kBlockTokens), bytes).status().code(),
            absl::StatusCode::kNotFound);
}

TEST_F(ClientTest, AppendWithoutChecksumsNeedsNoLayout) {
  auto c = Connect();
  std::string kv = fake_.blocks[0];
  AppendOptions ao;
  ao.send_checksums = false;
  ASSERT_TRUE(
      c->Append("m", Tokens(kBlockTokens), std::as_bytes(std::span(kv.data(), kv.size())), ao)
          .ok());
  EXPECT_EQ(fake_.list_models, 0);
  absl::MutexLock lock(&fake_.mu);
  EXPECT_EQ(fake_.last_header.block_checksums_size(), 0);
}

TEST_F(ClientTest, AppendKeepsServerCodeAndMessage) {
  auto c = Connect();
  fake_.append_status = grpc::Status(grpc::StatusCode::RESOURCE_EXHAUSTED, "cache is full");
  std::string kv = fake_.blocks[0];
  auto r = c->Append("m", Tokens(kBlockTokens), std::as_bytes(std::span(kv.data(), kv.size())));
  EXPECT_EQ(r.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(std::string(r.status().message()),
              ::testing::MatchesRegex("cache is full \\(request id [0-9a-f]{16}\\)"));
}

TEST_F(ClientTest, FetchReassemblesVerifiedBlocks) {
  auto c = Connect();
  std::vector<std::byte> out(3 * kBlockBytes + 7);
  auto r = c->Fetch("m", Tokens(60), out);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->matched_tokens, 48u);
  EXPECT_EQ(r->blocks, 3u);
  EXPECT_EQ(r->bytes, 3 * kBlockBytes);
  std::string all = fake_.blocks[0] + fake_.blocks[1] + fake_.blocks[2];
  EXPECT_EQ(std::memcmp(out.data(), all.data(), all.size()), 0);
}

TEST_F(ClientTest, FetchRefusesBadStreams) {
  auto c = Connect();
  std::vector<std::byte> out(3 * kBlockBytes);
  for (FetchFault f : {FetchFault::kFlipByte, FetchFault::kSwapBlocks, FetchFault::kTruncate,
                       FetchFault::kWrongChecksum}) {
    fake_.fault = f;
    EXPECT_EQ(c->Fetch("m", Tokens(48), out).status().code(), absl::StatusCode::kDataLoss)
        << static_cast<int>(f);
  }
}

TEST_F(ClientTest, FetchBlocksReturnsEachVerifiedBlock) {
  auto c = Connect();
  auto r = c->FetchBlocks("m", Tokens(60), /*lossy_as_stored=*/false);
  ASSERT_TRUE(r.ok()) << r.status();
  ASSERT_EQ(r->size(), 3u);
  for (uint32_t b = 0; b < 3; ++b) {
    EXPECT_EQ((*r)[b].index, b);
    EXPECT_EQ((*r)[b].encoding, v1::BLOCK_ENCODING_RAW);
    EXPECT_EQ((*r)[b].bytes, fake_.blocks[b]);
    EXPECT_TRUE((*r)[b].kept_tokens.empty());
  }
}

TEST_F(ClientTest, FetchBlocksRefusesBadStreams) {
  auto c = Connect();
  for (FetchFault f : {FetchFault::kFlipByte, FetchFault::kSwapBlocks, FetchFault::kTruncate,
                       FetchFault::kWrongChecksum}) {
    fake_.fault = f;
    EXPECT_EQ(c->FetchBlocks("m", Tokens(48), false).status().code(), absl::StatusCode::kDataLoss)
        << static_cast<int>(f);
  }
}

TEST_F(ClientTest, FetchBlocksRefusesEncodingsItDidNotAskFor) {
  auto c = Connect();
  fake_.fetch_encoding = v1::BLOCK_ENCODING_COMPRESSED;
  auto unasked = c->FetchBlocks("m", Tokens(48), /*lossy_as_stored=*/false);
  EXPECT_EQ(unasked.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(std::string(unasked.status().message()), ::testing::HasSubstr("did not ask for"));
  auto asked = c->FetchBlocks("m", Tokens(48), /*lossy_as_stored=*/true, {.accept_lossy = true});
  ASSERT_TRUE(asked.ok()) << asked.status();
  EXPECT_EQ((*asked)[0].encoding, v1::BLOCK_ENCODING_COMPRESSED);

  fake_.fetch_encoding = 7;  // no such encoding
  EXPECT_EQ(c->FetchBlocks("m", Tokens(48), true, {.accept_lossy = true}).status().code(),
            absl::StatusCode::kDataLoss);
  fake_.fetch_encoding = v1::BLOCK_ENCODING_DEQUANTIZED;  // what a fetch without it may get
  EXPECT_TRUE(c->FetchBlocks("m", Tokens(48), false).ok());
}

TEST_F(ClientTest, FetchBlocksRefusesSizesTheLayoutDoesNotAllow) {
  auto c = Connect();
  // A raw block has exactly the layout's size: another one is a stale layout.
  fake_.declared_block_bytes = 2 * kBlockBytes;
  auto raw = c->FetchBlocks("m", Tokens(48), false);
  EXPECT_EQ(raw.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(raw.status().message()),
              ::testing::HasSubstr("layout has " + std::to_string(kBlockBytes)));
  // A size no memory could hold is refused before anything is reserved.
  fake_.declared_block_bytes = uint64_t{1} << 50;
  EXPECT_EQ(c->FetchBlocks("m", Tokens(48), false).status().code(),
            absl::StatusCode::kFailedPrecondition);

  // A compressed block may exceed the raw size by its header and scales, no more.
  fake_.fetch_encoding = v1::BLOCK_ENCODING_COMPRESSED;
  fake_.declared_block_bytes = uint64_t{1} << 50;
  auto huge = c->FetchBlocks("m", Tokens(48), true, {.accept_lossy = true});
  EXPECT_EQ(huge.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(std::string(huge.status().message()), ::testing::HasSubstr("declares"));
  fake_.declared_block_bytes = 0;
  EXPECT_TRUE(c->FetchBlocks("m", Tokens(48), true, {.accept_lossy = true}).ok());
}

TEST_F(ClientTest, FetchIntoSmallBufferIsInvalidArgument) {
  auto c = Connect();
  std::vector<std::byte> out(3 * kBlockBytes - 1);
  EXPECT_EQ(c->Fetch("m", Tokens(48), out).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(c->Fetch("nope", Tokens(48), out).status().code(), absl::StatusCode::kNotFound);
}

TEST_F(ClientTest, UnreachableServerIsUnavailable) {
  ClientOptions o;
  o.target = "127.0.0.1:1";
  o.timeout = absl::Seconds(5);
  auto c = Client::Connect(o);
  ASSERT_TRUE(c.ok());
  EXPECT_EQ((*c)->GetStats().status().code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ((*c)->WaitForReady(absl::Milliseconds(200)).code(), absl::StatusCode::kUnavailable);
}

}  // namespace
}  // namespace kvcache
