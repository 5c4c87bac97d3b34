// ShmServer's event loop and worker pool, in process over a real Unix
// socket: 512 connections are served by the same few threads, requests on
// one connection are answered in order, and neither a peer that does not
// read its answers nor one that sends half a frame holds the only worker.
// (The daemon-level behaviour against hostile peers, timeouts and shutdown
// included, is tests/integration/shm_hostile_test.cc.)
#include "server/shm/shm_server.h"

#include <dirent.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "gtest/gtest.h"
#include "kvcache/shm_frame.h"
#include "kvcache/v1/shm.pb.h"
#include "server/core/slab_pool.h"

namespace kvcache {
namespace {

int ThreadsOfThisProcess() {
  DIR* dir = ::opendir("/proc/self/task");
  if (dir == nullptr) return -1;
  int n = 0;
  while (const dirent* e = ::readdir(dir)) n += e->d_name[0] != '.';
  ::closedir(dir);
  return n;
}

class ShmServerTest : public ::testing::Test {
 protected:
  void Start(uint32_t workers, uint32_t max_connections = 256) {
    auto pool = SlabPool::Create({.capacity_bytes = 16 << 20, .slab_bytes = 1 << 20});
    ASSERT_TRUE(pool.ok()) << pool.status();
    cache_ = std::make_unique<Cache>(CacheOptions{}, *std::move(pool), NewLruPolicy(), &clock_);
    ASSERT_TRUE(cache_->RegisterModel({"default", "m"}, {1, 1, 4, DType::kFp16, 16}).ok());
    path_ = absl::StrCat(::testing::TempDir(), "/shm_server_test.", ::getpid(), ".sock");
    auto server = ShmServer::Start(
        {.socket_path = path_, .max_connections = max_connections, .worker_threads = workers},
        cache_.get(), &observer_);
    ASSERT_TRUE(server.ok()) << server.status();
    server_ = *std::move(server);
  }
  void TearDown() override {
    for (int fd : fds_) ::close(fd);
    if (server_ != nullptr) server_->Shutdown();
  }

  int Connect() {
    const int fd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_un addr{};
    addr.sun_family = AF_UNIX;
    std::memcpy(addr.sun_path, path_.data(), path_.size());
    EXPECT_EQ(::connect(fd, reinterpret_cast<const sockaddr*>(&addr), sizeof(addr)), 0)
        << std::strerror(errno);
    fds_.push_back(fd);
    return fd;
  }
  static void Send(int fd, const v1::ShmRequest& request) {
    ASSERT_TRUE(shm::WriteFrame(fd, request).ok());
  }
  // The next answer on `fd`; code -1 when none came within `wait`.
  static v1::ShmResponse Read(int fd, absl::Duration wait = absl::Seconds(10)) {
    std::string body;
    std::vector<int> fds;
    v1::ShmResponse response;
    const absl::Status s = shm::ReadFrame(
        fd, shm::ReadOptions{.max_bytes = 1 << 20, .idle_timeout = wait, .frame_timeout = wait},
        &body, &fds);
    if (!s.ok()) {
      response.set_code(-1);
      response.set_message(std::string(s.message()));
    } else {
      EXPECT_TRUE(response.ParseFromString(body));
    }
    return response;
  }
  static v1::ShmRequest Hello() {
    v1::ShmRequest r;
    r.mutable_hello()->set_version(v1::SHM_VERSION_1);
    return r;
  }
  // A lookup of `n` tokens (a miss: nothing is cached).
  static v1::ShmRequest Lookup(uint32_t n) {
    v1::ShmRequest r;
    r.mutable_lookup()->set_model_id("m");
    for (uint32_t t = 0; t < n; ++t) r.mutable_lookup()->add_tokens(t);
    return r;
  }
  // Says hello on a new connection; returns it.
  int Greeted() {
    const int fd = Connect();
    Send(fd, Hello());
    EXPECT_EQ(Read(fd).code(), 0);
    return fd;
  }

  SystemClock clock_;
  NullRpcObserver observer_;
  std::unique_ptr<Cache> cache_;
  std::string path_;
  std::unique_ptr<ShmServer> server_;
  std::vector<int> fds_;
};

TEST_F(ShmServerTest, FiveHundredTwelveConnectionsAreServedByTheSameThreads) {
  Start(/*workers=*/4, /*max_connections=*/600);
  EXPECT_EQ(server_->threads(), 5);  // four workers and the janitor
  const int threads_before = ThreadsOfThisProcess();
  std::vector<int> connections;
  for (int i = 0; i < 512; ++i) connections.push_back(Connect());
  for (int fd : connections) Send(fd, Hello());
  for (int fd : connections) ASSERT_EQ(Read(fd).code(), 0);
  for (int fd : connections) Send(fd, Lookup(32));
  for (int fd : connections) {
    const v1::ShmResponse answer = Read(fd);
    ASSERT_EQ(answer.code(), 0) << answer.message();
    EXPECT_EQ(answer.lookup().matched_tokens(), 0u);
  }
  EXPECT_EQ(server_->connections(), 512);
  EXPECT_EQ(ThreadsOfThisProcess(), threads_before) << "connections got threads of their own";
}

TEST_F(ShmServerTest, PipelinedRequestsAreAnsweredInOrder) {
  Start(/*workers=*/4);
  const int fd = Greeted();
  // A lookup, a request that is not a hello but malformed (a lookup of an
  // unknown model), and a lookup again, sent before any answer is read.
  v1::ShmRequest unknown = Lookup(16);
  unknown.mutable_lookup()->set_model_id("no-such-model");
  Send(fd, Lookup(16));
  Send(fd, unknown);
  Send(fd, Lookup(48));
  EXPECT_EQ(Read(fd).code(), 0);
  EXPECT_EQ(Read(fd).code(), static_cast<int>(absl::StatusCode::kNotFound));
  const v1::ShmResponse third = Read(fd);
  EXPECT_EQ(third.code(), 0) << third.message();
  EXPECT_TRUE(third.has_lookup());
}

TEST_F(ShmServerTest, APeerThatDoesNotReadItsAnswersHoldsNoWorker) {
  Start(/*workers=*/1);
  const int flooder = Greeted();
  // Requests whose answers are never read, until the socket takes no more:
  // the answers fill the peer's receive buffer and wait in the server.
  std::string frame;
  ASSERT_TRUE(shm::EncodeFrame(Lookup(1024), &frame).ok());
  int sent = 0;
  for (; sent < 100000; ++sent) {
    if (::send(flooder, frame.data(), frame.size(), MSG_DONTWAIT | MSG_NOSIGNAL) !=
        static_cast<ssize_t>(frame.size())) {
      break;
    }
  }
  ASSERT_GT(sent, 10);
  absl::SleepFor(absl::Milliseconds(200));  // the server writes until the socket is full
  // The only worker still answers another connection at once.
  const int other = Greeted();
  const absl::Time start = absl::Now();
  Send(other, Lookup(16));
  EXPECT_EQ(Read(other, absl::Seconds(2)).code(), 0);
  EXPECT_LT(absl::Now() - start, absl::Seconds(1));
}

TEST_F(ShmServerTest, HalfAFrameHoldsNoWorker) {
  Start(/*workers=*/1);
  const int slow = Greeted();
  std::string frame;
  ASSERT_TRUE(shm::EncodeFrame(Lookup(16), &frame).ok());
  // Two bytes of the frame's four-byte header, then nothing for a while.
  ASSERT_EQ(::send(slow, frame.data(), 2, MSG_NOSIGNAL), 2);
  const int other = Greeted();
  Send(other, Lookup(16));
  EXPECT_EQ(Read(other, absl::Seconds(2)).code(), 0);
  // The rest of the frame completes the slow one's request.
  ASSERT_EQ(::send(slow, frame.data() + 2, frame.size() - 2, MSG_NOSIGNAL),
            static_cast<ssize_t>(frame.size() - 2));
  const v1::ShmResponse answer = Read(slow, absl::Seconds(2));
  EXPECT_EQ(answer.code(), 0) << answer.message();
  EXPECT_TRUE(answer.has_lookup());
}

}  // namespace
}  // namespace kvcache
