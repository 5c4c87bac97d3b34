// The shared-memory framing against a hostile peer on a socketpair: too many
// descriptors, cut ancillary data, long headers with no bytes behind them,
// and peers that stall before or inside a frame.
#include "kvcache/shm_frame.h"

#include <fcntl.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "kvcache/v1/shm.pb.h"

namespace kvcache::shm {
namespace {

// Descriptors open in this process.
int OpenFds() {
  int n = 0;
  for (int fd = 0; fd < 4096; ++fd) {
    if (::fcntl(fd, F_GETFD) != -1) ++n;
  }
  return n;
}

class ShmFrameTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_EQ(::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, pair_), 0);
    ASSERT_EQ(::pipe2(pipe_, O_CLOEXEC), 0);
  }
  void TearDown() override {
    for (int fd : {pair_[0], pair_[1], pipe_[0], pipe_[1]}) {
      if (fd >= 0) ::close(fd);
    }
  }
  // Sends `bytes` with `n` copies of a descriptor attached, in one sendmsg.
  void SendWithFds(const std::string& bytes, int n) {
    iovec iov{const_cast<char*>(bytes.data()), bytes.size()};
    msghdr msg{};
    msg.msg_iov = &iov;
    msg.msg_iovlen = 1;
    std::vector<char> control(CMSG_SPACE(sizeof(int) * n));
    if (n > 0) {
      msg.msg_control = control.data();
      msg.msg_controllen = control.size();
      cmsghdr* c = CMSG_FIRSTHDR(&msg);
      c->cmsg_level = SOL_SOCKET;
      c->cmsg_type = SCM_RIGHTS;
      c->cmsg_len = CMSG_LEN(sizeof(int) * n);
      for (int i = 0; i < n; ++i) std::memcpy(CMSG_DATA(c) + i * sizeof(int), &pipe_[0], 4);
    }
    ASSERT_EQ(::sendmsg(pair_[1], &msg, MSG_NOSIGNAL), static_cast<ssize_t>(bytes.size()));
  }
  static std::string Header(uint32_t length) {
    std::string h(4, '\0');
    for (int i = 0; i < 4; ++i) h[i] = static_cast<char>((length >> (8 * i)) & 0xff);
    return h;
  }

  int pair_[2] = {-1, -1};
  int pipe_[2] = {-1, -1};
};

TEST_F(ShmFrameTest, AFrameWithItsDescriptorReadsBack) {
  v1::ShmRequest request;
  request.mutable_attach_region()->set_bytes(4096);
  ASSERT_TRUE(WriteFrame(pair_[1], request, pipe_[0]).ok());
  std::string body;
  std::vector<int> fds;
  ASSERT_TRUE(ReadFrame(pair_[0], ReadOptions{}, &body, &fds).ok());
  v1::ShmRequest back;
  ASSERT_TRUE(back.ParseFromString(body));
  EXPECT_EQ(back.attach_region().bytes(), 4096u);
  ASSERT_EQ(fds.size(), 1u);
  ::close(fds[0]);
}

TEST_F(ShmFrameTest, DescriptorsPastTheLimitFailTheFrameAndAreAllClosed) {
  const int before = OpenFds();
  // One byte per sendmsg, each with descriptors: the limit is per frame.
  const std::string frame = Header(8) + std::string(8, 'x');
  for (char c : frame) SendWithFds(std::string(1, c), 2);
  std::string body;
  std::vector<int> fds;
  absl::Status s = ReadFrame(pair_[0], ReadOptions{}, &body, &fds);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  EXPECT_TRUE(fds.empty());
  EXPECT_EQ(OpenFds(), before) << "the reader kept descriptors of a refused frame";
}

TEST_F(ShmFrameTest, AncillaryDataCutByTheKernelFailsTheFrame) {
  const int before = OpenFds();
  SendWithFds(Header(1) + "x", kMaxFrameFds + 3);  // more than the reader's buffer holds
  std::string body;
  std::vector<int> fds;
  absl::Status s = ReadFrame(pair_[0], ReadOptions{}, &body, &fds);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  EXPECT_NE(s.message().find("cut"), std::string_view::npos) << s;
  EXPECT_TRUE(fds.empty());
  EXPECT_EQ(OpenFds(), before);
}

TEST_F(ShmFrameTest, ABrokenFrameClosesItsDescriptors) {
  SendWithFds(Header(100) + "abc", 1);
  ::close(pair_[1]);
  pair_[1] = -1;
  const int before = OpenFds();
  std::string body;
  std::vector<int> fds;
  absl::Status s = ReadFrame(pair_[0], ReadOptions{}, &body, &fds);
  EXPECT_EQ(s.code(), absl::StatusCode::kUnavailable) << s;
  EXPECT_TRUE(fds.empty());
  EXPECT_EQ(OpenFds(), before);
}

TEST_F(ShmFrameTest, ALongHeaderCostsOnlyWhatArrived) {
  // 64 MiB claimed, 10 bytes sent: the reader waits with a small buffer.
  SendWithFds(Header(64u << 20) + std::string(10, 'y'), 0);
  std::string body;
  std::vector<int> fds;
  absl::Status s = ReadFrame(
      pair_[0], ReadOptions{.max_bytes = 64u << 20, .frame_timeout = absl::Milliseconds(50)}, &body,
      &fds);
  EXPECT_EQ(s.code(), absl::StatusCode::kDeadlineExceeded) << s;
  EXPECT_LE(body.capacity(), 2 * kReadStepBytes);
}

TEST_F(ShmFrameTest, AFrameArrivingInPiecesGrowsItsBufferAndReadsWhole) {
  const std::string payload(3 * kReadStepBytes + 17, 'z');
  v1::ShmRequest request;
  request.mutable_append_from()->mutable_header()->set_model_id(payload);
  const std::string bytes = request.SerializeAsString();
  const std::string frame = Header(static_cast<uint32_t>(bytes.size())) + bytes;
  std::thread writer([&] {
    for (size_t at = 0; at < frame.size(); at += 1000) {
      const size_t n = std::min<size_t>(1000, frame.size() - at);
      ASSERT_EQ(::send(pair_[1], frame.data() + at, n, MSG_NOSIGNAL), static_cast<ssize_t>(n));
    }
  });
  std::string body;
  std::vector<int> fds;
  absl::Status s =
      ReadFrame(pair_[0], ReadOptions{.frame_timeout = absl::Seconds(30)}, &body, &fds);
  writer.join();
  ASSERT_TRUE(s.ok()) << s;
  EXPECT_EQ(body, bytes);
}

TEST_F(ShmFrameTest, APeerThatSendsNothingMeetsTheIdleDeadline) {
  std::string body;
  std::vector<int> fds;
  absl::Status s =
      ReadFrame(pair_[0], ReadOptions{.idle_timeout = absl::Milliseconds(20)}, &body, &fds);
  EXPECT_EQ(s.code(), absl::StatusCode::kDeadlineExceeded) << s;
  EXPECT_NE(s.message().find("no shared-memory frame began"), std::string_view::npos) << s;
}

TEST_F(ShmFrameTest, TheAbsoluteDeadlineBoundsAFrameAlreadyBegun) {
  // The frame began, and would have all the time in the world by its own
  // timeout; the connection's deadline ends it.
  SendWithFds(Header(100) + "ab", 0);
  std::string body;
  std::vector<int> fds;
  const absl::Time start = absl::Now();
  absl::Status s = ReadFrame(
      pair_[0], ReadOptions{.deadline = absl::Now() + absl::Milliseconds(30)}, &body, &fds);
  EXPECT_EQ(s.code(), absl::StatusCode::kDeadlineExceeded) << s;
  EXPECT_NE(s.message().find("the connection's deadline"), std::string_view::npos) << s;
  EXPECT_LT(absl::Now() - start, absl::Seconds(5));
}

TEST_F(ShmFrameTest, ALongerFrameThanTheLimitIsRefusedBeforeItsBytes) {
  SendWithFds(Header(4097), 0);
  std::string body;
  std::vector<int> fds;
  absl::Status s = ReadFrame(pair_[0], ReadOptions{.max_bytes = 4096}, &body, &fds);
  EXPECT_EQ(s.code(), absl::StatusCode::kResourceExhausted) << s;
}

TEST_F(ShmFrameTest, AWriteToAPeerThatNeverReadsTimesOut) {
  const timeval tv{0, 20000};
  ASSERT_EQ(::setsockopt(pair_[1], SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv)), 0);
  v1::ShmRequest request;
  request.mutable_append_from()->mutable_header()->set_model_id(std::string(8 << 20, 'a'));
  absl::Status s = WriteFrame(pair_[1], request);
  EXPECT_EQ(s.code(), absl::StatusCode::kUnavailable) << s;
  EXPECT_NE(s.message().find("timed out"), std::string_view::npos) << s;
}

// ---- FrameAssembler: the same frames, read without blocking ---------------------

TEST_F(ShmFrameTest, AnAssemblerReadsAFrameInPiecesAndStopsAtItsEnd) {
  const std::string first = Header(5) + "hello";
  const std::string second = Header(3) + "abc";
  FrameAssembler frame(1 << 20);
  // Nothing sent yet: nothing to do, nothing begun.
  absl::StatusOr<bool> whole = frame.ReadAvailable(pair_[0]);
  ASSERT_TRUE(whole.ok()) << whole.status();
  EXPECT_FALSE(*whole);
  EXPECT_FALSE(frame.begun());
  // Two bytes of the header, then the rest of the first frame and all of the
  // second (pipelined) with a descriptor on the first frame's last piece.
  ASSERT_EQ(::send(pair_[1], first.data(), 2, MSG_NOSIGNAL), 2);
  whole = frame.ReadAvailable(pair_[0]);
  ASSERT_TRUE(whole.ok());
  EXPECT_FALSE(*whole);
  EXPECT_TRUE(frame.begun());
  SendWithFds(first.substr(2), 1);
  ASSERT_EQ(::send(pair_[1], second.data(), second.size(), MSG_NOSIGNAL),
            static_cast<ssize_t>(second.size()));
  whole = frame.ReadAvailable(pair_[0]);
  ASSERT_TRUE(whole.ok()) << whole.status();
  ASSERT_TRUE(*whole);
  EXPECT_EQ(frame.body(), "hello");
  std::vector<int> fds = frame.TakeFds();
  ASSERT_EQ(fds.size(), 1u);
  ::close(fds[0]);
  // The second frame was left in the socket, whole.
  frame.Reset(1 << 20);
  whole = frame.ReadAvailable(pair_[0]);
  ASSERT_TRUE(whole.ok()) << whole.status();
  ASSERT_TRUE(*whole);
  EXPECT_EQ(frame.body(), "abc");
  EXPECT_TRUE(frame.TakeFds().empty());
}

TEST_F(ShmFrameTest, AnAssemblerRefusesALongFrameAndClosesDescriptorsItDidNotHandOver) {
  const int before = OpenFds();
  {
    FrameAssembler frame(4);
    SendWithFds(Header(5) + "hello", 2);
    absl::StatusOr<bool> whole = frame.ReadAvailable(pair_[0]);
    EXPECT_EQ(whole.status().code(), absl::StatusCode::kResourceExhausted) << whole.status();
  }
  EXPECT_EQ(OpenFds(), before) << "the assembler kept descriptors of a refused frame";
}

TEST_F(ShmFrameTest, AnAssemblerTellsAClosedConnectionFromOneThatBrokeOff) {
  FrameAssembler idle(1 << 20);
  ::shutdown(pair_[1], SHUT_WR);
  absl::StatusOr<bool> whole = idle.ReadAvailable(pair_[0]);
  EXPECT_EQ(whole.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(std::string(whole.status().message()), ::testing::HasSubstr("is closed"));

  int other[2];
  ASSERT_EQ(::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, other), 0);
  const std::string part = Header(10) + "abc";
  ASSERT_EQ(::send(other[1], part.data(), part.size(), MSG_NOSIGNAL),
            static_cast<ssize_t>(part.size()));
  ::close(other[1]);
  FrameAssembler cut(1 << 20);
  whole = cut.ReadAvailable(other[0]);
  EXPECT_EQ(whole.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(std::string(whole.status().message()), ::testing::HasSubstr("broke off"));
  ::close(other[0]);
}

}  // namespace
}  // namespace kvcache::shm
