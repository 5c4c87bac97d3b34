// The shared-memory data plane against the real daemon: byte-exact round
// trips on both paths, the raw protocol's refusals over the real socket,
// workers killed mid-call, and 16 workers verifying every byte.
#include <fcntl.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <fstream>
#include <thread>

#include "absl/strings/str_cat.h"
#include "kvcache/shm_frame.h"
#include "kvcache/v1/shm.pb.h"
#include "tests/integration/daemon_process.h"
#include "tests/integration/kv_pattern.h"

namespace kvcache::testing {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

// Mappings in process `pid` whose name contains `name` (a memfd's name).
int MappingsOf(pid_t pid, const std::string& name) {
  std::ifstream maps(absl::StrCat("/proc/", pid, "/maps"));
  int n = 0;
  for (std::string line; std::getline(maps, line);) {
    if (line.find(name) != std::string::npos) ++n;
  }
  return n;
}

// Waits up to 5 s for the daemon to hold no mapping named `name`.
bool WaitUnmapped(pid_t pid, const std::string& name) {
  for (int i = 0; i < 100; ++i) {
    if (MappingsOf(pid, name) == 0) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  return false;
}

class ShmTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto d = DaemonProcess::Start({.capacity_bytes = uint64_t{512} << 20});
    ASSERT_TRUE(d.ok()) << d.status();
    daemon_ = *std::move(d);
    shm_ = daemon_->NewClient("", DataPath::kSharedMemory);
    grpc_ = daemon_->NewClient("", DataPath::kGrpc);
    ASSERT_TRUE(shm_->UsesSharedMemory());
    ASSERT_FALSE(grpc_->UsesSharedMemory());
    auto info = grpc_->GetServerInfo();
    ASSERT_TRUE(info.ok()) << info.status();
    socket_path_ = info->shm_socket();
    ASSERT_EQ(socket_path_, daemon_->socket_path() + ".shm");
  }
  void TearDown() override {
    shm_.reset();
    grpc_.reset();
    if (daemon_ != nullptr) {
      EXPECT_EQ(daemon_->Stop(), 0) << "log: " << daemon_->log_path();
    }
  }

  std::unique_ptr<DaemonProcess> daemon_;
  std::unique_ptr<Client> shm_;
  std::unique_ptr<Client> grpc_;
  std::string socket_path_;
};

struct LayoutCase {
  uint32_t layers, heads, dim;
  v1::DType dtype;
  uint32_t block_tokens;
};

class ShmRoundTripTest : public ShmTest, public ::testing::WithParamInterface<LayoutCase> {};

TEST_P(ShmRoundTripTest, EveryPathReturnsExactlyTheAppendedBytes) {
  const LayoutCase c = GetParam();
  const v1::ModelLayout layout = MakeLayout(c.layers, c.heads, c.dim, c.dtype, c.block_tokens);
  auto reg = shm_->RegisterModel("m", layout);
  ASSERT_TRUE(reg.ok()) << reg.status();
  ASSERT_TRUE(grpc_->RegisterModel("m", layout).ok());
  const uint64_t bb = reg->block_bytes();
  const auto tokens = MakeTokens(3, 6 * c.block_tokens + 5);
  const auto kv = MakeKv(tokens, c.block_tokens, bb, 0, 6);

  // Append from a SharedRegion: no copy on the client.
  auto region = shm_->CreateSharedRegion(16 * bb);
  ASSERT_TRUE(region.ok()) << region.status();
  std::span<std::byte> mem = (*region)->bytes();
  ASSERT_GE(mem.size(), 16 * bb);
  std::memcpy(mem.data() + bb, kv.data(), 3 * bb);  // blocks 0-2, at an offset
  const std::span<const uint32_t> first3(tokens.data(), 3 * c.block_tokens);
  auto appended = shm_->Append("m", first3, mem.subspan(bb, 3 * bb));
  ASSERT_TRUE(appended.ok()) << appended.status();
  EXPECT_EQ(appended->stored_blocks, 3u);
  // Blocks 3-5 from a heap buffer (through the staging region).
  std::vector<std::byte> rest(kv.begin() + 3 * bb, kv.end());
  AppendOptions from3;
  from3.start_token = 3 * c.block_tokens;
  appended = shm_->Append("m", tokens, rest, from3);
  ASSERT_TRUE(appended.ok()) << appended.status();
  EXPECT_EQ(appended->stored_blocks, 3u);
  EXPECT_EQ(appended->cached_tokens, 6u * c.block_tokens);

  // Fetch into the region, into a heap buffer, over gRPC, by lease.
  std::span<std::byte> into_region = mem.subspan(8 * bb, 8 * bb);
  auto fetched = shm_->Fetch("m", tokens, into_region);
  ASSERT_TRUE(fetched.ok()) << fetched.status();
  EXPECT_EQ(fetched->matched_tokens, 6u * c.block_tokens);
  EXPECT_EQ(fetched->blocks, 6u);
  EXPECT_EQ(fetched->bytes, 6 * bb);
  EXPECT_TRUE(std::equal(kv.begin(), kv.end(), into_region.begin()));
  for (Client* client : {shm_.get(), grpc_.get()}) {
    std::vector<std::byte> out(7 * bb);
    fetched = client->Fetch("m", tokens, out);
    ASSERT_TRUE(fetched.ok()) << fetched.status();
    EXPECT_EQ(fetched->bytes, 6 * bb);
    EXPECT_TRUE(std::equal(kv.begin(), kv.end(), out.begin()));
  }
  auto leased = shm_->Lookup("m", tokens, {.acquire_lease = true});
  ASSERT_TRUE(leased.ok()) << leased.status();
  ASSERT_NE(leased->lease_id, 0u);
  std::vector<std::byte> by_lease(6 * bb);
  fetched = shm_->FetchLease("m", leased->lease_id, by_lease);
  ASSERT_TRUE(fetched.ok()) << fetched.status();
  EXPECT_TRUE(by_lease == kv);
  EXPECT_EQ(shm_->ReleaseLease(leased->lease_id).value_or(false), true);
  // A buffer too small for the prefix: INVALID_ARGUMENT on both paths.
  std::vector<std::byte> small(6 * bb - 1);
  EXPECT_EQ(shm_->Fetch("m", tokens, small).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(grpc_->Fetch("m", tokens, small).status().code(), absl::StatusCode::kInvalidArgument);

  // Appended over gRPC, fetched through shared memory.
  const auto other = MakeTokens(4, 2 * c.block_tokens);
  const auto other_kv = MakeKv(other, c.block_tokens, bb, 0, 2);
  ASSERT_TRUE(grpc_->Append("m", other, other_kv).ok());
  std::vector<std::byte> out(2 * bb);
  ASSERT_TRUE(shm_->Fetch("m", other, out).ok());
  EXPECT_TRUE(out == other_kv);

  // BatchLookup answers each sequence on both paths.
  const std::vector<std::span<const uint32_t>> batch = {tokens, other, first3.first(1)};
  for (Client* client : {shm_.get(), grpc_.get()}) {
    auto looked = client->BatchLookup("m", batch);
    ASSERT_TRUE(looked.ok()) << looked.status();
    ASSERT_EQ(looked->size(), 3u);
    EXPECT_EQ((*looked)[0]->matched_tokens, 6u * c.block_tokens);
    EXPECT_EQ((*looked)[1]->matched_tokens, 2u * c.block_tokens);
    EXPECT_EQ((*looked)[2]->matched_tokens, 0u);
  }
}

INSTANTIATE_TEST_SUITE_P(Layouts, ShmRoundTripTest,
                         ::testing::Values(LayoutCase{2, 2, 64, v1::DTYPE_FP16, 16},
                                           LayoutCase{4, 8, 128, v1::DTYPE_BF16, 64},
                                           LayoutCase{3, 1, 96, v1::DTYPE_FP32, 32},
                                           LayoutCase{32, 8, 128, v1::DTYPE_FP16, 16}));

// A raw connection to the daemon's shared-memory socket.
class RawConnection {
 public:
  explicit RawConnection(const std::string& path) {
    fd_ = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_un addr{};
    addr.sun_family = AF_UNIX;
    std::memcpy(addr.sun_path, path.data(), path.size());
    connected_ = ::connect(fd_, reinterpret_cast<const sockaddr*>(&addr), sizeof(addr)) == 0;
  }
  ~RawConnection() { Close(); }
  void Close() {
    if (fd_ >= 0) ::close(fd_);
    fd_ = -1;
  }
  bool connected() const { return connected_; }
  int fd() const { return fd_; }
  v1::ShmResponse Call(const v1::ShmRequest& request, int pass_fd = -1) {
    EXPECT_TRUE(shm::WriteFrame(fd_, request, pass_fd).ok());
    return Read();
  }
  v1::ShmResponse Read() {
    std::string body;
    std::vector<int> fds;
    v1::ShmResponse response;
    absl::Status s = shm::ReadFrame(fd_, 1 << 26, &body, &fds);
    if (!s.ok()) {
      response.set_code(-1);
      response.set_message(std::string(s.message()));
    } else {
      EXPECT_TRUE(response.ParseFromString(body));
    }
    return response;
  }

 private:
  int fd_ = -1;
  bool connected_ = false;
};

// A worker's memfd, named so the daemon's mappings of it can be counted.
struct TestRegion {
  TestRegion(uint64_t bytes, bool seal) : bytes(bytes) {
    fd = ::memfd_create("kvcache-shm-integration", MFD_CLOEXEC | MFD_ALLOW_SEALING);
    EXPECT_EQ(::ftruncate(fd, static_cast<off_t>(bytes)), 0);
    if (seal) {
      EXPECT_EQ(::fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK), 0);
    }
    data =
        static_cast<std::byte*>(::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0));
  }
  ~TestRegion() {
    ::munmap(data, bytes);
    ::close(fd);
  }
  uint64_t bytes;
  int fd = -1;
  std::byte* data = nullptr;
};

v1::ShmRequest Attach(uint64_t bytes) {
  v1::ShmRequest r;
  r.mutable_attach_region()->set_bytes(bytes);
  return r;
}

v1::ShmRequest FetchInto(const std::vector<uint32_t>& tokens, uint64_t region, uint64_t offset,
                         uint64_t length) {
  v1::ShmRequest r;
  v1::FetchIntoRequest* f = r.mutable_fetch_into();
  f->set_model_id("m");
  f->mutable_tokens()->Add(tokens.begin(), tokens.end());
  f->mutable_destination()->set_region_id(region);
  f->mutable_destination()->set_offset(offset);
  f->mutable_destination()->set_length(length);
  return r;
}

v1::ShmRequest AppendFrom(const std::vector<uint32_t>& tokens, const std::vector<uint64_t>& sums,
                          uint64_t region, uint64_t offset, uint64_t length) {
  v1::ShmRequest r;
  v1::AppendFromRequest* a = r.mutable_append_from();
  a->mutable_header()->set_model_id("m");
  a->mutable_header()->mutable_tokens()->Add(tokens.begin(), tokens.end());
  a->mutable_header()->mutable_block_checksums()->Add(sums.begin(), sums.end());
  a->mutable_source()->set_region_id(region);
  a->mutable_source()->set_offset(offset);
  a->mutable_source()->set_length(length);
  return r;
}

constexpr int kOk = 0;
int Code(absl::StatusCode c) { return static_cast<int>(c); }

TEST_F(ShmTest, TheSocketRefusesBadRequestsClearlyAndChangesNothing) {
  const v1::ModelLayout layout = MakeLayout(2, 2, 64, v1::DTYPE_FP16, 16);
  auto reg = grpc_->RegisterModel("m", layout);
  ASSERT_TRUE(reg.ok());
  const uint64_t bb = reg->block_bytes();
  const auto tokens = MakeTokens(9, 4 * 16);
  const auto kv = MakeKv(tokens, 16, bb, 0, 4);
  const auto sums = BlockChecksums(kv, bb);
  const pid_t daemon = daemon_->pid();
  const std::string name = "kvcache-shm-integration";

  RawConnection a(socket_path_), b(socket_path_);
  ASSERT_TRUE(a.connected() && b.connected());
  // A frame that is not an ShmRequest: refused, the connection stays usable.
  const std::string junk("\x05\x00\x00\x00\xff\xff\xff\xff\xff", 9);
  ASSERT_EQ(::send(a.fd(), junk.data(), junk.size(), MSG_NOSIGNAL),
            static_cast<ssize_t>(junk.size()));
  v1::ShmResponse r = a.Read();
  EXPECT_EQ(r.code(), Code(absl::StatusCode::kInvalidArgument)) << r.message();
  v1::ShmRequest hello;
  hello.mutable_hello()->set_version(v1::SHM_VERSION_1);
  EXPECT_EQ(a.Call(hello).hello().version(), v1::SHM_VERSION_1);
  EXPECT_EQ(b.Call(hello).hello().version(), v1::SHM_VERSION_1);

  // An unsealed memfd could shrink under the daemon's mapping.
  TestRegion unsealed(1 << 20, false);
  r = a.Call(Attach(1 << 20), unsealed.fd);
  EXPECT_EQ(r.code(), Code(absl::StatusCode::kFailedPrecondition));
  EXPECT_THAT(r.message(), HasSubstr("F_SEAL_SHRINK"));

  TestRegion region(1 << 20, true);
  std::memcpy(region.data, kv.data(), kv.size());
  r = a.Call(Attach(1 << 20), region.fd);
  ASSERT_EQ(r.code(), kOk) << r.message();
  const uint64_t id = r.attach_region().region_id();
  EXPECT_EQ(MappingsOf(daemon, name), 1);

  // Another connection cannot use it.
  r = b.Call(AppendFrom(tokens, sums, id, 0, kv.size()));
  EXPECT_EQ(r.code(), Code(absl::StatusCode::kNotFound)) << r.message();
  // Out of bounds, and the wrong length for the blocks.
  r = a.Call(AppendFrom(tokens, sums, id, (1 << 20) - 100, kv.size()));
  EXPECT_EQ(r.code(), Code(absl::StatusCode::kOutOfRange)) << r.message();
  r = a.Call(AppendFrom(tokens, sums, id, 0, kv.size() - 1));
  EXPECT_EQ(r.code(), Code(absl::StatusCode::kInvalidArgument)) << r.message();
  auto looked = grpc_->Lookup("m", tokens);
  ASSERT_TRUE(looked.ok());
  EXPECT_EQ(looked->matched_tokens, 0u) << "a refused append stored something";

  // A good append, then a fetch into a range too small for the prefix.
  r = a.Call(AppendFrom(tokens, sums, id, 0, kv.size()));
  ASSERT_EQ(r.code(), kOk) << r.message();
  EXPECT_EQ(r.append_from().stored_blocks(), 4u);
  std::memset(region.data + 512 * 1024, 0x5a, 4 * bb);
  r = a.Call(FetchInto(tokens, id, 512 * 1024, 4 * bb - 1));
  EXPECT_EQ(r.code(), Code(absl::StatusCode::kInvalidArgument));
  EXPECT_THAT(r.message(), HasSubstr(absl::StrCat("need ", 4 * bb)));
  for (uint64_t i = 0; i < 4 * bb; ++i) {
    ASSERT_EQ(region.data[512 * 1024 + i], std::byte{0x5a}) << "byte " << i << " was written";
  }
  r = a.Call(FetchInto(tokens, id, 512 * 1024, 4 * bb));
  ASSERT_EQ(r.code(), kOk) << r.message();
  EXPECT_EQ(std::memcmp(region.data + 512 * 1024, kv.data(), kv.size()), 0);

  // Closing the connection unmaps its regions; the id means nothing after.
  a.Close();
  EXPECT_TRUE(WaitUnmapped(daemon, name)) << "the daemon still maps the closed session's region";
  r = b.Call(FetchInto(tokens, id, 0, 4 * bb));
  EXPECT_EQ(r.code(), Code(absl::StatusCode::kNotFound));

  // A frame longer than the limit: refused, then the connection is closed.
  const char huge[4] = {'\xff', '\xff', '\xff', '\x7f'};
  ASSERT_EQ(::send(b.fd(), huge, 4, MSG_NOSIGNAL), 4);
  r = b.Read();
  EXPECT_EQ(r.code(), Code(absl::StatusCode::kResourceExhausted)) << r.message();
  EXPECT_EQ(b.Read().code(), -1) << "the connection stayed open";
}

TEST_F(ShmTest, ClientsFallBackOrFailWhenTheDaemonOffersNoSharedMemory) {
  auto plain = DaemonProcess::Start({.tcp = true, .extra_flags = {"--shm-socket", "none"}});
  ASSERT_TRUE(plain.ok()) << plain.status();
  std::unique_ptr<Client> automatic = (*plain)->NewClient("", DataPath::kAuto);
  EXPECT_FALSE(automatic->UsesSharedMemory());
  const v1::ModelLayout layout = MakeLayout(2, 2, 64, v1::DTYPE_FP16, 16);
  auto reg = automatic->RegisterModel("m", layout);
  ASSERT_TRUE(reg.ok());
  const auto tokens = MakeTokens(5, 32);
  const auto kv = MakeKv(tokens, 16, reg->block_bytes(), 0, 2);
  ASSERT_TRUE(automatic->Append("m", tokens, kv).ok());  // over gRPC
  std::unique_ptr<Client> required = (*plain)->NewClient("", DataPath::kSharedMemory);
  auto refused = required->Lookup("m", tokens);
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(refused.status().message(), HasSubstr("no shared-memory data plane"));
  EXPECT_EQ(automatic->CreateSharedRegion(4096).status().code(),
            absl::StatusCode::kFailedPrecondition);
  // A TCP client does not use it under kAuto, even on the same host.
  ClientOptions tcp;
  tcp.target = (*plain)->tcp_target();
  auto over_tcp = Client::Connect(tcp);
  ASSERT_TRUE(over_tcp.ok());
  EXPECT_FALSE((*over_tcp)->UsesSharedMemory());
  automatic.reset();
  required.reset();
  over_tcp->reset();
  EXPECT_EQ((*plain)->Stop(), 0);
}

#ifdef KVCACHE_BENCH_BINARY
// Runs kvcache-bench against the daemon; its exit code and output.
std::pair<int, std::string> Bench(const std::string& target, const std::string& args) {
  const std::string command =
      absl::StrCat(KVCACHE_BENCH_BINARY, " --target ", target, " ", args, " 2>&1");
  FILE* p = ::popen(command.c_str(), "r");
  std::string out;
  char buf[4096];
  while (p != nullptr && std::fgets(buf, sizeof(buf), p) != nullptr) out += buf;
  const int status = p == nullptr ? -1 : ::pclose(p);
  return {WIFEXITED(status) ? WEXITSTATUS(status) : 128, out};
}

TEST_F(ShmTest, WorkersKilledMidCallLeaveTheCacheCorrectAndTheirRegionsReleased) {
  const std::string layout = "--layers 8 --kv-heads 8 --head-dim 128 --block-tokens 16 ";
  const std::string common = layout + "--seed 77 --working-set 6 --blocks-per-seq 16 ";
  for (int round = 0; round < 3; ++round) {
    // A worker process appending and fetching 8 MiB sequences over shared
    // memory, SIGKILLed at a different moment each round.
    const pid_t worker = ::fork();
    ASSERT_GE(worker, 0);
    if (worker == 0) {
      const std::string duration = "30";
      ::execl(KVCACHE_BENCH_BINARY, KVCACHE_BENCH_BINARY, "mixed", "--target",
              daemon_->unix_target().c_str(), "--transport", "shm", "--clients", "3", "--duration",
              duration.c_str(), "--layers", "8", "--kv-heads", "8", "--head-dim", "128",
              "--block-tokens", "16", "--seed", "77", "--working-set", "6", "--blocks-per-seq",
              "16", "--mix", "50,0,50", static_cast<char*>(nullptr));
      ::_exit(127);
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(400 + 450 * round));
    ASSERT_EQ(::kill(worker, SIGKILL), 0);
    int status = 0;
    ASSERT_EQ(::waitpid(worker, &status, 0), worker);
    ASSERT_TRUE(WIFSIGNALED(status)) << "the worker ended before it was killed";
    ASSERT_TRUE(daemon_->Running());
    EXPECT_TRUE(WaitUnmapped(daemon_->pid(), "kvcache-region"))
        << "round " << round << ": the killed worker's regions are still mapped";
  }
  // The sequences the killed workers set up (same seed) are cached with
  // exactly their bytes: a fresh worker re-appends them (every block must be
  // a duplicate without conflict) and fetches and checks every byte.
  auto [code, out] =
      Bench(daemon_->unix_target(), "fetch --transport grpc --clients 3 --duration 1 " + common);
  EXPECT_EQ(code, 0) << out;
  EXPECT_THAT(out, Not(HasSubstr("WRONG BYTES")));
  auto stats = grpc_->GetStats();
  ASSERT_TRUE(stats.ok());
  EXPECT_EQ(stats->conflicting_appends(), 0u) << "a killed worker left other bytes cached";
}

TEST_F(ShmTest, SixteenWorkersVerifyEveryByteForTwentySeconds) {
  auto [code, out] =
      Bench(daemon_->unix_target(),
            "mixed --transport shm --clients 16 --duration 20 --layers 4 --kv-heads 4 "
            "--head-dim 128 --block-tokens 16 --blocks-per-seq 8 --working-set 8 --mix 30,20,50");
  EXPECT_EQ(code, 0) << out;
  EXPECT_THAT(out, Not(HasSubstr("WRONG BYTES")));
  EXPECT_THAT(out, HasSubstr("fetch"));
  EXPECT_TRUE(WaitUnmapped(daemon_->pid(), "kvcache-region"));
}

// Both front doors at once through the daemon's fair admission
// (limits.data_path_concurrency): every byte right on both, and neither path
// starved. The fairness rule itself (>= 0.5) is the soak's to check
// (tests/soak/soak.sh --check-fairness): a short run on a busy CI machine is
// too noisy for it; this floor catches a path that gets almost nothing.
TEST_F(ShmTest, BothDataPathsAtOnceAreServedAndVerified) {
  auto [code, out] =
      Bench(daemon_->unix_target(),
            "mixed --transport both --clients 8 --duration 4 --layers 4 --kv-heads 4 "
            "--head-dim 64 --block-tokens 16 --blocks-per-seq 4 --working-set 8");
  EXPECT_EQ(code, 0) << out;
  EXPECT_THAT(out, Not(HasSubstr("WRONG BYTES")));
  EXPECT_THAT(out, HasSubstr("path shm (4 workers)"));
  EXPECT_THAT(out, HasSubstr("path grpc (4 workers)"));
  const size_t at = out.find("per-worker throughput ratio (slower/faster) ");
  ASSERT_NE(at, std::string::npos) << out;
  const double ratio = std::strtod(out.c_str() + at + 44, nullptr);
  EXPECT_GT(ratio, 0.1) << out;
  EXPECT_TRUE(WaitUnmapped(daemon_->pid(), "kvcache-region"));
}
#endif  // KVCACHE_BENCH_BINARY

}  // namespace
}  // namespace kvcache::testing
