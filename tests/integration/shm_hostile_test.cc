// The shared-memory socket against hostile or broken peers, on the real
// daemon: headers that claim long frames and send nothing, strangers that
// never say hello, a peer that never reads its answers while the daemon shuts
// down, and the socket file's mode as the only gate (a supplementary member
// of the socket's group is served).
#include <fcntl.h>
#include <gmock/gmock.h>
#include <grp.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "kvcache/shm_frame.h"
#include "kvcache/v1/shm.pb.h"
#include "tests/integration/daemon_process.h"

namespace kvcache::testing {
namespace {

using ::testing::HasSubstr;

uint64_t RssBytes(pid_t pid) {
  std::ifstream in(absl::StrCat("/proc/", pid, "/status"));
  for (std::string line; std::getline(in, line);) {
    if (line.rfind("VmRSS:", 0) == 0) return std::stoull(line.substr(6)) * 1024;
  }
  return 0;
}

int Connect(const std::string& path) {
  const int fd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  std::memcpy(addr.sun_path, path.data(), path.size());
  if (::connect(fd, reinterpret_cast<const sockaddr*>(&addr), sizeof(addr)) != 0) {
    ::close(fd);
    return -1;
  }
  return fd;
}

// The daemon's answer on `fd` (waiting at most `wait`), or code -1 and why
// none came (-2 when nothing came within `wait`).
v1::ShmResponse ReadAnswer(int fd, absl::Duration wait = absl::Seconds(10)) {
  std::string body;
  std::vector<int> fds;
  v1::ShmResponse response;
  absl::Status s = shm::ReadFrame(
      fd, shm::ReadOptions{.max_bytes = 1 << 20, .idle_timeout = wait, .frame_timeout = wait},
      &body, &fds);
  if (!s.ok()) {
    response.set_code(absl::IsDeadlineExceeded(s) ? -2 : -1);
    response.set_message(std::string(s.message()));
  } else {
    EXPECT_TRUE(response.ParseFromString(body));
  }
  return response;
}

v1::ShmResponse Hello(int fd) {
  v1::ShmRequest hello;
  hello.mutable_hello()->set_version(v1::SHM_VERSION_1);
  EXPECT_TRUE(shm::WriteFrame(fd, hello).ok());
  return ReadAnswer(fd);
}

void SendHeader(int fd, uint32_t length) {
  char h[4];
  for (int i = 0; i < 4; ++i) h[i] = static_cast<char>((length >> (8 * i)) & 0xff);
  ASSERT_EQ(::send(fd, h, 4, MSG_NOSIGNAL), 4);
}

std::unique_ptr<DaemonProcess> StartWith(const std::string& config_json,
                                         DaemonOptions options = {}) {
  const std::string config = absl::StrCat(::testing::TempDir(), "/shm_hostile_", ::getpid(), "_",
                                          absl::ToUnixNanos(absl::Now()), ".json");
  std::ofstream(config) << config_json;
  options.extra_flags.insert(options.extra_flags.end(), {"--config", config});
  auto d = DaemonProcess::Start(options);
  EXPECT_TRUE(d.ok()) << d.status();
  return d.ok() ? *std::move(d) : nullptr;
}

TEST(ShmHostileTest, HeadersClaimingLongFramesCostLittleAndAreCutOffAfterTheDeadline) {
  auto daemon = StartWith(R"({"shm": {"hello_timeout_ms": 1500, "io_timeout_ms": 1500}})");
  ASSERT_NE(daemon, nullptr);
  const std::string path = daemon->socket_path() + ".shm";
  const pid_t pid = daemon->pid();
  // Warm up the daemon's own allocations (a connection thread, a session).
  {
    const int fd = Connect(path);
    ASSERT_GE(fd, 0);
    ASSERT_EQ(Hello(fd).code(), 0);
    ::close(fd);
  }
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  const uint64_t rss_before = RssBytes(pid);

  // 8 peers that said hello claim 64 MiB frames and send nothing more: on
  // a daemon that sized the buffer from the header that was 512 MiB.
  std::vector<int> greeted;
  for (int i = 0; i < 8; ++i) {
    const int fd = Connect(path);
    ASSERT_GE(fd, 0);
    ASSERT_EQ(Hello(fd).code(), 0);
    SendHeader(fd, 64u << 20);
    ASSERT_EQ(::send(fd, "x", 1, MSG_NOSIGNAL), 1);
    greeted.push_back(fd);
  }
  // 8 strangers claim the same before any hello: refused at once.
  for (int i = 0; i < 8; ++i) {
    const int fd = Connect(path);
    ASSERT_GE(fd, 0);
    SendHeader(fd, 64u << 20);
    v1::ShmResponse r = ReadAnswer(fd);
    EXPECT_EQ(r.code(), static_cast<int>(absl::StatusCode::kResourceExhausted)) << r.message();
    EXPECT_THAT(r.message(), HasSubstr("limit of 16384"));
    ::close(fd);
  }
  // And 8 strangers that connect and send nothing at all.
  std::vector<int> silent;
  for (int i = 0; i < 8; ++i) {
    const int fd = Connect(path);
    ASSERT_GE(fd, 0);
    silent.push_back(fd);
  }
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  const uint64_t rss_during = RssBytes(pid);
  std::cout << "[ shm_hostile ] daemon VmRSS " << (rss_before >> 20) << " MiB before, "
            << (rss_during >> 20) << " MiB with 8 frames of 64 MiB claimed" << std::endl;
  EXPECT_LT(rss_during, rss_before + (uint64_t{32} << 20))
      << "frames claimed but not sent cost the daemon memory";

  // All are cut off after their deadline (1.5 s): the daemon closes them.
  const absl::Time start = absl::Now();
  for (int fd : greeted) {
    v1::ShmResponse r = ReadAnswer(fd, absl::Seconds(10));
    EXPECT_EQ(r.code(), -1) << "a stalled frame was not cut off: " << r.message();
    ::close(fd);
  }
  for (int fd : silent) {
    v1::ShmResponse r = ReadAnswer(fd, absl::Seconds(10));
    EXPECT_EQ(r.code(), -1) << "a peer without hello was not cut off: " << r.message();
    ::close(fd);
  }
  EXPECT_LT(absl::Now() - start, absl::Seconds(6));
  EXPECT_EQ(daemon->Stop(), 0);
}

TEST(ShmHostileTest, TheFirstRequestMustBeAHello) {
  auto daemon = StartWith("{}");
  ASSERT_NE(daemon, nullptr);
  const int fd = Connect(daemon->socket_path() + ".shm");
  ASSERT_GE(fd, 0);
  v1::ShmRequest lookup;
  lookup.mutable_lookup()->set_model_id("m");
  ASSERT_TRUE(shm::WriteFrame(fd, lookup).ok());
  v1::ShmResponse r = ReadAnswer(fd);
  EXPECT_EQ(r.code(), static_cast<int>(absl::StatusCode::kFailedPrecondition)) << r.message();
  EXPECT_THAT(r.message(), HasSubstr("hello"));
  EXPECT_EQ(Hello(fd).code(), 0);
  ::close(fd);
  EXPECT_EQ(daemon->Stop(), 0);
}

// Sends 5-byte frames that are not requests until the socket stays full for
// 500 ms (the daemon, whose answers are not read, stopped reading); how many.
int FloodWithoutReading(int fd) {
  const std::string junk("\x01\x00\x00\x00\xff", 5);
  absl::Time last_sent = absl::Now();
  int sent = 0;
  while (absl::Now() - last_sent < absl::Milliseconds(500) && sent < 1000000) {
    if (::send(fd, junk.data(), junk.size(), MSG_NOSIGNAL | MSG_DONTWAIT) ==
        static_cast<ssize_t>(junk.size())) {
      ++sent;
      last_sent = absl::Now();
    } else {
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
  }
  return sent;
}

TEST(ShmHostileTest, AStrangerThatNeverReadsIsCutOffAtTheHelloDeadline) {
  // Answers to a greeted peer could wait 10 minutes; a stranger's 1 s.
  auto daemon = StartWith(R"({"shm": {"hello_timeout_ms": 1000, "io_timeout_ms": 600000}})");
  ASSERT_NE(daemon, nullptr);
  const int fd = Connect(daemon->socket_path() + ".shm");
  ASSERT_GE(fd, 0);
  ASSERT_GT(FloodWithoutReading(fd), 100);
  // The daemon's thread is blocked answering; it must give up and close.
  const absl::Time start = absl::Now();
  bool closed = false;
  while (!closed && absl::Now() - start < absl::Seconds(10)) {
    const char byte = 0;
    if (::send(fd, &byte, 1, MSG_NOSIGNAL | MSG_DONTWAIT) < 0 &&
        (errno == EPIPE || errno == ECONNRESET)) {
      closed = true;
    } else {
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
  }
  EXPECT_TRUE(closed) << "a stranger that never reads kept its connection";
  EXPECT_LT(absl::Now() - start, absl::Seconds(5));
  ::close(fd);
  EXPECT_EQ(daemon->Stop(), 0);
}

TEST(ShmHostileTest, ShutdownWithAPeerThatNeverReadsEndsWithinTheDrainBound) {
  // Writes to the peer would wait 10 minutes; the drain bound is 500 ms.
  auto daemon = StartWith(
      R"({"shm": {"io_timeout_ms": 600000, "drain_timeout_ms": 500}, "drain_timeout_seconds": 1})");
  ASSERT_NE(daemon, nullptr);
  const int fd = Connect(daemon->socket_path() + ".shm");
  ASSERT_GE(fd, 0);
  ASSERT_EQ(Hello(fd).code(), 0);
  // Requests whose answers are never read, until the daemon stops taking them
  // (its answers fill the socket; the next one waits in the daemon, which
  // reads no more of the connection's requests until it is sent).
  const int sent = FloodWithoutReading(fd);
  ASSERT_GT(sent, 100);
  const absl::Time start = absl::Now();
  ::kill(daemon->pid(), SIGTERM);
  while (daemon->Running() && absl::Now() - start < absl::Seconds(15)) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  const absl::Duration took = absl::Now() - start;
  EXPECT_FALSE(daemon->Running()) << "the daemon did not stop with a peer that never reads";
  EXPECT_LT(took, absl::Seconds(5)) << "shutdown took " << took;
  std::ifstream log(daemon->log_path());
  const std::string text((std::istreambuf_iterator<char>(log)), std::istreambuf_iterator<char>());
  EXPECT_THAT(text, HasSubstr("cut off the connection of pid"));
  ::close(fd);
}

// The socket file's mode is the gate: a process whose primary group is not
// the socket's but that is a supplementary member of it connects and is served.
TEST(ShmHostileTest, ASupplementaryMemberOfTheSocketsGroupIsServed) {
  if (::geteuid() != 0) GTEST_SKIP() << "needs root to run a peer as another user";
  const group* users = ::getgrnam("users");
  if (users == nullptr) GTEST_SKIP() << "no group \"users\" on this host";
  const gid_t gid = users->gr_gid;
  // A folder others may pass through, for the sockets.
  char dir_template[] = "/tmp/kvcache-shm-gate-XXXXXX";
  ASSERT_NE(::mkdtemp(dir_template), nullptr);
  const std::string dir = dir_template;
  ASSERT_EQ(::chmod(dir.c_str(), 0711), 0);
  auto daemon = StartWith(R"({"listen": {"socket_group": "users"}})",
                          {.unix_socket = dir + "/kvcached.sock"});
  ASSERT_NE(daemon, nullptr);
  const std::string path = daemon->socket_path() + ".shm";
  struct stat st {};
  ASSERT_EQ(::stat(path.c_str(), &st), 0);
  EXPECT_EQ(st.st_gid, gid);
  EXPECT_EQ(st.st_mode & 0777, 0660u);

  // The peer: uid and primary gid nobody's, "users" as a supplementary group.
  auto run_peer = [&](bool member) {
    const pid_t child = ::fork();
    if (child == 0) {
      const gid_t groups[] = {gid};
      if (::setgroups(member ? 1 : 0, groups) != 0 || ::setgid(65534) != 0 ||
          ::setuid(65534) != 0) {
        ::_exit(10);
      }
      const int fd = Connect(path);
      if (fd < 0) ::_exit(11);
      v1::ShmRequest hello;
      hello.mutable_hello()->set_version(v1::SHM_VERSION_1);
      if (!shm::WriteFrame(fd, hello).ok()) ::_exit(12);
      std::string body;
      std::vector<int> fds;
      if (!shm::ReadFrame(fd, 1 << 20, &body, &fds).ok()) ::_exit(13);
      v1::ShmResponse r;
      if (!r.ParseFromString(body) || r.code() != 0) ::_exit(14);
      ::_exit(0);
    }
    int status = 0;
    ::waitpid(child, &status, 0);
    return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  };
  EXPECT_EQ(run_peer(true), 0) << "a supplementary member of the socket's group was not served";
  EXPECT_EQ(run_peer(false), 11) << "someone outside the socket's group could connect";
  EXPECT_EQ(daemon->Stop(), 0);
  std::error_code ignored;
  std::filesystem::remove_all(dir, ignored);
}

}  // namespace
}  // namespace kvcache::testing
