// A table of bad requests: each must get its specific error code and a
// message naming what was wrong, and must leave the cache exactly as it was.
#include <gmock/gmock.h>
#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>

#include <functional>
#include <limits>

#include "kvcache/v1/kvcache.grpc.pb.h"
#include "tests/integration/daemon_process.h"
#include "tests/integration/kv_pattern.h"

namespace kvcache::testing {
namespace {

using ::testing::HasSubstr;

constexpr uint32_t kBlockTokens = 16;

v1::ModelLayout GoodLayout() { return MakeLayout(2, 2, 32, v1::DTYPE_FP16, kBlockTokens); }
constexpr uint64_t kGoodBlockBytes = 2 * 2 * 2 * kBlockTokens * 32 * 2;  // of GoodLayout

struct BadCase {
  std::string name;
  absl::StatusCode code;
  std::string message;  // a substring the error must contain
  std::function<absl::Status(Client&, v1::Cache::Stub&)> call;
};

// Sends an Append stream by hand (the client library would refuse some of these).
absl::Status RawAppend(v1::Cache::Stub& stub, const v1::AppendHeader& header,
                       const std::vector<std::string>& chunks, bool header_first = true) {
  grpc::ClientContext ctx;
  v1::AppendResponse response;
  auto writer = stub.Append(&ctx, &response);
  v1::AppendRequest msg;
  if (header_first) {
    *msg.mutable_header() = header;
    writer->Write(msg);
  }
  for (const std::string& c : chunks) {
    msg.set_kv_chunk(c);
    if (!writer->Write(msg)) break;
  }
  writer->WritesDone();
  grpc::Status s = writer->Finish();
  return absl::Status(static_cast<absl::StatusCode>(s.error_code()), s.error_message());
}

// The header of an append of tokens[start:]'s whole blocks, with the
// checksums of the KV MakeKv gives them (GoodLayout's blocks), so that each
// case fails for its own reason and not for want of block_checksums.
v1::AppendHeader Header(const std::vector<uint32_t>& tokens, uint64_t start = 0) {
  v1::AppendHeader h;
  h.set_model_id("m");
  for (uint32_t t : tokens) h.add_tokens(t);
  h.set_start_token(start);
  const size_t blocks = start < tokens.size() ? (tokens.size() - start) / kBlockTokens : 0;
  for (uint64_t sum :
       BlockChecksums(MakeKv(tokens, kBlockTokens, kGoodBlockBytes, start / kBlockTokens, blocks),
                      kGoodBlockBytes)) {
    h.add_block_checksums(sum);
  }
  return h;
}

class BadInputTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto d = DaemonProcess::Start({.extra_flags = {"--config", WriteConfig()}});
    ASSERT_TRUE(d.ok()) << d.status();
    daemon_ = *std::move(d);
    client_ = daemon_->NewClient();
    grpc::ChannelArguments args;
    args.SetMaxSendMessageSize(64 << 20);
    stub_ = v1::Cache::NewStub(grpc::CreateCustomChannel(daemon_->unix_target(),
                                                         grpc::InsecureChannelCredentials(), args));
    auto r = client_->RegisterModel("m", GoodLayout());
    ASSERT_TRUE(r.ok()) << r.status();
    block_bytes_ = r->block_bytes();
    ASSERT_EQ(block_bytes_, kGoodBlockBytes);
    cached_ = MakeTokens(1, 3 * kBlockTokens);
    ASSERT_TRUE(
        client_->Append("m", cached_, MakeKv(cached_, kBlockTokens, block_bytes_, 0, 3)).ok());
  }
  void TearDown() override {
    client_.reset();
    stub_.reset();
    if (daemon_ != nullptr) {
      EXPECT_EQ(daemon_->Stop(), 0);
    }
  }
  static std::string WriteConfig() {
    // Small limits, so the limit checks are cheap to reach.
    static const std::string path = [] {
      std::string p = "/tmp/kvcached-bad-input-config.json";
      std::FILE* f = std::fopen(p.c_str(), "w");
      std::fputs(R"({"limits": {"max_tokens_per_request": 4096, "max_message_bytes": 1048576,
                     "fetch_chunk_bytes": 65536, "max_leases": 4,
                     "max_protected_ranges": 64}})",
                 f);
      std::fclose(f);
      return p;
    }();
    return path;
  }
  // Everything observable about the cache's contents.
  std::string Snapshot() {
    auto stats = client_->GetStats();
    EXPECT_TRUE(stats.ok());
    v1::GetStatsResponse s = *stats;
    s.clear_rpcs();                        // the calls themselves are counted there
    s.clear_memory();                      // the process's memory, not the cache's state
    for (auto& m : *s.mutable_models()) {  // lookups by the check itself move these
      m.clear_hit_tokens();
      m.clear_miss_tokens();
    }
    std::vector<std::byte> out(3 * block_bytes_);
    auto fetched = client_->Fetch("m", cached_, out);
    EXPECT_TRUE(fetched.ok());
    EXPECT_TRUE(out == MakeKv(cached_, kBlockTokens, block_bytes_, 0, 3));
    auto models = client_->ListModels();
    return s.DebugString() + models->DebugString();
  }

  std::unique_ptr<DaemonProcess> daemon_;
  std::unique_ptr<Client> client_;
  std::unique_ptr<v1::Cache::Stub> stub_;
  uint64_t block_bytes_ = 0;
  std::vector<uint32_t> cached_;
};

TEST_F(BadInputTest, EachBadRequestGetsItsErrorAndChangesNothing) {
  const uint64_t bb = block_bytes_;
  const auto fresh = MakeTokens(2, 2 * kBlockTokens);
  const auto fresh_kv = MakeKv(fresh, kBlockTokens, bb, 0, 2);
  auto bytes = [](const std::vector<std::byte>& v, size_t from, size_t n) {
    return std::string(reinterpret_cast<const char*>(v.data()) + from, n);
  };
  auto with_layout = [](std::function<void(v1::ModelLayout&)> edit) {
    v1::ModelLayout l = GoodLayout();
    edit(l);
    return l;
  };
  auto register_layout = [](Client& c, const v1::ModelLayout& l, const std::string& id = "new") {
    return c.RegisterModel(id, l).status();
  };
  auto policy = [](Client& c, std::function<void(v1::UpdateModelPolicyRequest&)> edit) {
    v1::UpdateModelPolicyRequest req;
    req.set_model_id("m");
    edit(req);
    return c.UpdateModelPolicy(req).status();
  };
  const std::vector<float> attention(cached_.size(), 0.1f);
  std::vector<BadCase> cases = {
      {"report with a value per token missing", absl::StatusCode::kInvalidArgument, "attention has",
       [&](Client& c, auto&) {
         return c.ReportAttention("m", cached_, std::span(attention).first(10)).status();
       }},
      {"report a negative attention", absl::StatusCode::kInvalidArgument, "finite and >= 0",
       [&](Client& c, auto&) {
         std::vector<float> bad = attention;
         bad[3] = -0.5f;
         return c.ReportAttention("m", cached_, bad).status();
       }},
      {"report rows that do not divide", absl::StatusCode::kInvalidArgument, "num_layers",
       [&](Client& c, auto&) { return c.ReportAttention("m", cached_, attention, 4).status(); }},
      {"report by tokens and lease", absl::StatusCode::kInvalidArgument, "either tokens",
       [&](Client&, auto& stub) {
         grpc::ClientContext ctx;
         v1::ReportAttentionRequest req;
         req.set_model_id("m");
         req.add_tokens(1);
         req.set_lease_id(7);
         req.add_attention(1);
         v1::ReportAttentionResponse resp;
         grpc::Status s = stub.ReportAttention(&ctx, req, &resp);
         return absl::Status(static_cast<absl::StatusCode>(s.error_code()), s.error_message());
       }},
      {"report by unknown lease", absl::StatusCode::kNotFound, "lease_id",
       [&](Client&, auto& stub) {
         grpc::ClientContext ctx;
         v1::ReportAttentionRequest req;
         req.set_model_id("m");
         req.set_lease_id(7);
         req.add_attention(1);
         v1::ReportAttentionResponse resp;
         grpc::Status s = stub.ReportAttention(&ctx, req, &resp);
         return absl::Status(static_cast<absl::StatusCode>(s.error_code()), s.error_message());
       }},
      {"policy of an unknown model", absl::StatusCode::kNotFound, "not registered",
       [&](Client& c, auto&) { return policy(c, [](auto& r) { r.set_model_id("nope"); }); }},
      {"policy target mass above 1", absl::StatusCode::kInvalidArgument, "target_mass",
       [&](Client& c, auto&) { return policy(c, [](auto& r) { r.set_target_mass(1.5); }); }},
      {"policy with all weights 0", absl::StatusCode::kInvalidArgument, "all 0",
       [&](Client& c, auto&) {
         return policy(c, [](auto& r) {
           r.set_mode(v1::COMPRESSION_MODE_PRUNE);  // a valid part must not apply either
           r.mutable_weights();
         });
       }},
      {"policy weight far above 1", absl::StatusCode::kInvalidArgument, "weights.alpha is 1000",
       [&](Client& c, auto&) {
         return policy(c, [](auto& r) {
           r.set_mode(v1::COMPRESSION_MODE_PRUNE);  // a valid part must not apply either
           r.mutable_weights()->set_alpha(1000);
           r.mutable_weights()->set_beta(0.3f);
         });
       }},
      {"policy negative weight", absl::StatusCode::kInvalidArgument, "weights.beta is -0.1",
       [&](Client& c, auto&) {
         return policy(c, [](auto& r) {
           r.mutable_weights()->set_alpha(0.6f);
           r.mutable_weights()->set_beta(-0.1f);
         });
       }},
      {"policy NaN weight", absl::StatusCode::kInvalidArgument, "weights.gamma is nan",
       [&](Client& c, auto&) {
         return policy(c, [](auto& r) {
           r.mutable_weights()->set_alpha(0.6f);
           r.mutable_weights()->set_gamma(std::numeric_limits<float>::quiet_NaN());
         });
       }},
      {"unregister an unknown model", absl::StatusCode::kNotFound, "not registered",
       [&](Client& c, auto&) { return c.UnregisterModel("nope").status(); }},
      {"policy with an unknown mode", absl::StatusCode::kInvalidArgument, "CompressionMode",
       [&](Client& c, auto&) {
         return policy(c, [](auto& r) { r.set_mode(static_cast<v1::CompressionMode>(9)); });
       }},
      {"append protected range past the end", absl::StatusCode::kInvalidArgument, "protected range",
       [&](Client&, auto& stub) {
         v1::AppendHeader h = Header(fresh);
         v1::TokenRange* r = h.mutable_hints()->add_protected_ranges();
         r->set_begin(10);
         r->set_end(1000);
         return RawAppend(stub, h, {bytes(fresh_kv, 0, 2 * bb)});
       }},
      {"zero layers", absl::StatusCode::kInvalidArgument, "layout.num_layers",
       [&](Client& c, auto&) {
         return register_layout(c, with_layout([](auto& l) { l.set_num_layers(0); }));
       }},
      {"huge head_dim", absl::StatusCode::kInvalidArgument, "layout.head_dim",
       [&](Client& c, auto&) {
         return register_layout(c, with_layout([](auto& l) { l.set_head_dim(100000); }));
       }},
      {"no dtype", absl::StatusCode::kInvalidArgument, "layout.dtype",
       [&](Client& c, auto&) {
         return register_layout(c,
                                with_layout([](auto& l) { l.set_dtype(v1::DTYPE_UNSPECIFIED); }));
       }},
      {"block_tokens not a power of two", absl::StatusCode::kInvalidArgument, "power of two",
       [&](Client& c, auto&) {
         return register_layout(c, with_layout([](auto& l) { l.set_block_tokens(48); }));
       }},
      {"block_tokens too small", absl::StatusCode::kInvalidArgument, "layout.block_tokens",
       [&](Client& c, auto&) {
         return register_layout(c, with_layout([](auto& l) { l.set_block_tokens(8); }));
       }},
      {"same id, other layout", absl::StatusCode::kAlreadyExists, "another layout",
       [&](Client& c, auto&) {
         return register_layout(c, with_layout([](auto& l) { l.set_head_dim(64); }), "m");
       }},
      {"bad model id", absl::StatusCode::kInvalidArgument, "model_id",
       [&](Client& c, auto&) { return register_layout(c, GoodLayout(), "has space"); }},
      {"lookup unknown model", absl::StatusCode::kNotFound, "not registered",
       [&](Client& c, auto&) { return c.Lookup("nope", fresh).status(); }},
      {"fetch unknown model", absl::StatusCode::kNotFound, "not registered",
       [&](Client& c, auto&) {
         std::vector<std::byte> out(4096);
         return c.Fetch("nope", fresh, out).status();
       }},
      {"too many tokens", absl::StatusCode::kInvalidArgument, "max_tokens_per_request",
       [&](Client& c, auto&) { return c.Lookup("m", MakeTokens(3, 5000)).status(); }},
      {"lease ttl too long", absl::StatusCode::kInvalidArgument, "lease_ttl_ms",
       [&](Client& c, auto&) {
         return c.Lookup("m", cached_, {.acquire_lease = true, .lease_ttl = absl::Hours(100)})
             .status();
       }},
      {"append too few bytes", absl::StatusCode::kInvalidArgument, "expected",
       [&](Client&, auto& stub) {
         return RawAppend(stub, Header(fresh), {bytes(fresh_kv, 0, bb + 10)});
       }},
      {"append too many bytes", absl::StatusCode::kInvalidArgument, "exceed",
       [&](Client&, auto& stub) {
         return RawAppend(stub, Header(fresh), {bytes(fresh_kv, 0, 2 * bb), "extra"});
       }},
      {"append unaligned start", absl::StatusCode::kInvalidArgument, "multiple of block_tokens",
       [&](Client&, auto& stub) { return RawAppend(stub, Header(fresh, 5), {}); }},
      {"append start past end", absl::StatusCode::kInvalidArgument, "past the end",
       [&](Client&, auto& stub) { return RawAppend(stub, Header(fresh, 64), {}); }},
      {"append start beyond cached prefix", absl::StatusCode::kFailedPrecondition,
       "beyond the cached prefix",
       [&](Client&, auto& stub) {
         return RawAppend(stub, Header(fresh, 16), {bytes(fresh_kv, bb, bb)});
       }},
      {"append without header", absl::StatusCode::kInvalidArgument, "header",
       [&](Client&, auto& stub) {
         return RawAppend(stub, Header(fresh), {bytes(fresh_kv, 0, bb)}, false);
       }},
      {"append checksum mismatch", absl::StatusCode::kDataLoss, "block_checksums",
       [&](Client&, auto& stub) {
         v1::AppendHeader h = Header(fresh);
         h.clear_block_checksums();
         h.add_block_checksums(BlockChecksum(std::span(fresh_kv).first(bb)));
         h.add_block_checksums(12345);  // wrong for block 1
         return RawAppend(stub, h, {bytes(fresh_kv, 0, 2 * bb)});
       }},
      {"append checksum count", absl::StatusCode::kInvalidArgument, "block_checksums has 1",
       [&](Client&, auto& stub) {
         v1::AppendHeader h = Header(fresh);
         h.clear_block_checksums();
         h.add_block_checksums(1);
         return RawAppend(stub, h, {bytes(fresh_kv, 0, 2 * bb)});
       }},
      {"append without block checksums", absl::StatusCode::kInvalidArgument,
       "security.require_block_checksums",
       [&](Client&, auto& stub) {
         v1::AppendHeader h = Header(fresh);
         h.clear_block_checksums();
         return RawAppend(stub, h, {bytes(fresh_kv, 0, 2 * bb)});
       }},
      {"oversized message", absl::StatusCode::kResourceExhausted, "",
       [&](Client&, auto& stub) {
         return RawAppend(stub, Header(fresh), {std::string(2 << 20, 'x')});
       }},
      {"append with more protected ranges than allowed", absl::StatusCode::kInvalidArgument,
       "max_protected_ranges",
       [&](Client& c, auto&) {
         AppendOptions options;
         for (uint32_t i = 0; i < 65; ++i) {
           v1::TokenRange* r = options.hints.add_protected_ranges();
           r->set_begin(i % 30);
           r->set_end(i % 30 + 1);
         }
         return c.Append("m", fresh, fresh_kv, options).status();
       }},
      {"evict unaligned prefix", absl::StatusCode::kInvalidArgument, "multiple",
       [&](Client& c, auto&) { return c.EvictPrefix("m", std::span(cached_).first(20)).status(); }},
      {"evict unknown model", absl::StatusCode::kNotFound, "not registered",
       [&](Client& c, auto&) { return c.EvictModel("nope").status(); }},
      {"fetch unknown lease", absl::StatusCode::kNotFound, "lease_id",
       [&](Client& c, auto&) {
         std::vector<std::byte> out(4096);
         return c.FetchLease("m", 42, out).status();
       }},
      {"fetch tiny chunk size", absl::StatusCode::kInvalidArgument, "max_chunk_bytes",
       [&](Client&, auto& stub) {
         grpc::ClientContext ctx;
         v1::FetchRequest req;
         req.set_model_id("m");
         for (uint32_t t : cached_) req.add_tokens(t);
         req.set_max_chunk_bytes(100);
         auto reader = stub.Fetch(&ctx, req);
         v1::FetchResponse r;
         while (reader->Read(&r)) {
         }
         grpc::Status s = reader->Finish();
         return absl::Status(static_cast<absl::StatusCode>(s.error_code()), s.error_message());
       }},
      {"fetch lossy_as_stored without the lossy opt-in", absl::StatusCode::kInvalidArgument,
       "needs accept_lossy",
       [&](Client&, auto& stub) {
         grpc::ClientContext ctx;
         v1::FetchRequest req;
         req.set_model_id("m");
         for (uint32_t t : cached_) req.add_tokens(t);
         req.set_lossy_as_stored(true);
         auto reader = stub.Fetch(&ctx, req);
         v1::FetchResponse r;
         while (reader->Read(&r)) {
         }
         grpc::Status s = reader->Finish();
         return absl::Status(static_cast<absl::StatusCode>(s.error_code()), s.error_message());
       }},
      {"client FetchBlocks lossy_as_stored without the lossy opt-in",
       absl::StatusCode::kInvalidArgument, "accept_lossy",
       [&](Client& c, auto&) { return c.FetchBlocks("m", cached_, true).status(); }},
  };
  const std::string before = Snapshot();
  for (const BadCase& c : cases) {
    SCOPED_TRACE(c.name);
    absl::Status s = c.call(*client_, *stub_);
    EXPECT_EQ(s.code(), c.code) << s;
    EXPECT_THAT(std::string(s.message()), HasSubstr(c.message));
    EXPECT_EQ(Snapshot(), before) << "the cache changed";
  }
}

TEST_F(BadInputTest, LeasesPastTheCapAreRefused) {
  std::vector<uint64_t> leases;
  for (int i = 0; i < 4; ++i) {
    auto l = client_->Lookup("m", cached_, {.acquire_lease = true});
    ASSERT_TRUE(l.ok()) << l.status();
    leases.push_back(l->lease_id);
  }
  auto refused = client_->Lookup("m", cached_, {.acquire_lease = true});
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(std::string(refused.status().message()), HasSubstr("max_leases"));
  EXPECT_EQ(client_->GetStats()->active_leases(), 4u);
  ASSERT_TRUE(client_->ReleaseLease(leases[0]).ok());
  EXPECT_TRUE(client_->Lookup("m", cached_, {.acquire_lease = true}).ok());
}

// Same tokens, other bytes (with valid checksums): the append succeeds, says
// which blocks conflicted, and readers keep getting the bytes first stored.
TEST_F(BadInputTest, ConflictingAppendIsReportedAndTheCachedBytesKept) {
  const auto other = MakeKv(MakeTokens(77, 3 * kBlockTokens), kBlockTokens, block_bytes_, 0, 3);
  ASSERT_NE(other, MakeKv(cached_, kBlockTokens, block_bytes_, 0, 3));
  auto r = client_->Append("m", cached_, other);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->conflicting_blocks, 3u);
  EXPECT_EQ(r->first_conflicting_block, 0);
  EXPECT_EQ(r->stored_blocks, 0u);
  std::vector<std::byte> out(3 * block_bytes_);
  ASSERT_TRUE(client_->Fetch("m", cached_, out).ok());
  EXPECT_TRUE(out == MakeKv(cached_, kBlockTokens, block_bytes_, 0, 3));
  auto stats = client_->GetStats();
  ASSERT_TRUE(stats.ok());
  EXPECT_EQ(stats->conflicting_appends(), 1u);
  EXPECT_EQ(stats->models(0).conflicting_blocks(), 3u);
  // The same bytes again: no conflict.
  auto same = client_->Append("m", cached_, MakeKv(cached_, kBlockTokens, block_bytes_, 0, 3));
  ASSERT_TRUE(same.ok());
  EXPECT_EQ(same->conflicting_blocks, 0u);
  EXPECT_EQ(same->first_conflicting_block, -1);
}

TEST_F(BadInputTest, BrokenAppendStreamStoresNothing) {
  const std::string before = Snapshot();
  const auto fresh = MakeTokens(9, 4 * kBlockTokens);
  const auto kv = MakeKv(fresh, kBlockTokens, block_bytes_, 0, 4);
  {
    grpc::ClientContext ctx;
    v1::AppendResponse response;
    auto writer = stub_->Append(&ctx, &response);
    v1::AppendRequest msg;
    *msg.mutable_header() = Header(fresh);
    ASSERT_TRUE(writer->Write(msg));
    // Two whole blocks and a bit, then the worker dies.
    msg.set_kv_chunk(std::string(reinterpret_cast<const char*>(kv.data()), 2 * block_bytes_ + 7));
    ASSERT_TRUE(writer->Write(msg));
    ctx.TryCancel();
    EXPECT_FALSE(writer->Finish().ok());
  }
  // The server may still be unwinding the stream.
  absl::SleepFor(absl::Milliseconds(200));
  EXPECT_EQ(Snapshot(), before);
  EXPECT_EQ(client_->Lookup("m", fresh)->matched_tokens, 0u);
}

}  // namespace
}  // namespace kvcache::testing
