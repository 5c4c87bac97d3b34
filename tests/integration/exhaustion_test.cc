// Hostile load against the real daemon (docs/api.md, "Timeouts and limits";
// docs/security.md): floods of leases, oversized and malformed attention
// reports, more models than allowed, a reader that never reads, and floods of
// gRPC and shared-memory connections. Each must meet a documented limit, be
// answered with a status that names it, and leave the daemon serving with its
// memory within what its configuration allows.
//
// One daemon serves the whole suite, so the memory check at the end of each
// test (and the figures printed at the end) covers everything before it.
#include <dirent.h>
#include <gmock/gmock.h>
#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <cstdint>
#include <cstring>
#include <fstream>
#include <iostream>
#include <iterator>
#include <limits>
#include <memory>
#include <span>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/substitute.h"
#include "absl/time/clock.h"
#include "kvcache/shm_frame.h"
#include "kvcache/v1/admin.grpc.pb.h"
#include "kvcache/v1/kvcache.grpc.pb.h"
#include "kvcache/v1/shm.pb.h"
#include "tests/integration/daemon_process.h"
#include "tests/integration/kv_pattern.h"

namespace kvcache::testing {
namespace {

using ::testing::HasSubstr;

constexpr uint64_t kMiB = uint64_t{1} << 20;

// The daemon's configuration: every limit low, so each is cheap to reach.
constexpr uint64_t kCapacityBytes = 32 * kMiB;
constexpr uint64_t kMetadataBudget = kCapacityBytes / 8;  // metadata_fraction's default
constexpr uint64_t kGrpcQuotaBytes = 64 * kMiB;
constexpr uint64_t kMaxMessageBytes = 1 * kMiB;
constexpr uint32_t kMaxTokensPerRequest = 4096;
constexpr uint32_t kMaxLeases = 10000;
constexpr uint64_t kMaxLeaseTokens = 262144;  // 64 leases of kMaxTokensPerRequest
constexpr uint32_t kMaxModels = 16;
constexpr int kIdleTimeoutMs = 500;
constexpr uint32_t kShmMaxConnections = 8;

// Memory no setting bounds: malloc's per-thread arenas, the stacks of gRPC's
// threads and of one thread per shared-memory connection, and the per-call
// heap of the calls in flight (docs/architecture.md, "Memory outside the
// tier"). Messages are at most 1 MiB and a few hundred calls are in flight
// here, so 32 MiB is ample. What the daemon held before any traffic (code,
// libraries, its first threads) is measured and added separately.
constexpr uint64_t kUnboundedSlack = 32 * kMiB;

std::string ConfigJson() {
  return absl::Substitute(R"({
  "limits": {"max_leases": $0, "max_lease_tokens": $1, "max_tokens_per_request": $2,
             "max_lease_ttl_ms": 600000, "max_message_bytes": $3, "fetch_chunk_bytes": 262144,
             "max_models": $4, "stream_idle_timeout_ms": $5, "max_concurrent_streams": 1,
             "grpc_memory_quota_bytes": $6},
  "host_tier": {"append_staging_fraction": 0},
  "shm": {"max_connections": $7}})",
                          kMaxLeases, kMaxLeaseTokens, kMaxTokensPerRequest, kMaxMessageBytes,
                          kMaxModels, kIdleTimeoutMs, kGrpcQuotaBytes, kShmMaxConnections);
}

absl::Status ToAbsl(const grpc::Status& s) {
  return absl::Status(static_cast<absl::StatusCode>(s.error_code()), s.error_message());
}

// A field of /proc/PID/status ("VmRSS", "VmHWM", ...) in bytes; 0 when absent.
uint64_t ProcStatusBytes(pid_t pid, const std::string& field) {
  std::ifstream in(absl::StrCat("/proc/", pid, "/status"));
  for (std::string line; std::getline(in, line);) {
    if (line.rfind(field + ":", 0) == 0) {
      return std::stoull(line.substr(field.size() + 1)) * 1024;  // the kernel writes kB
    }
  }
  return 0;
}

// Sockets the process holds open (its gRPC and shared-memory connections,
// listeners included).
int SocketsOf(pid_t pid) {
  const std::string dir = absl::StrCat("/proc/", pid, "/fd");
  DIR* d = ::opendir(dir.c_str());
  if (d == nullptr) return -1;
  int n = 0;
  char target[256];
  while (dirent* e = ::readdir(d)) {
    const ssize_t len = ::readlink((dir + "/" + e->d_name).c_str(), target, sizeof(target) - 1);
    if (len > 0 && std::string_view(target, len).starts_with("socket:")) ++n;
  }
  ::closedir(d);
  return n;
}

// CPU time the process has used, user and system (/proc/PID/stat).
absl::Duration CpuTimeOf(pid_t pid) {
  std::ifstream in(absl::StrCat("/proc/", pid, "/stat"));
  std::string stat((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  std::istringstream fields(stat.substr(stat.rfind(')') + 2));  // after the command's name
  std::string field;
  uint64_t utime = 0, stime = 0;
  for (int i = 3; i <= 15 && fields >> field; ++i) {  // fields 14 and 15, in clock ticks
    if (i == 14) utime = std::stoull(field);
    if (i == 15) stime = std::stoull(field);
  }
  return absl::Seconds(static_cast<double>(utime + stime) / ::sysconf(_SC_CLK_TCK));
}

std::string MiB(uint64_t bytes) { return absl::StrCat(bytes / kMiB, " MiB"); }

// A channel with a connection of its own that sends and accepts messages far
// larger than the daemon's limit, so the daemon is the one to refuse them.
std::shared_ptr<grpc::Channel> OwnChannel(const std::string& target) {
  grpc::ChannelArguments args;
  args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);
  args.SetMaxSendMessageSize(64 << 20);
  args.SetMaxReceiveMessageSize(64 << 20);
  return grpc::CreateCustomChannel(target, grpc::InsecureChannelCredentials(), args);
}

// An Append that sends nothing: a cheap probe for a free stream slot.
// RESOURCE_EXHAUSTED without one; INVALID_ARGUMENT (nothing to store) with one.
absl::Status ProbeStream(v1::Cache::Stub& stub) {
  grpc::ClientContext ctx;
  v1::AppendResponse response;
  auto probe = stub.Append(&ctx, &response);
  probe->WritesDone();
  return ToAbsl(probe->Finish());
}

// A raw connection to the shared-memory socket; reads give up after 10 s.
class RawShmConnection {
 public:
  explicit RawShmConnection(const std::string& path) {
    fd_ = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    timeval timeout{.tv_sec = 10, .tv_usec = 0};
    ::setsockopt(fd_, SOL_SOCKET, SO_RCVTIMEO, &timeout, sizeof(timeout));
    sockaddr_un addr{};
    addr.sun_family = AF_UNIX;
    std::memcpy(addr.sun_path, path.data(), std::min(path.size(), sizeof(addr.sun_path) - 1));
    connected_ = ::connect(fd_, reinterpret_cast<const sockaddr*>(&addr), sizeof(addr)) == 0;
  }
  ~RawShmConnection() { ::close(fd_); }
  bool connected() const { return connected_; }
  // Says hello; the daemon's answer, or code -1 and why there was none.
  v1::ShmResponse Hello() {
    v1::ShmRequest hello;
    hello.mutable_hello()->set_version(v1::SHM_VERSION_1);
    (void)shm::WriteFrame(fd_, hello);  // a refused connection may be closed already
    std::string body;
    std::vector<int> fds;
    v1::ShmResponse response;
    if (absl::Status s = shm::ReadFrame(fd_, 1 << 20, &body, &fds); !s.ok()) {
      response.set_code(-1);
      response.set_message(std::string(s.message()));
    } else if (!response.ParseFromString(body)) {
      response.set_code(-1);
      response.set_message("not an ShmResponse");
    }
    for (int fd : fds) ::close(fd);
    return response;
  }

 private:
  int fd_ = -1;
  bool connected_ = false;
};

class ExhaustionTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    const std::string config = ::testing::TempDir() + "/exhaustion.json";
    std::ofstream(config) << ConfigJson();
    auto d = DaemonProcess::Start(
        {.capacity_bytes = kCapacityBytes, .extra_flags = {"--config", config}});
    if (!d.ok()) {
      start_error_ = new std::string(d.status().ToString());
      return;
    }
    daemon_ = d->release();
    rss_at_start_ = ProcStatusBytes(daemon_->pid(), "VmRSS");
  }

  static void TearDownTestSuite() {
    if (daemon_ == nullptr) return;
    const pid_t pid = daemon_->pid();
    std::cout << "[ exhaustion ] daemon VmRSS at start " << MiB(rss_at_start_) << ", at the end "
              << MiB(ProcStatusBytes(pid, "VmRSS")) << ", peak (VmHWM) "
              << MiB(ProcStatusBytes(pid, "VmHWM")) << "; bound " << MiB(RssBound())
              << " = start + host tier " << MiB(kCapacityBytes) << " + metadata "
              << MiB(kMetadataBudget) << " + gRPC quota " << MiB(kGrpcQuotaBytes) << " + slack "
              << MiB(kUnboundedSlack) << std::endl;
    EXPECT_EQ(daemon_->Stop(), 0) << "log: " << daemon_->log_path();
    delete daemon_;
    daemon_ = nullptr;
  }

  // What the configuration lets the daemon hold (docs/configuration.md, under
  // the fields): the host tier, the metadata budget and gRPC's memory quota,
  // on top of what it held before any traffic, plus kUnboundedSlack.
  static uint64_t RssBound() {
    return rss_at_start_ + kCapacityBytes + kMetadataBudget + kGrpcQuotaBytes + kUnboundedSlack;
  }

  void SetUp() override {
    ASSERT_NE(daemon_, nullptr) << (start_error_ != nullptr ? *start_error_ : "");
    cache_ = v1::Cache::NewStub(OwnChannel(daemon_->unix_target()));
  }

  // After every flood: the daemon runs, answers a normal client, and its
  // memory (now and at its peak) is within the bound.
  void TearDown() override {
    if (daemon_ == nullptr) return;
    ASSERT_TRUE(daemon_->Running()) << "the daemon died; log: " << daemon_->log_path();
    auto info = Connect(DataPath::kGrpc)->GetServerInfo();
    EXPECT_TRUE(info.ok()) << info.status();
    const uint64_t rss = ProcStatusBytes(daemon_->pid(), "VmRSS");
    const uint64_t peak = ProcStatusBytes(daemon_->pid(), "VmHWM");
    std::cout << "[ exhaustion ] after "
              << ::testing::UnitTest::GetInstance()->current_test_info()->name() << ": VmRSS "
              << MiB(rss) << ", VmHWM " << MiB(peak) << ", bound " << MiB(RssBound()) << std::endl;
    EXPECT_GT(rss, 0u);
    EXPECT_LE(rss, RssBound());
    EXPECT_LE(peak, RssBound());
  }

  // A client that knows the daemon's message limit.
  static std::unique_ptr<Client> Connect(DataPath path, const std::string& ns = "") {
    ClientOptions options;
    options.target = daemon_->unix_target();
    options.ns = ns;
    options.data_path = path;
    options.max_message_bytes = kMaxMessageBytes;
    options.shm_staging_bytes = 4 * kMiB;
    auto client = Client::Connect(options);
    EXPECT_TRUE(client.ok()) << client.status();
    return client.ok() ? *std::move(client) : nullptr;
  }

  static DaemonProcess* daemon_;
  static std::string* start_error_;
  static uint64_t rss_at_start_;
  std::unique_ptr<v1::Cache::Stub> cache_;  // raw calls, for what the client would not send
};

DaemonProcess* ExhaustionTest::daemon_ = nullptr;
std::string* ExhaustionTest::start_error_ = nullptr;
uint64_t ExhaustionTest::rss_at_start_ = 0;

// Tallies leasing lookups: the leases granted, the refusals and their last
// message, and anything else (a failure).
struct LeaseTally {
  std::vector<uint64_t> leases;
  uint64_t refused = 0;
  std::string refusal;

  void Add(const absl::StatusOr<LookupResult>& r, uint64_t want_tokens) {
    if (r.ok()) {
      EXPECT_EQ(r->matched_tokens, want_tokens);
      EXPECT_NE(r->lease_id, 0u);
      leases.push_back(r->lease_id);
    } else if (r.status().code() == absl::StatusCode::kResourceExhausted) {
      ++refused;
      refusal = std::string(r.status().message());
    } else {
      ADD_FAILURE() << "a leasing lookup failed otherwise: " << r.status();
    }
  }
};

TEST_F(ExhaustionTest, LeasesStopAtMaxLeasesAndMaxLeaseTokens) {
  auto client = Connect(TestDataPath());
  // 64-byte blocks of 16 tokens: the KV is tiny, the leases are what count.
  const v1::ModelLayout layout = MakeLayout(1, 1, 1, v1::DTYPE_FP16, 16);
  auto reg = client->RegisterModel("leases", layout);
  ASSERT_TRUE(reg.ok()) << reg.status();
  const auto one_block = MakeTokens(1, 16);
  ASSERT_TRUE(
      client->Append("leases", one_block, MakeKv(one_block, 16, reg->block_bytes(), 0, 1)).ok());
  const LookupOptions lease{.acquire_lease = true, .lease_ttl = absl::Minutes(10)};
  const std::vector<std::span<const uint32_t>> batch(4096, one_block);  // the most one batch takes

  // A client leasing as fast as it can, 4096 leasing lookups a call: a
  // million of them. It gets max_leases and never one more.
  constexpr int kCalls = 245;
  LeaseTally tally;
  for (int call = 0; call < kCalls; ++call) {
    auto looked = client->BatchLookup("leases", batch, lease);
    ASSERT_TRUE(looked.ok()) << looked.status();
    ASSERT_EQ(looked->size(), batch.size());
    for (const auto& r : *looked) tally.Add(r, 16);
  }
  EXPECT_EQ(tally.leases.size(), kMaxLeases);
  EXPECT_EQ(tally.refused, kCalls * batch.size() - kMaxLeases);
  EXPECT_THAT(tally.refusal, HasSubstr(absl::StrCat("max_leases (", kMaxLeases, ")")));
  auto stats = client->GetStats();
  ASSERT_TRUE(stats.ok()) << stats.status();
  EXPECT_EQ(stats->active_leases(), kMaxLeases);
  EXPECT_EQ(stats->lease_tokens(), uint64_t{kMaxLeases} * 16);

  // Releasing some lets exactly as many new ones through.
  for (int i = 0; i < 100; ++i) {
    auto released = client->ReleaseLease(tally.leases[i]);
    ASSERT_TRUE(released.ok()) << released.status();
    EXPECT_TRUE(*released);
  }
  LeaseTally after;
  auto looked = client->BatchLookup("leases", std::span(batch).first(200), lease);
  ASSERT_TRUE(looked.ok()) << looked.status();
  for (const auto& r : *looked) after.Add(r, 16);
  EXPECT_EQ(after.leases.size(), 100u);
  EXPECT_EQ(after.refused, 100u);

  // Unregistering the model ends its leases.
  ASSERT_TRUE(client->UnregisterModel("leases").ok());
  stats = client->GetStats();
  ASSERT_TRUE(stats.ok()) << stats.status();
  EXPECT_EQ(stats->active_leases(), 0u);
  EXPECT_EQ(stats->lease_tokens(), 0u);

  // Long leases meet max_lease_tokens first: 64 of 4096 tokens.
  reg = client->RegisterModel("long", layout);
  ASSERT_TRUE(reg.ok()) << reg.status();
  const auto longest = MakeTokens(2, kMaxTokensPerRequest);
  ASSERT_TRUE(
      client
          ->Append("long", longest, MakeKv(longest, 16, reg->block_bytes(), 0, longest.size() / 16))
          .ok());
  LeaseTally long_leases;
  for (int i = 0; i < 80; ++i) long_leases.Add(client->Lookup("long", longest, lease), 4096);
  EXPECT_EQ(long_leases.leases.size(), kMaxLeaseTokens / kMaxTokensPerRequest);
  EXPECT_EQ(long_leases.refused, 80 - kMaxLeaseTokens / kMaxTokensPerRequest);
  EXPECT_THAT(long_leases.refusal,
              HasSubstr(absl::StrCat("max_lease_tokens (", kMaxLeaseTokens, ")")));
  stats = client->GetStats();
  ASSERT_TRUE(stats.ok()) << stats.status();
  EXPECT_EQ(stats->lease_tokens(), kMaxLeaseTokens);
  ASSERT_FALSE(long_leases.leases.empty());
  ASSERT_TRUE(client->ReleaseLease(long_leases.leases.back()).ok());
  auto again = client->Lookup("long", longest, lease);
  EXPECT_TRUE(again.ok()) << again.status();
  ASSERT_TRUE(client->UnregisterModel("long").ok());
}

TEST_F(ExhaustionTest, HugeAndMalformedAttentionReportsAreRefusedAndChangeNothing) {
  auto client = Connect(TestDataPath());
  auto reg = client->RegisterModel("attn", MakeLayout(2, 2, 32, v1::DTYPE_FP16, 16));
  ASSERT_TRUE(reg.ok()) << reg.status();
  const auto tokens = MakeTokens(3, 64);
  ASSERT_TRUE(client->Append("attn", tokens, MakeKv(tokens, 16, reg->block_bytes(), 0, 4)).ok());
  v1::InspectSequenceRequest inspect;
  inspect.set_model_id("attn");
  inspect.mutable_tokens()->Add(tokens.begin(), tokens.end());
  auto before = client->InspectSequence(inspect);
  ASSERT_TRUE(before.ok()) << before.status();
  ASSERT_EQ(before->matched_tokens(), tokens.size());

  auto report = [&](size_t values, uint32_t num_layers, size_t n_tokens = 64) {
    v1::ReportAttentionRequest request;
    request.set_model_id("attn");
    for (size_t i = 0; i < n_tokens; ++i) request.add_tokens(tokens[i % tokens.size()]);
    request.mutable_attention()->Resize(static_cast<int>(values), 0.5f);
    request.set_num_layers(num_layers);
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(30));
    v1::ReportAttentionResponse response;
    return ToAbsl(cache_->ReportAttention(&ctx, request, &response));
  };
  struct Case {
    std::string name;
    absl::StatusCode code;
    std::string message;
    absl::Status status;
  };
  const uint32_t absurd = std::numeric_limits<uint32_t>::max();
  const Case cases[] = {
      {"a report of 4 MiB, past max_message_bytes (1 MiB)", absl::StatusCode::kResourceExhausted,
       "larger than max", report(kMaxMessageBytes, 2)},
      {"a report just past max_message_bytes", absl::StatusCode::kResourceExhausted,
       "larger than max", report(kMaxMessageBytes / 4 + 16, 1)},
      {"more tokens than max_tokens_per_request", absl::StatusCode::kInvalidArgument,
       "max_tokens_per_request", report(kMaxTokensPerRequest + 1, 1, kMaxTokensPerRequest + 1)},
      {"num_layers 2^32-1 with one row", absl::StatusCode::kInvalidArgument,
       absl::StrCat("num_layers (", absurd, ")"), report(64, absurd)},
      {"rows that do not divide", absl::StatusCode::kInvalidArgument, "attention has 128 values",
       report(128, 3)},
      {"per-head rows one short", absl::StatusCode::kInvalidArgument, "num_kv_heads (2)",
       report(2 * 2 * 64 - 1, 2)},
  };
  for (const Case& c : cases) {
    EXPECT_EQ(c.status.code(), c.code) << c.name << ": " << c.status;
    EXPECT_THAT(std::string(c.status.message()), HasSubstr(c.message)) << c.name;
  }

  // A report of no values costs no more than its size, however many rows it
  // claims (it was averaged row by row first: seconds of CPU per call).
  const absl::Duration cpu_before = CpuTimeOf(daemon_->pid());
  for (int i = 0; i < 2; ++i) {
    EXPECT_EQ(report(0, absurd).code(), absl::StatusCode::kInvalidArgument);
  }
  const absl::Duration cpu = CpuTimeOf(daemon_->pid()) - cpu_before;
  EXPECT_LT(cpu, absl::Milliseconds(500)) << "two empty reports of 2^32-1 rows took " << cpu;

  // Nothing changed: no report counted, no activity moved.
  auto after = client->InspectSequence(inspect);
  ASSERT_TRUE(after.ok()) << after.status();
  EXPECT_EQ(after->attention_reports(), before->attention_reports());
  EXPECT_THAT(after->activity(), ::testing::ElementsAreArray(before->activity()));
  // A good report does change them (so the check above could see a change).
  ASSERT_TRUE(report(2 * 64, 2).ok());
  after = client->InspectSequence(inspect);
  ASSERT_TRUE(after.ok()) << after.status();
  EXPECT_EQ(after->attention_reports(), before->attention_reports() + 1);
  ASSERT_TRUE(client->UnregisterModel("attn").ok());
}

TEST_F(ExhaustionTest, ModelsPastMaxModelsAreRefusedInAnyNamespace) {
  auto admin = Connect(DataPath::kGrpc);
  auto listed = admin->ListModels("");
  ASSERT_TRUE(listed.ok()) << listed.status();
  const int already = listed->models_size();
  ASSERT_LT(already, static_cast<int>(kMaxModels) - 2) << "earlier tests left models behind";
  const v1::ModelLayout layout = MakeLayout(1, 1, 64, v1::DTYPE_FP16, 16);
  auto register_model = [&](const std::string& ns, const std::string& id) {
    v1::RegisterModelRequest request;
    request.set_namespace_(ns);
    request.set_model_id(id);
    *request.mutable_layout() = layout;
    v1::RegisterModelResponse response;
    grpc::ClientContext ctx;
    return ToAbsl(cache_->RegisterModel(&ctx, request, &response));
  };
  // Half in the default namespace, half each in a namespace of its own: they
  // all count against the one limit.
  std::vector<std::pair<std::string, std::string>> registered;
  for (int i = already; i < static_cast<int>(kMaxModels); ++i) {
    const std::string ns = i % 2 == 0 ? "" : absl::StrCat("tenant-", i);
    const std::string id = absl::StrCat("model-", i);
    absl::Status s = register_model(ns, id);
    ASSERT_TRUE(s.ok()) << ns << "/" << id << ": " << s;
    registered.emplace_back(ns, id);
  }
  for (const std::string ns : {"", "tenant-new", "another-tenant"}) {
    absl::Status s = register_model(ns, "one-too-many");
    EXPECT_EQ(s.code(), absl::StatusCode::kResourceExhausted) << ns << ": " << s;
    EXPECT_THAT(std::string(s.message()), HasSubstr(absl::StrCat("max_models (", kMaxModels, ")")));
  }
  // Registering one that exists (same layout) takes nothing new and is fine.
  EXPECT_TRUE(register_model(registered.back().first, registered.back().second).ok());
  listed = admin->ListModels("");
  ASSERT_TRUE(listed.ok()) << listed.status();
  EXPECT_EQ(listed->models_size(), static_cast<int>(kMaxModels));

  // Unregistering one makes room for exactly one.
  v1::UnregisterModelRequest unregister;
  auto admin_stub = v1::Admin::NewStub(OwnChannel(daemon_->unix_target()));
  auto drop = [&](const std::string& ns, const std::string& id) {
    unregister.set_namespace_(ns);
    unregister.set_model_id(id);
    v1::UnregisterModelResponse response;
    grpc::ClientContext ctx;
    return ToAbsl(admin_stub->UnregisterModel(&ctx, unregister, &response));
  };
  ASSERT_TRUE(drop(registered.back().first, registered.back().second).ok());
  registered.pop_back();
  EXPECT_TRUE(register_model("tenant-new", "one-too-many").ok());
  registered.emplace_back("tenant-new", "one-too-many");
  EXPECT_EQ(register_model("", "two-too-many").code(), absl::StatusCode::kResourceExhausted);
  for (const auto& [ns, id] : registered) EXPECT_TRUE(drop(ns, id).ok()) << ns << "/" << id;
}

TEST_F(ExhaustionTest, AFetchNeverReadIsCutOffAndGivesBackItsSlotAndBlocks) {
  auto client = Connect(DataPath::kGrpc);
  auto reg = client->RegisterModel("fetch", MakeLayout(8, 2, 128, v1::DTYPE_FP16, 16));
  ASSERT_TRUE(reg.ok()) << reg.status();
  const uint64_t bb = reg->block_bytes();  // 128 KiB
  auto stats = client->GetStats();
  ASSERT_TRUE(stats.ok()) << stats.status();
  const v1::TierStats* host = FindTier(*stats, "host");
  ASSERT_NE(host, nullptr);
  ASSERT_EQ(host->used_bytes(), 0u) << "earlier tests left blocks behind";
  const size_t blocks = host->capacity_bytes() / bb;

  // A prefix that fills the tier, and a fetch of it that nobody reads: it
  // reads ahead at most 64 KiB, far less than one 256 KiB chunk.
  const auto filling = MakeTokens(4, blocks * 16);
  auto appended = client->Append("fetch", filling, MakeKv(filling, 16, bb, 0, blocks));
  ASSERT_TRUE(appended.ok()) << appended.status();
  ASSERT_EQ(appended->stored_blocks, blocks);
  grpc::ChannelArguments args;
  args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);
  args.SetInt(GRPC_ARG_HTTP2_BDP_PROBE, 0);
  args.SetInt(GRPC_ARG_HTTP2_STREAM_LOOKAHEAD_BYTES, 64 << 10);
  args.SetMaxReceiveMessageSize(64 << 20);
  auto stalled_stub = v1::Cache::NewStub(
      grpc::CreateCustomChannel(daemon_->unix_target(), grpc::InsecureChannelCredentials(), args));
  grpc::ClientContext stalled_ctx;
  v1::FetchRequest request;
  request.set_model_id("fetch");
  request.mutable_tokens()->Add(filling.begin(), filling.end());
  auto stalled = stalled_stub->Fetch(&stalled_ctx, request);

  // It holds the only stream slot (max_concurrent_streams 1)...
  absl::Status probe;
  for (int attempt = 0; attempt < 100; ++attempt) {
    probe = ProbeStream(*cache_);
    if (probe.code() == absl::StatusCode::kResourceExhausted) break;
    absl::SleepFor(absl::Milliseconds(20));
  }
  EXPECT_EQ(probe.code(), absl::StatusCode::kResourceExhausted) << probe;
  EXPECT_THAT(std::string(probe.message()), HasSubstr("max_concurrent_streams (1)"));
  // ...until the idle timeout cancels it and gives the slot back.
  for (int attempt = 0; attempt < 200; ++attempt) {  // 20 s
    probe = ProbeStream(*cache_);
    if (probe.code() != absl::StatusCode::kResourceExhausted) break;
    absl::SleepFor(absl::Milliseconds(100));
  }
  EXPECT_EQ(probe.code(), absl::StatusCode::kInvalidArgument) << probe;

  // The reader then finds what was in flight and a status naming the setting.
  v1::FetchResponse msg;
  uint64_t received = 0;
  while (stalled->Read(&msg)) received += msg.data().size();
  const absl::Status cut = ToAbsl(stalled->Finish());
  EXPECT_EQ(cut.code(), absl::StatusCode::kDeadlineExceeded) << cut;
  EXPECT_THAT(std::string(cut.message()),
              HasSubstr(absl::StrCat("stream_idle_timeout_ms (", kIdleTimeoutMs, " ms)")));
  EXPECT_LT(received, blocks * bb);

  // Its blocks are free: another prefix as large as the tier evicts every one.
  const auto next = MakeTokens(5, blocks * 16);
  appended = client->Append("fetch", next, MakeKv(next, 16, bb, 0, blocks));
  ASSERT_TRUE(appended.ok()) << appended.status();
  EXPECT_EQ(appended->stored_blocks, blocks);
  EXPECT_EQ(FetchVerified(*client, "fetch", next, 16, bb, blocks, "the next prefix"), blocks);
  ASSERT_TRUE(client->UnregisterModel("fetch").ok());
}

TEST_F(ExhaustionTest, FloodsOfConnectionsAreServedOrRefusedWhileOthersAreServed) {
  auto grpc_client = Connect(DataPath::kGrpc);
  auto shm_client = Connect(DataPath::kSharedMemory);
  ASSERT_TRUE(shm_client->UsesSharedMemory());
  auto reg = grpc_client->RegisterModel("flood", MakeLayout(2, 2, 32, v1::DTYPE_FP16, 16));
  ASSERT_TRUE(reg.ok()) << reg.status();
  const uint64_t bb = reg->block_bytes();
  const auto tokens = MakeTokens(6, 4 * 16);
  ASSERT_TRUE(grpc_client->Append("flood", tokens, MakeKv(tokens, 16, bb, 0, 4)).ok());
  // The normal clients' work: every byte checked, on both data paths.
  auto serve_normal_clients = [&](const std::string& when) {
    EXPECT_EQ(FetchVerified(*grpc_client, "flood", tokens, 16, bb, 4, "gRPC " + when), 4u);
    EXPECT_EQ(FetchVerified(*shm_client, "flood", tokens, 16, bb, 4, "shm " + when), 4u);
  };
  serve_normal_clients("before the floods");
  const pid_t pid = daemon_->pid();
  const int sockets_before = SocketsOf(pid);

  // 300 gRPC connections at once, each asking for the server's info.
  constexpr int kConnections = 300;
  struct Caller {
    std::unique_ptr<v1::Admin::Stub> stub;
    grpc::ClientContext ctx;
    v1::GetServerInfoResponse response;
    grpc::Status status;
    std::unique_ptr<grpc::ClientAsyncResponseReader<v1::GetServerInfoResponse>> call;
  };
  grpc::CompletionQueue cq;
  std::vector<std::unique_ptr<Caller>> callers;
  for (int i = 0; i < kConnections; ++i) {
    auto c = std::make_unique<Caller>();
    c->stub = v1::Admin::NewStub(OwnChannel(daemon_->unix_target()));
    c->ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(30));
    c->call = c->stub->AsyncGetServerInfo(&c->ctx, v1::GetServerInfoRequest(), &cq);
    c->call->Finish(&c->response, &c->status, c.get());
    callers.push_back(std::move(c));
  }
  serve_normal_clients("during the gRPC flood");
  int answered = 0;
  for (int i = 0; i < kConnections; ++i) {
    void* tag;
    bool ok;
    ASSERT_TRUE(cq.Next(&tag, &ok));
    auto* c = static_cast<Caller*>(tag);
    EXPECT_TRUE(c->status.ok()) << ToAbsl(c->status);
    if (c->status.ok() && !c->response.version().empty()) ++answered;
  }
  EXPECT_EQ(answered, kConnections);
  // They were open at once (each caller keeps its connection).
  const int sockets_during = SocketsOf(pid);
  EXPECT_GE(sockets_during, sockets_before + kConnections);
  serve_normal_clients("with 300 connections open");

  // Shared-memory connections past shm.max_connections: refused at once,
  // with the setting named; the normal shared-memory client keeps its own.
  const std::string shm_path = daemon_->socket_path() + ".shm";
  std::vector<std::unique_ptr<RawShmConnection>> held;
  int refused = 0;
  std::string refusal;
  for (uint32_t i = 0; i < kShmMaxConnections + 4; ++i) {
    auto raw = std::make_unique<RawShmConnection>(shm_path);
    ASSERT_TRUE(raw->connected()) << "connection " << i;
    const v1::ShmResponse r = raw->Hello();
    if (r.code() == 0) {
      EXPECT_EQ(refused, 0) << "a connection was accepted after one was refused";
      held.push_back(std::move(raw));
    } else {
      EXPECT_EQ(r.code(), static_cast<int>(absl::StatusCode::kResourceExhausted)) << r.message();
      ++refused;
      refusal = r.message();
    }
  }
  EXPECT_GE(held.size(), 1u);
  EXPECT_LE(held.size(), kShmMaxConnections - 1);  // the normal client holds one
  EXPECT_GE(refused, 5);
  EXPECT_THAT(refusal, HasSubstr("shm.max_connections"));
  std::cout << "[ exhaustion ] shared-memory socket: " << held.size()
            << " raw connections served besides the client's, " << refused
            << " refused: " << refusal << std::endl;
  serve_normal_clients("with the shared-memory socket full");
  // One closed, a new one is served.
  held.pop_back();
  v1::ShmResponse hello;
  for (int attempt = 0; attempt < 100; ++attempt) {  // until the daemon has seen the close
    RawShmConnection raw(shm_path);
    hello = raw.Hello();
    if (hello.code() == 0) break;
    absl::SleepFor(absl::Milliseconds(100));
  }
  EXPECT_EQ(hello.code(), 0) << hello.message();

  // Everything closed, the daemon lets go of the connections.
  held.clear();
  callers.clear();
  int sockets_after = SocketsOf(pid);
  for (int attempt = 0; attempt < 100 && sockets_after > sockets_before + 4; ++attempt) {
    absl::SleepFor(absl::Milliseconds(100));
    sockets_after = SocketsOf(pid);
  }
  EXPECT_LE(sockets_after, sockets_before + 4)
      << "before " << sockets_before << ", during " << sockets_during;
  serve_normal_clients("after the floods");
  ASSERT_TRUE(grpc_client->UnregisterModel("flood").ok());
}

}  // namespace
}  // namespace kvcache::testing
