// Stalled and greedy clients against the real daemon: the stream idle
// timeout, what a slow Fetch reader pins, the per-client stream cap, the
// unary-call limit and keepalive cutting off a peer that stopped answering.
#include <gmock/gmock.h>
#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <array>
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <latch>
#include <mutex>
#include <thread>

#include "absl/strings/str_cat.h"
#include "kvcache/v1/admin.grpc.pb.h"
#include "kvcache/v1/kvcache.grpc.pb.h"
#include "tests/integration/daemon_process.h"
#include "tests/integration/kv_pattern.h"

namespace kvcache::testing {
namespace {

using ::testing::HasSubstr;

std::string WriteConfig(const std::string& name, const std::string& json) {
  const std::string path = ::testing::TempDir() + "/" + name;
  std::ofstream(path) << json;
  return path;
}

absl::Status ToAbsl(const grpc::Status& s) {
  return absl::Status(static_cast<absl::StatusCode>(s.error_code()), s.error_message());
}

std::shared_ptr<grpc::Channel> NewChannel(const std::string& target) {
  grpc::ChannelArguments args;
  args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);  // a connection of its own
  args.SetMaxReceiveMessageSize(64 << 20);
  return grpc::CreateCustomChannel(target, grpc::InsecureChannelCredentials(), args);
}

// The header of an append of `tokens`' whole blocks of the tests' layout
// (1 layer, 1 head, 64 dims, FP16, 16 tokens: 4 KiB blocks), with the
// checksums of the KV MakeKv gives them.
v1::AppendRequest Header(const std::string& model, const std::vector<uint32_t>& tokens) {
  constexpr uint64_t kBlockBytes = 4096;
  v1::AppendRequest msg;
  msg.mutable_header()->set_model_id(model);
  for (uint32_t t : tokens) msg.mutable_header()->add_tokens(t);
  for (uint64_t sum :
       BlockChecksums(MakeKv(tokens, 16, kBlockBytes, 0, tokens.size() / 16), kBlockBytes)) {
    msg.mutable_header()->add_block_checksums(sum);
  }
  return msg;
}

// An Append that sends its header and then nothing.
struct StalledAppend {
  grpc::ClientContext ctx;
  v1::AppendResponse response;
  std::unique_ptr<grpc::ClientWriter<v1::AppendRequest>> writer;
};

std::unique_ptr<StalledAppend> StallAppend(v1::Cache::Stub& stub, const v1::AppendRequest& header) {
  auto s = std::make_unique<StalledAppend>();
  s->writer = stub.Append(&s->ctx, &s->response);
  s->writer->Write(header);
  return s;
}

// An Append that sends only a header: a cheap probe for a free stream slot.
// RESOURCE_EXHAUSTED without one; INVALID_ARGUMENT (nothing to store) with one.
absl::Status ProbeStream(v1::Cache::Stub& stub) {
  grpc::ClientContext ctx;
  v1::AppendResponse response;
  auto probe = stub.Append(&ctx, &response);
  probe->WritesDone();
  return ToAbsl(probe->Finish());
}

std::string Scrape(int port) {
  std::string text;
  std::FILE* pipe =
      ::popen(absl::StrCat("curl -sf http://127.0.0.1:", port, "/metrics").c_str(), "r");
  std::array<char, 4096> buf;
  size_t n;
  while ((n = std::fread(buf.data(), 1, buf.size(), pipe)) > 0) text.append(buf.data(), n);
  ::pclose(pipe);
  return text;
}

TEST(StreamLimitsTest, StalledAppendsAreCutOffAndFreeTheirSlots) {
  auto daemon = DaemonProcess::Start(
      {.metrics = true,
       .extra_flags = {"--config",
                       WriteConfig("idle.json", R"({"limits": {"max_concurrent_streams": 4,
                                                                "stream_idle_timeout_ms": 1000}})")}});
  ASSERT_TRUE(daemon.ok()) << daemon.status();
  auto client = (*daemon)->NewClient();
  const v1::ModelLayout layout = MakeLayout(1, 1, 64, v1::DTYPE_FP16, 16);
  auto reg = client->RegisterModel("m", layout);
  ASSERT_TRUE(reg.ok()) << reg.status();
  ASSERT_EQ(reg->block_bytes(), 4096u);  // what Header's checksums assume
  const auto tokens = MakeTokens(1, 32);
  const auto kv = MakeKv(tokens, 16, reg->block_bytes(), 0, 2);

  // Four appends that send a header and then stall hold every slot.
  auto stub = v1::Cache::NewStub(NewChannel((*daemon)->unix_target()));
  std::vector<std::unique_ptr<StalledAppend>> stalled;
  for (int i = 0; i < 4; ++i) stalled.push_back(StallAppend(*stub, Header("m", tokens)));
  absl::SleepFor(absl::Milliseconds(200));
  absl::Status refused = ProbeStream(*stub);
  EXPECT_EQ(refused.code(), absl::StatusCode::kResourceExhausted) << refused;

  // After the idle timeout they are cancelled with a status naming the
  // setting, and another client's append and fetch get through.
  for (auto& s : stalled) {
    absl::Status finished = ToAbsl(s->writer->Finish());
    EXPECT_EQ(finished.code(), absl::StatusCode::kDeadlineExceeded) << finished;
    EXPECT_THAT(std::string(finished.message()), HasSubstr("stream_idle_timeout_ms (1000 ms)"));
  }
  auto appended = client->Append("m", tokens, kv);
  ASSERT_TRUE(appended.ok()) << appended.status();
  EXPECT_EQ(appended->stored_blocks, 2u);
  std::vector<std::byte> out(kv.size());
  auto fetched = client->Fetch("m", tokens, out);
  ASSERT_TRUE(fetched.ok()) << fetched.status();
  EXPECT_EQ(fetched->blocks, 2u);
  EXPECT_THAT(Scrape((*daemon)->metrics_port()),
              HasSubstr(R"(kvcached_stream_timeouts_total{method="Append"} 4)"));
  EXPECT_EQ((*daemon)->Stop(), 0);
}

// Runs DISABLED_<helper> of this binary in a child process (a gRPC of its
// own) with `env` added to the environment; returns its pid.
pid_t SpawnHelper(const std::string& helper, std::vector<std::string> env) {
  // argv and environment are built before fork: the child only execs.
  std::vector<char*> envp;
  for (std::string& e : env) envp.push_back(e.data());
  for (char** e = environ; *e != nullptr; ++e) envp.push_back(*e);
  envp.push_back(nullptr);
  std::string arg0 = "helper", arg1 = "--gtest_also_run_disabled_tests",
              arg2 = "--gtest_filter=StreamLimitsTest.DISABLED_" + helper;
  char* argv[] = {arg0.data(), arg1.data(), arg2.data(), nullptr};
  const pid_t child = ::fork();
  if (child == 0) {
    ::execve("/proc/self/exe", argv, envp.data());
    ::_exit(127);
  }
  return child;
}

constexpr size_t kFetchBlocks = 768;  // of 128 KiB: 96 MiB

v1::ModelLayout FetchLayout() { return MakeLayout(8, 2, 128, v1::DTYPE_FP16, 16); }
std::vector<uint32_t> FetchTokens() { return MakeTokens(2, kFetchBlocks * 16); }

// Run only as the child of SlowFetchReaderPinsOnlyWhatItHasNotReceived:
// fetches the prefix from $KVCACHED_HELPER_TARGET over a connection that
// reads ahead at most 64 KiB, reads half of it and stops itself, reading
// nothing more, not even at the transport. Continued, it reads what is left
// and writes the status code, bytes received and message to
// $KVCACHED_HELPER_RESULT.
TEST(StreamLimitsTest, DISABLED_HelperStallsAFetch) {
  const char* target = std::getenv("KVCACHED_HELPER_TARGET");
  const char* result = std::getenv("KVCACHED_HELPER_RESULT");
  ASSERT_NE(target, nullptr);
  ASSERT_NE(result, nullptr);
  grpc::ChannelArguments args;
  args.SetInt(GRPC_ARG_HTTP2_BDP_PROBE, 0);
  args.SetInt(GRPC_ARG_HTTP2_STREAM_LOOKAHEAD_BYTES, 64 << 10);
  args.SetMaxReceiveMessageSize(64 << 20);
  auto stub = v1::Cache::NewStub(
      grpc::CreateCustomChannel(target, grpc::InsecureChannelCredentials(), args));
  grpc::ClientContext ctx;
  v1::FetchRequest request;
  request.set_model_id("m");
  for (uint32_t t : FetchTokens()) request.add_tokens(t);
  auto reader = stub->Fetch(&ctx, request);
  v1::FetchResponse msg;
  uint64_t received = 0;
  while (received < kFetchBlocks / 2 * (128 << 10) && reader->Read(&msg)) {
    received += msg.data().size();
  }
  ::raise(SIGSTOP);
  while (reader->Read(&msg)) received += msg.data().size();
  const grpc::Status status = reader->Finish();
  std::ofstream(result) << status.error_code() << "\n"
                        << received << "\n"
                        << status.error_message() << "\n";
}

TEST(StreamLimitsTest, SlowFetchReaderPinsOnlyWhatItHasNotReceived) {
  auto daemon = DaemonProcess::Start(
      {.capacity_bytes = uint64_t{256} << 20,
       .slab_bytes = 64 << 10,
       .metrics = true,
       .extra_flags = {
           "--config",
           WriteConfig("fetch_idle.json", R"({"limits": {"stream_idle_timeout_ms": 3000}})")}});
  ASSERT_TRUE(daemon.ok()) << daemon.status();
  auto client = (*daemon)->NewClient();
  // 128 KiB blocks, two slabs each, so an unpinned block gives its slabs back.
  auto reg = client->RegisterModel("m", FetchLayout());
  ASSERT_TRUE(reg.ok()) << reg.status();
  ASSERT_EQ(reg->block_bytes(), 128u << 10);
  const auto tokens = FetchTokens();
  auto appended =
      client->Append("m", tokens, MakeKv(tokens, 16, reg->block_bytes(), 0, kFetchBlocks));
  ASSERT_TRUE(appended.ok()) << appended.status();
  const uint64_t prefix_bytes = kFetchBlocks * reg->block_bytes();

  // A reader (a process) that reads half the prefix and then stops dead.
  const std::string result = ::testing::TempDir() + "/stalled_fetch_result";
  std::filesystem::remove(result);
  const pid_t child = SpawnHelper(
      "HelperStallsAFetch",
      {"KVCACHED_HELPER_TARGET=" + (*daemon)->unix_target(), "KVCACHED_HELPER_RESULT=" + result});
  ASSERT_GT(child, 0);
  int wstatus = 0;
  ASSERT_EQ(::waitpid(child, &wstatus, WUNTRACED), child);
  ASSERT_TRUE(WIFSTOPPED(wstatus));
  const absl::Time stopped = absl::Now();
  absl::SleepFor(absl::Milliseconds(1000));

  // Evicted, the prefix keeps in the tier only the blocks the stream has
  // not delivered yet, not those the reader already has.
  ASSERT_TRUE(client->EvictModel("m").ok());
  auto stats = client->GetStats();
  ASSERT_TRUE(stats.ok()) << stats.status();
  ASSERT_EQ(stats->tiers_size(), 1);
  const uint64_t pinned = stats->tiers(0).used_bytes();
  EXPECT_LT(pinned, prefix_bytes * 6 / 10)
      << "a half-read fetch pins " << pinned << " of " << prefix_bytes << " bytes";

  // Past the idle timeout the server cuts the stream off and lets go of all
  // but the few blocks the transport still holds for the stopped peer.
  absl::SleepFor(stopped + absl::Seconds(4) - absl::Now());
  stats = client->GetStats();
  ASSERT_TRUE(stats.ok());
  EXPECT_LE(stats->tiers(0).used_bytes(), 16 * reg->block_bytes());
  EXPECT_THAT(Scrape((*daemon)->metrics_port()),
              HasSubstr(R"(kvcached_stream_timeouts_total{method="Fetch"} 1)"));

  // The reader, woken, gets what was in flight and a status naming the setting.
  ::kill(child, SIGCONT);
  ASSERT_EQ(::waitpid(child, &wstatus, 0), child);
  EXPECT_TRUE(WIFEXITED(wstatus) && WEXITSTATUS(wstatus) == 0) << wstatus;
  std::ifstream in(result);
  int code = -1;
  uint64_t received = 0;
  std::string message;
  in >> code >> received;
  std::getline(in >> std::ws, message);
  EXPECT_EQ(code, grpc::StatusCode::DEADLINE_EXCEEDED) << message;
  EXPECT_THAT(message, HasSubstr("stream_idle_timeout_ms (3000 ms)"));
  EXPECT_LT(received, prefix_bytes);
  EXPECT_EQ((*daemon)->Stop(), 0);
}

TEST(StreamLimitsTest, PerClientCapLeavesRoomForOthers) {
  auto daemon = DaemonProcess::Start(
      {.tcp = true,
       .extra_flags = {"--config", WriteConfig("per_client.json",
                                               R"({"limits": {"max_concurrent_streams": 8,
                                                              "max_streams_per_client": 2}})")}});
  ASSERT_TRUE(daemon.ok()) << daemon.status();
  ClientOptions options;
  options.target = (*daemon)->tcp_target();
  auto other = Client::Connect(options);
  ASSERT_TRUE(other.ok());
  const v1::ModelLayout layout = MakeLayout(1, 1, 64, v1::DTYPE_FP16, 16);
  auto reg = (*other)->RegisterModel("m", layout);
  ASSERT_TRUE(reg.ok()) << reg.status();
  const auto tokens = MakeTokens(3, 32);

  // One client (one TCP connection) holds its two streams.
  auto greedy = v1::Cache::NewStub(NewChannel((*daemon)->tcp_target()));
  std::vector<std::unique_ptr<StalledAppend>> held;
  for (int i = 0; i < 2; ++i) held.push_back(StallAppend(*greedy, Header("m", tokens)));
  absl::Status third;
  for (int attempt = 0; attempt < 300; ++attempt) {  // until the server has taken both (30 s)
    third = ProbeStream(*greedy);
    if (third.code() == absl::StatusCode::kResourceExhausted) break;
    absl::SleepFor(absl::Milliseconds(100));
  }
  EXPECT_EQ(third.code(), absl::StatusCode::kResourceExhausted) << third;
  EXPECT_THAT(std::string(third.message()), HasSubstr("max_streams_per_client (2)"));

  // Another client is served.
  auto appended =
      (*other)->Append("m", tokens, MakeKv(tokens, 16, reg->block_bytes(), 0, tokens.size() / 16));
  EXPECT_TRUE(appended.ok()) << appended.status();
  for (auto& h : held) h->ctx.TryCancel();
  for (auto& h : held) h->writer->Finish().IgnoreError();
  EXPECT_EQ((*daemon)->Stop(), 0);
}

TEST(StreamLimitsTest, UnaryCallsPastTheLimitAreRefused) {
  auto daemon = DaemonProcess::Start(
      {.extra_flags = {"--config",
                       WriteConfig("unary.json", R"({"limits": {"max_concurrent_unary": 1}})")}});
  ASSERT_TRUE(daemon.ok()) << daemon.status();
  auto setup = (*daemon)->NewClient();
  // 64-byte blocks: 256 Ki tokens are cached in 1 MiB, and each lookup of
  // them walks and leases 16384 blocks.
  auto reg = setup->RegisterModel("m", MakeLayout(1, 1, 1, v1::DTYPE_FP16, 16));
  ASSERT_TRUE(reg.ok()) << reg.status();
  const auto tokens = MakeTokens(4, 1 << 18);
  auto appended =
      setup->Append("m", tokens, MakeKv(tokens, 16, reg->block_bytes(), 0, tokens.size() / 16));
  ASSERT_TRUE(appended.ok()) << appended.status();
  v1::LookupRequest request;
  request.set_model_id("m");
  request.set_acquire_lease(true);
  request.set_lease_ttl_ms(1000);
  for (uint32_t t : tokens) request.add_tokens(t);

  // Large lookups from several clients at once: past one in flight they are
  // refused at once, never queued.
  constexpr int kClients = 8;
  std::vector<std::unique_ptr<v1::Cache::Stub>> stubs;
  for (int i = 0; i < kClients; ++i) {
    stubs.push_back(v1::Cache::NewStub(NewChannel((*daemon)->unix_target())));
  }
  std::atomic<int> ok{0}, refused{0}, other{0};
  std::mutex mu;
  std::string refusal;
  for (int round = 0; round < 30 && refused.load() == 0; ++round) {
    std::latch start(kClients);
    std::vector<std::thread> threads;
    for (int i = 0; i < kClients; ++i) {
      threads.emplace_back([&, i] {
        start.arrive_and_wait();
        auto& stub = stubs[i];
        grpc::ClientContext ctx;
        v1::LookupResponse response;
        absl::Status s = ToAbsl(stub->Lookup(&ctx, request, &response));
        std::lock_guard<std::mutex> lock(mu);
        if (s.ok()) {
          ++ok;
        } else if (s.code() == absl::StatusCode::kResourceExhausted) {
          ++refused;
          refusal = std::string(s.message());
        } else {
          ++other;
          ADD_FAILURE() << s;
        }
      });
    }
    for (auto& t : threads) t.join();
  }
  EXPECT_GT(refused.load(), 0);
  EXPECT_GT(ok.load(), 0);
  EXPECT_EQ(other.load(), 0);
  EXPECT_THAT(refusal, HasSubstr("max_concurrent_unary (1)"));
  EXPECT_EQ((*daemon)->Stop(), 0);
}

// Run only as the child of KeepaliveDropsAPeerThatStoppedAnswering: opens an
// append on $KVCACHED_HELPER_TARGET, writes its header, says so on
// $KVCACHED_HELPER_READY and waits to be stopped and killed.
TEST(StreamLimitsTest, DISABLED_HelperHoldsAnAppend) {
  const char* target = std::getenv("KVCACHED_HELPER_TARGET");
  const char* ready = std::getenv("KVCACHED_HELPER_READY");
  ASSERT_NE(target, nullptr);
  ASSERT_NE(ready, nullptr);
  auto stub = v1::Cache::NewStub(NewChannel(target));
  auto held = StallAppend(*stub, Header("m", MakeTokens(5, 16)));
  std::ofstream(ready) << "ready";
  absl::SleepFor(absl::Seconds(120));
}

TEST(StreamLimitsTest, KeepaliveDropsAPeerThatStoppedAnswering) {
  auto daemon = DaemonProcess::Start(
      {.extra_flags = {"--config",
                       WriteConfig("keepalive.json", R"({"limits": {"max_concurrent_streams": 1,
                                                                     "stream_idle_timeout_ms": 600000,
                                                                     "keepalive_time_ms": 1000,
                                                                     "keepalive_timeout_ms": 1000}})")}});
  ASSERT_TRUE(daemon.ok()) << daemon.status();
  ASSERT_TRUE(
      (*daemon)->NewClient()->RegisterModel("m", MakeLayout(1, 1, 64, v1::DTYPE_FP16, 16)).ok());
  const std::string ready = ::testing::TempDir() + "/keepalive_helper_ready";
  std::filesystem::remove(ready);

  // A separate process (a fresh gRPC) holds the only stream slot...
  const pid_t child = SpawnHelper(
      "HelperHoldsAnAppend",
      {"KVCACHED_HELPER_TARGET=" + (*daemon)->unix_target(), "KVCACHED_HELPER_READY=" + ready});
  ASSERT_GT(child, 0);
  const absl::Time deadline = absl::Now() + absl::Seconds(20);
  while (!std::filesystem::exists(ready) && absl::Now() < deadline) {
    absl::SleepFor(absl::Milliseconds(20));
  }
  ASSERT_TRUE(std::filesystem::exists(ready));
  auto stub = v1::Cache::NewStub(NewChannel((*daemon)->unix_target()));
  absl::Status held;
  for (int attempt = 0; attempt < 50; ++attempt) {
    held = ProbeStream(*stub);
    if (held.code() == absl::StatusCode::kResourceExhausted) break;
    absl::SleepFor(absl::Milliseconds(100));
  }
  EXPECT_EQ(held.code(), absl::StatusCode::kResourceExhausted) << held;

  // ...and then stops answering anything, pings included. Keepalive closes
  // its connection long before the idle timeout, freeing the slot.
  ::kill(child, SIGSTOP);
  const absl::Time stopped = absl::Now();
  absl::Status probe;
  while (absl::Now() - stopped < absl::Seconds(15)) {
    probe = ProbeStream(*stub);
    if (probe.code() != absl::StatusCode::kResourceExhausted) break;
    absl::SleepFor(absl::Milliseconds(200));
  }
  ::kill(child, SIGKILL);
  ::waitpid(child, nullptr, 0);
  EXPECT_EQ(probe.code(), absl::StatusCode::kInvalidArgument) << probe;  // had the slot
  EXPECT_EQ((*daemon)->Stop(), 0);
}

}  // namespace
}  // namespace kvcache::testing
