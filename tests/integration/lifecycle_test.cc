// The daemon's life: start-up errors, a second daemon on the same listeners,
// the Unix socket's file, SIGTERM draining in-flight streams, and the stream
// limit.
#include <gmock/gmock.h>
#include <grp.h>
#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <array>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <thread>

#include "absl/strings/str_cat.h"
#include "kvcache/v1/kvcache.grpc.pb.h"
#include "tests/integration/daemon_process.h"
#include "tests/integration/kv_pattern.h"

namespace kvcache::testing {
namespace {

using ::testing::HasSubstr;

struct ProcessResult {
  int exit_code = -1;
  std::string output;
};

// Runs kvcached to its exit; one that starts when it should not is killed
// after 20 s (exit code 137), so such a test fails instead of hanging.
ProcessResult RunKvcached(const std::string& args) {
  ProcessResult r;
  std::FILE* pipe =
      ::popen(("timeout -s KILL 20 " + KvcachedPath() + " " + args + " 2>&1").c_str(), "r");
  std::array<char, 4096> buf;
  size_t n;
  while ((n = std::fread(buf.data(), 1, buf.size(), pipe)) > 0) r.output.append(buf.data(), n);
  const int status = ::pclose(pipe);
  r.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return r;
}

std::string WriteFile(const std::string& name, const std::string& text) {
  const std::string path = ::testing::TempDir() + "/" + name;
  // Whatever an earlier run left there (a socket cannot be opened to write).
  std::filesystem::remove(path);
  std::FILE* f = std::fopen(path.c_str(), "w");
  EXPECT_NE(f, nullptr) << path;
  if (f == nullptr) return path;
  std::fputs(text.c_str(), f);
  std::fclose(f);
  return path;
}

std::string ReadFile(const std::string& path) {
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

TEST(LifecycleTest, BadConfigurationStopsStartupWithTheFieldNamed) {
  ProcessResult bad_value =
      RunKvcached("--slab-bytes 3000000 --listen none --metrics-address none");
  EXPECT_EQ(bad_value.exit_code, 2);
  EXPECT_THAT(bad_value.output, HasSubstr("host_tier.slab_bytes"));

  ProcessResult unknown_field =
      RunKvcached("--config " + WriteFile("bad.json", R"({"hosttier": {}})"));
  EXPECT_EQ(unknown_field.exit_code, 2);
  EXPECT_THAT(unknown_field.output, HasSubstr("hosttier"));

  ProcessResult no_listener = RunKvcached("--listen none --unix-socket none");
  EXPECT_EQ(no_listener.exit_code, 2);
  EXPECT_THAT(no_listener.output, HasSubstr("enable at least one"));
}

TEST(LifecycleTest, AnSsdTierThatCannotBeOpenedStopsStartupUnlessSkipped) {
  const std::string missing_dir = ::testing::TempDir() + "/no-such-dir/ssd.bin";
  ProcessResult refused =
      RunKvcached("--listen none --metrics-address none --unix-socket " + ::testing::TempDir() +
                  "/ssd-refused.sock --ssd-path " + missing_dir);
  EXPECT_EQ(refused.exit_code, 2) << refused.output;
  EXPECT_THAT(refused.output, HasSubstr("ssd tier at " + missing_dir));

  auto daemon = DaemonProcess::Start(
      {.extra_flags = {"--ssd-path", missing_dir, "--config",
                       WriteFile("skip.json", R"({"ssd_tier": {"on_open_failure": "skip"}})")}});
  ASSERT_TRUE(daemon.ok()) << daemon.status();
  EXPECT_THAT(ReadFile((*daemon)->log_path()), HasSubstr("running without it"));
  auto client = (*daemon)->NewClient();
  auto stats = client->GetStats();
  ASSERT_TRUE(stats.ok());
  EXPECT_EQ(stats->tiers_size(), 1);  // host memory only
  client.reset();
  EXPECT_EQ((*daemon)->Stop(), 0);
}

TEST(LifecycleTest, RemoteListeningNeedsTheInsecureOptInAndIsLoud) {
  const std::string port = std::to_string(PickFreePort());
  ProcessResult refused =
      RunKvcached("--listen 0.0.0.0:" + port + " --unix-socket none --metrics-address none");
  EXPECT_EQ(refused.exit_code, 2);
  EXPECT_THAT(refused.output, HasSubstr("listen.tcp_address \"0.0.0.0:" + port));
  EXPECT_THAT(refused.output, HasSubstr("allow_insecure_remote"));

  auto daemon = DaemonProcess::Start(
      {.tcp = true, .tcp_host = "0.0.0.0", .extra_flags = {"--allow-insecure-remote"}});
  ASSERT_TRUE(daemon.ok()) << daemon.status();
  EXPECT_THAT(ReadFile((*daemon)->log_path()),
              HasSubstr("[warning] INSECURE: listening on 0.0.0.0:"));
  EXPECT_EQ((*daemon)->Stop(), 0);
}

TEST(LifecycleTest, SocketsBelongToTheConfiguredGroup) {
  if (::geteuid() != 0) GTEST_SKIP() << "giving a socket to another group needs root (CI is root)";
  // A group other than ours, so the test sees the daemon change it.
  const group* other = ::getgrnam("nogroup");
  ASSERT_NE(other, nullptr) << "Debian's nogroup is missing";
  ASSERT_NE(other->gr_gid, ::getegid());
  const gid_t gid = other->gr_gid;
  auto daemon = DaemonProcess::Start(
      {.extra_flags = {"--config",
                       WriteFile("group.json", R"({"listen": {"socket_group": "nogroup"}})")}});
  ASSERT_TRUE(daemon.ok()) << daemon.status();
  for (const std::string& path : {(*daemon)->socket_path(), (*daemon)->socket_path() + ".shm"}) {
    struct stat st;
    ASSERT_EQ(::stat(path.c_str(), &st), 0) << path;
    EXPECT_EQ(st.st_gid, gid) << path;
    EXPECT_EQ(st.st_mode & 0777, 0660u) << path;
  }
  EXPECT_EQ((*daemon)->Stop(), 0);

  ProcessResult unknown =
      RunKvcached("--listen none --metrics-address none --config " +
                  WriteFile("nogroup.json", R"({"listen": {"socket_group": "no-such-group-kv"}})"));
  EXPECT_EQ(unknown.exit_code, 2);
  EXPECT_THAT(unknown.output, HasSubstr("no-such-group-kv"));
}

TEST(LifecycleTest, ABadCalibrationFileIsLoggedAndTheDaemonStartsWithDefaultWeights) {
  const std::string calibration = WriteFile("bad_calibration.json", "{not json");
  auto daemon = DaemonProcess::Start(
      {.extra_flags = {"--config", WriteFile("calibration_config.json",
                                             R"({"importance": {"calibration_file": ")" +
                                                 calibration + R"("}})")}});
  ASSERT_TRUE(daemon.ok()) << daemon.status();
  const std::string log = ReadFile((*daemon)->log_path());
  EXPECT_THAT(log, HasSubstr("[error] calibration: ignoring the calibration file " + calibration));
  EXPECT_THAT(log, HasSubstr("configured weights"));

  auto client = (*daemon)->NewClient();
  ASSERT_TRUE(client->RegisterModel("m", MakeLayout(1, 1, 64, v1::DTYPE_FP16, 16)).ok());
  auto models = client->ListModels();
  ASSERT_TRUE(models.ok()) << models.status();
  ASSERT_EQ(models->models_size(), 1);
  const v1::ImportanceWeights& w = models->models(0).policy().weights();
  EXPECT_FLOAT_EQ(w.alpha(), 0.6f);
  EXPECT_FLOAT_EQ(w.beta(), 0.3f);
  EXPECT_FLOAT_EQ(w.gamma(), 0.1f);
  EXPECT_EQ(ReadFile(calibration), "{not json");  // left for the operator until replaced
  EXPECT_EQ((*daemon)->Stop(), 0);
}

TEST(LifecycleTest, PrintedDefaultConfigIsAValidConfigFile) {
  ProcessResult printed = RunKvcached("--print-default-config");
  ASSERT_EQ(printed.exit_code, 0);
  EXPECT_THAT(printed.output, HasSubstr("\"capacity_bytes\": \"1073741824\""));
  // Start a daemon from it (listeners moved so it cannot clash with anything).
  auto daemon = DaemonProcess::Start(
      {.extra_flags = {"--config", WriteFile("defaults.json", printed.output)}});
  ASSERT_TRUE(daemon.ok()) << daemon.status();
  EXPECT_EQ((*daemon)->Stop(), 0);
}

TEST(LifecycleTest, PortInUseIsAClearError) {
  auto first = DaemonProcess::Start({.tcp = true});
  ASSERT_TRUE(first.ok()) << first.status();
  const std::string port = (*first)->tcp_target();
  ProcessResult second =
      RunKvcached(absl::StrCat("--listen ", port, " --unix-socket none --metrics-address none"));
  EXPECT_EQ(second.exit_code, 2);
  EXPECT_THAT(second.output, HasSubstr("cannot listen on " + port));
  EXPECT_EQ((*first)->Stop(), 0);
}

// True when a new connection to `daemon`'s Unix socket reaches it.
bool ReachableOverUnixSocket(const DaemonProcess& daemon) {
  auto client = Client::Connect({.target = daemon.unix_target(), .timeout = absl::Seconds(5)});
  return client.ok() && (*client)->GetServerInfo().ok();
}

TEST(LifecycleTest, SecondDaemonOnTheSameSocketFailsAndTheFirstStaysReachable) {
  auto first = DaemonProcess::Start({.tcp = true});
  ASSERT_TRUE(first.ok()) << first.status();
  const std::string socket = (*first)->socket_path();

  // Another TCP port, the same socket: refused before anything is touched.
  ProcessResult other_port = RunKvcached(absl::StrCat(
      "--listen 127.0.0.1:", PickFreePort(), " --unix-socket ", socket, " --metrics-address none"));
  EXPECT_EQ(other_port.exit_code, 2);
  EXPECT_THAT(other_port.output, HasSubstr("cannot listen on unix socket " + socket));
  EXPECT_THAT(other_port.output, HasSubstr("another process is listening on it"));
  EXPECT_TRUE(ReachableOverUnixSocket(**first));

  // The same TCP port and socket: the port is found taken first.
  const std::string port = (*first)->tcp_target();
  ProcessResult same_port = RunKvcached(
      absl::StrCat("--listen ", port, " --unix-socket ", socket, " --metrics-address none"));
  EXPECT_EQ(same_port.exit_code, 2);
  EXPECT_THAT(same_port.output, HasSubstr("cannot listen on " + port));
  EXPECT_TRUE(ReachableOverUnixSocket(**first));
  EXPECT_EQ((*first)->Stop(), 0);
}

TEST(LifecycleTest, AFileThatIsNotASocketIsNeverRemoved) {
  const std::string path = WriteFile("not_a_socket", "precious");
  ProcessResult r = RunKvcached("--listen none --metrics-address none --unix-socket " + path);
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_THAT(r.output, HasSubstr(path + " exists and is not a socket"));
  EXPECT_EQ(ReadFile(path), "precious");
}

TEST(LifecycleTest, AStaleSocketIsReplacedAndTheSocketIsMode0660) {
  const std::string path = ::testing::TempDir() + "/stale_kvcached.sock";
  std::filesystem::remove(path);
  {  // A socket file nobody listens on, as a killed daemon leaves it.
    const int fd = ::socket(AF_UNIX, SOCK_STREAM, 0);
    sockaddr_un addr{};
    addr.sun_family = AF_UNIX;
    std::strncpy(addr.sun_path, path.c_str(), sizeof(addr.sun_path) - 1);
    ASSERT_EQ(::bind(fd, reinterpret_cast<const sockaddr*>(&addr), sizeof(addr)), 0);
    ::close(fd);
  }
  auto daemon = DaemonProcess::Start({.unix_socket = path});
  ASSERT_TRUE(daemon.ok()) << daemon.status();
  EXPECT_TRUE(ReachableOverUnixSocket(**daemon));
  struct stat st;
  ASSERT_EQ(::stat(path.c_str(), &st), 0);
  EXPECT_TRUE(S_ISSOCK(st.st_mode));
  EXPECT_EQ(st.st_mode & 07777, 0660u);
  EXPECT_EQ((*daemon)->Stop(), 0);
}

TEST(LifecycleTest, AfterARestartTheClientRegistersItsModelAgain) {
  const std::string socket = ::testing::TempDir() + "/restart_kvcached.sock";
  std::filesystem::remove(socket);
  auto first = DaemonProcess::Start({.unix_socket = socket});
  ASSERT_TRUE(first.ok()) << first.status();
  auto client = (*first)->NewClient();
  auto reg = client->RegisterModel("m", MakeLayout(1, 1, 64, v1::DTYPE_FP16, 16));
  ASSERT_TRUE(reg.ok()) << reg.status();
  const auto tokens = MakeTokens(1, 32);
  const auto kv = MakeKv(tokens, 16, reg->block_bytes(), 0, 2);
  ASSERT_TRUE(client->Append("m", tokens, kv).ok());
  EXPECT_EQ((*first)->Stop(), 0);

  // The daemon keeps nothing across a restart: the model and its blocks are
  // gone. The client registers the model again on its first call.
  auto second = DaemonProcess::Start({.unix_socket = socket});
  ASSERT_TRUE(second.ok()) << second.status();
  ASSERT_TRUE(client->WaitForReady(absl::Seconds(10)).ok());
  auto hit = client->Lookup("m", tokens);
  ASSERT_TRUE(hit.ok()) << hit.status();
  EXPECT_EQ(hit->matched_tokens, 0u);
  auto models = (*second)->NewClient()->ListModels();
  ASSERT_TRUE(models.ok()) << models.status();
  ASSERT_EQ(models->models_size(), 1);
  EXPECT_EQ(models->models(0).layout().head_dim(), 64u);

  auto appended = client->Append("m", tokens, kv);
  ASSERT_TRUE(appended.ok()) << appended.status();
  EXPECT_EQ(appended->stored_blocks, 2u);
  std::vector<std::byte> out(kv.size());
  auto fetched = client->Fetch("m", tokens, out);
  ASSERT_TRUE(fetched.ok()) << fetched.status();
  EXPECT_TRUE(out == kv);
  EXPECT_EQ((*second)->Stop(), 0);
}

absl::Status ToAbsl(const grpc::Status& s) {
  return absl::Status(static_cast<absl::StatusCode>(s.error_code()), s.error_message());
}

TEST(LifecycleTest, SigtermDrainsAnAppendInFlight) {
  auto daemon = DaemonProcess::Start();
  ASSERT_TRUE(daemon.ok()) << daemon.status();
  auto client = (*daemon)->NewClient();
  const v1::ModelLayout layout = MakeLayout(1, 1, 64, v1::DTYPE_FP16, 16);
  auto reg = client->RegisterModel("m", layout);
  ASSERT_TRUE(reg.ok());
  const auto tokens = MakeTokens(1, 32);
  const auto kv = MakeKv(tokens, 16, reg->block_bytes(), 0, 2);

  auto stub = v1::Cache::NewStub(
      grpc::CreateChannel((*daemon)->unix_target(), grpc::InsecureChannelCredentials()));
  grpc::ClientContext ctx;
  v1::AppendResponse response;
  auto writer = stub->Append(&ctx, &response);
  v1::AppendRequest msg;
  v1::AppendHeader* h = msg.mutable_header();
  h->set_model_id("m");
  for (uint32_t t : tokens) h->add_tokens(t);
  for (uint64_t sum : BlockChecksums(kv, reg->block_bytes())) h->add_block_checksums(sum);
  ASSERT_TRUE(writer->Write(msg));
  msg.set_kv_chunk(std::string(reinterpret_cast<const char*>(kv.data()), kv.size() / 2));
  ASSERT_TRUE(writer->Write(msg));

  // The daemon is told to stop while the append is half sent: once it is
  // serving the call (a written message may still sit in the client's
  // buffers; a call the daemon never started is refused by the shutdown).
  bool serving = false;
  for (absl::Time deadline = absl::Now() + absl::Seconds(10); !serving && absl::Now() < deadline;) {
    auto dump = client->DumpMemory();
    ASSERT_TRUE(dump.ok()) << dump.status();
    for (const v1::InflightCall& c : dump->calls()) serving = serving || c.method() == "Append";
    if (!serving) absl::SleepFor(absl::Milliseconds(10));
  }
  ASSERT_TRUE(serving) << "the daemon never started serving the append";
  std::thread stopper([&] { EXPECT_EQ((*daemon)->Stop(), 0); });
  absl::SleepFor(absl::Milliseconds(300));
  msg.set_kv_chunk(
      std::string(reinterpret_cast<const char*>(kv.data()) + kv.size() / 2, kv.size() / 2));
  ASSERT_TRUE(writer->Write(msg));
  writer->WritesDone();
  absl::Status finished = ToAbsl(writer->Finish());
  EXPECT_TRUE(finished.ok()) << finished;
  EXPECT_EQ(response.stored_blocks(), 2u);
  stopper.join();
}

TEST(LifecycleTest, StreamLimitAnswersResourceExhausted) {
  auto daemon = DaemonProcess::Start(
      {.extra_flags = {"--config",
                       WriteFile("streams.json", R"({"limits": {"max_concurrent_streams": 2}})")}});
  ASSERT_TRUE(daemon.ok()) << daemon.status();
  auto client = (*daemon)->NewClient();
  const v1::ModelLayout layout = MakeLayout(1, 1, 64, v1::DTYPE_FP16, 16);
  auto reg = client->RegisterModel("m", layout);
  ASSERT_TRUE(reg.ok());
  const auto tokens = MakeTokens(1, 32);

  {
    auto stub = v1::Cache::NewStub(
        grpc::CreateChannel((*daemon)->unix_target(), grpc::InsecureChannelCredentials()));
    // Two appends that stay open hold both slots.
    std::array<grpc::ClientContext, 2> ctx;
    std::array<v1::AppendResponse, 2> responses;
    std::vector<std::unique_ptr<grpc::ClientWriter<v1::AppendRequest>>> writers;
    v1::AppendRequest header;
    header.mutable_header()->set_model_id("m");
    for (uint32_t t : tokens) header.mutable_header()->add_tokens(t);
    for (uint64_t sum :
         BlockChecksums(MakeKv(tokens, 16, reg->block_bytes(), 0, 2), reg->block_bytes())) {
      header.mutable_header()->add_block_checksums(sum);
    }
    for (int i = 0; i < 2; ++i) {
      writers.push_back(stub->Append(&ctx[i], &responses[i]));
      ASSERT_TRUE(writers.back()->Write(header));
    }
    // A third stream is refused at once. The server may not have taken the
    // first two yet on a loaded machine, so probe until it is refused; a probe
    // that gets a slot ends at once (no header) and frees it.
    absl::SleepFor(absl::Milliseconds(300));
    absl::Status third;
    for (int attempt = 0; attempt < 100; ++attempt) {
      grpc::ClientContext probe_ctx;
      v1::AppendResponse probe_response;
      auto probe = stub->Append(&probe_ctx, &probe_response);
      probe->WritesDone();
      third = ToAbsl(probe->Finish());
      if (third.code() == absl::StatusCode::kResourceExhausted) break;
      absl::SleepFor(absl::Milliseconds(100));
    }
    EXPECT_EQ(third.code(), absl::StatusCode::kResourceExhausted) << third;
    EXPECT_THAT(std::string(third.message()), HasSubstr("max_concurrent_streams (2)"));
    for (int i = 0; i < 2; ++i) {
      writers[i]->WritesDone();
      absl::Status s = ToAbsl(writers[i]->Finish());  // no KV followed the header
      EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
    }
  }  // closes the channel
  // Both slots are free again.
  auto appended = client->Append("m", tokens, MakeKv(tokens, 16, reg->block_bytes(), 0, 2));
  EXPECT_TRUE(appended.ok()) << appended.status();
  EXPECT_EQ((*daemon)->Stop(), 0);
}

}  // namespace
}  // namespace kvcache::testing
