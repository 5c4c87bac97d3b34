// The client's shared-memory side against a fake daemon that can stall:
// no lock is held across socket I/O (a region dropped while its detach hangs,
// a probe that hangs), and a kAuto fallback is written once and counted.
#include "shm_transport.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <atomic>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <string>
#include <thread>
#include <vector>

#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "kvcache/client.h"
#include "kvcache/shm_frame.h"

namespace kvcache::internal {
namespace {

using ::testing::HasSubstr;

// A daemon's shared-memory socket that answers hello, attach_region and
// append_from, and stalls detach_region (or the hello) until released.
class FakeDaemon {
 public:
  explicit FakeDaemon(bool stall_hello = false) : stall_hello_(stall_hello) {
    char dir[] = "/tmp/kvcache-shm-transport-XXXXXX";
    EXPECT_NE(::mkdtemp(dir), nullptr);
    dir_ = dir;
    path_ = dir_ + "/daemon.sock.shm";
    listener_ = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_un addr{};
    addr.sun_family = AF_UNIX;
    std::memcpy(addr.sun_path, path_.data(), path_.size());
    EXPECT_EQ(::bind(listener_, reinterpret_cast<const sockaddr*>(&addr), sizeof(addr)), 0);
    EXPECT_EQ(::listen(listener_, 16), 0);
    acceptor_ = std::thread([this] { Accept(); });
  }
  ~FakeDaemon() {
    Release();
    ::shutdown(listener_, SHUT_RDWR);
    acceptor_.join();
    for (std::thread& t : served_) t.join();
    ::close(listener_);
    std::filesystem::remove_all(dir_);
  }
  const std::string& path() const { return path_; }
  // A stalled request has arrived.
  absl::Notification& stalled() { return stalled_; }
  void Release() {
    if (!released_.HasBeenNotified()) released_.Notify();
  }
  void StallDetaches() { stall_detach_ = true; }

 private:
  void Accept() {
    for (;;) {
      const int fd = ::accept4(listener_, nullptr, nullptr, SOCK_CLOEXEC);
      if (fd < 0) return;
      served_.emplace_back([this, fd] { Serve(fd); });
    }
  }
  void Stall() {
    if (!stalled_.HasBeenNotified()) stalled_.Notify();
    released_.WaitForNotification();
  }
  void Serve(int fd) {
    uint64_t next_id = 1;
    for (;;) {
      std::string body;
      std::vector<int> fds;
      if (!shm::ReadFrame(fd, 1 << 20, &body, &fds).ok()) break;
      for (int f : fds) ::close(f);
      v1::ShmRequest request;
      v1::ShmResponse response;
      if (!request.ParseFromString(body)) break;
      switch (request.op_case()) {
        case v1::ShmRequest::kHello:
          if (stall_hello_) Stall();
          response.mutable_hello()->set_version(v1::SHM_VERSION_1);
          response.mutable_hello()->set_max_frame_bytes(1 << 20);
          break;
        case v1::ShmRequest::kAttachRegion:
          response.mutable_attach_region()->set_region_id(next_id++);
          break;
        case v1::ShmRequest::kDetachRegion:
          if (stall_detach_) Stall();
          response.mutable_detach_region();
          break;
        default:
          response.mutable_append_from();
          break;
      }
      if (!shm::WriteFrame(fd, response).ok()) break;
    }
    ::close(fd);
  }

  const bool stall_hello_;
  std::atomic<bool> stall_detach_{false};
  std::string dir_;
  std::string path_;
  int listener_ = -1;
  std::thread acceptor_;
  std::vector<std::thread> served_;  // joined after the acceptor ends
  absl::Notification stalled_;
  absl::Notification released_;
};

TEST(ShmTransportTest, ADetachThatHangsBlocksNoOtherCall) {
  FakeDaemon daemon;
  auto transport = ShmTransport::Open(
      {.socket_path = daemon.path(), .max_connections = 4, .timeout = absl::Seconds(3)});
  ASSERT_TRUE(transport.ok()) << transport.status();
  auto region = (*transport)->CreateRegion(4096);
  ASSERT_TRUE(region.ok()) << region.status();
  // Attach it on the pooled connection (an append from its bytes).
  ASSERT_TRUE((*transport)->Append(v1::AppendHeader(), (*region)->bytes()).ok());
  daemon.StallDetaches();
  // Dropping the region detaches it on the idle connection; the daemon stalls.
  std::thread dropper([&] { region->reset(); });
  daemon.stalled().WaitForNotification();
  // Meanwhile other calls run: the dropping thread holds no lock.
  const absl::Time start = absl::Now();
  auto other = (*transport)->CreateRegion(4096);
  EXPECT_TRUE(other.ok()) << other.status();
  EXPECT_LT(absl::Now() - start, absl::Seconds(2)) << "CreateRegion waited for a detach";
  daemon.Release();
  dropper.join();
}

TEST(ShmTransportTest, AProbeThatHangsBlocksNoOtherCallAndAFallbackIsWrittenOnce) {
  FakeDaemon daemon(/*stall_hello=*/true);
  ClientOptions options;
  options.target = "unix:///nonexistent/kvcached.sock";  // the gRPC path is never used here
  options.shm_socket = daemon.path();
  options.timeout = absl::Seconds(3);
  auto client = Client::Connect(options);
  ASSERT_TRUE(client.ok()) << client.status();
  ::testing::internal::CaptureStderr();
  std::thread prober([&] { EXPECT_FALSE((*client)->UsesSharedMemory()); });
  daemon.stalled().WaitForNotification();
  // While the probe hangs in its hello, another call is not held up.
  const absl::Time start = absl::Now();
  EXPECT_FALSE((*client)->UsesSharedMemory());
  EXPECT_LT(absl::Now() - start, absl::Seconds(1)) << "a call waited for another's probe";
  prober.join();  // its hello timed out: gRPC from now on
  daemon.Release();
  for (int i = 0; i < 5; ++i) EXPECT_FALSE((*client)->UsesSharedMemory());
  const std::string written = ::testing::internal::GetCapturedStderr();
  EXPECT_THAT(written, HasSubstr("is offered but not usable"));
  EXPECT_EQ(written.find("kvcache client:"), written.rfind("kvcache client:"))
      << "the fallback was written more than once:\n"
      << written;
  const DataPathStats stats = (*client)->GetDataPathStats();
  EXPECT_FALSE(stats.shared_memory);
  EXPECT_EQ(stats.shm_probes, 1u);
  EXPECT_EQ(stats.grpc_fallbacks, 7u);
  EXPECT_THAT(stats.fallback_reason, HasSubstr("shared-memory connection failed"));
}

}  // namespace
}  // namespace kvcache::internal
