// UnixPeers: credentials read at accept stay bound to their connection, and a
// descriptor number that gRPC closed and the kernel handed out again never
// names the new connection's peer to a late call of the old one.
#include "server/rpc/unix_peers.h"

#include <fcntl.h>
#include <sys/socket.h>
#include <unistd.h>

#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "server/rpc/unix_acceptor.h"

namespace kvcache {
namespace {

// One end of a new connected Unix socket pair (the other end is kept open in
// `peers`, as a client would keep its end).
int Connection(std::vector<int>* peers) {
  int fds[2];
  EXPECT_EQ(::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, fds), 0);
  peers->push_back(fds[1]);
  return fds[0];
}

class UnixPeersTest : public ::testing::Test {
 protected:
  ~UnixPeersTest() override {
    for (int fd : clients_) ::close(fd);
  }
  ManualClock clock_;
  std::vector<int> clients_;
};

TEST_F(UnixPeersTest, AReusedDescriptorNeverNamesTheNewcomer) {
  UnixPeers peers({.quarantine = absl::Minutes(1), .clock = &clock_});
  const absl::StatusOr<int> first = peers.Adopt(Connection(&clients_));
  ASSERT_TRUE(first.ok()) << first.status();
  EXPECT_EQ(peers.UidOf(*first), ::getuid());
  EXPECT_EQ(peers.UidOf(*first + 1000), std::nullopt);

  // gRPC closes the first connection's descriptor while a call of it is
  // still to run; the kernel gives the number to the next connection.
  ::close(*first);
  EXPECT_EQ(peers.UidOf(*first), std::nullopt);
  const int reused = Connection(&clients_);
  ASSERT_EQ(reused, *first) << "the kernel hands out the lowest free number";
  const absl::StatusOr<int> second = peers.Adopt(reused);
  ASSERT_TRUE(second.ok()) << second.status();
  EXPECT_NE(*second, *first);  // gRPC gets another number...
  EXPECT_EQ(peers.UidOf(*second), ::getuid());
  EXPECT_EQ(peers.UidOf(*first), std::nullopt);  // ...and the late call no uid
  EXPECT_EQ(peers.quarantined(), 1u);
  // The held number is no connection: nothing new lands on it.
  const int third = Connection(&clients_);
  EXPECT_NE(third, *first);
  ::close(third);

  // After the quarantine the number is free again, for a fresh connection.
  clock_.Advance(absl::Minutes(2));
  ::close(*second);
  const absl::StatusOr<int> fourth = peers.Adopt(Connection(&clients_));
  ASSERT_TRUE(fourth.ok());
  EXPECT_EQ(peers.quarantined(), 1u);  // *first released, *second (reused) held now
  EXPECT_EQ(peers.UidOf(*fourth), ::getuid());
  ::close(*fourth);
}

TEST_F(UnixPeersTest, ANumberTakenByAnotherFileNamesNobody) {
  UnixPeers peers({.clock = &clock_});
  const absl::StatusOr<int> adopted = peers.Adopt(Connection(&clients_));
  ASSERT_TRUE(adopted.ok());
  ::close(*adopted);
  const int file = ::open("/dev/zero", O_RDONLY | O_CLOEXEC);
  ASSERT_EQ(file, *adopted);
  EXPECT_EQ(peers.UidOf(file), std::nullopt);
  ::close(file);
}

TEST_F(UnixPeersTest, HoldsAtMostMaxQuarantined) {
  UnixPeers peers({.quarantine = absl::Hours(1), .max_quarantined = 2, .clock = &clock_});
  int last = -1;
  for (int i = 0; i < 6; ++i) {
    if (last >= 0) ::close(last);
    const absl::StatusOr<int> adopted = peers.Adopt(Connection(&clients_));
    ASSERT_TRUE(adopted.ok());
    last = *adopted;
  }
  EXPECT_LE(peers.quarantined(), 2u);
  ::close(last);
}

TEST(PeerUidOfTest, ReadsTheProcessTableOnlyForFdPeers) {
  std::vector<int> clients;
  const absl::StatusOr<int> adopted = UnixPeers::Process().Adopt(Connection(&clients));
  ASSERT_TRUE(adopted.ok());
  EXPECT_EQ(PeerUidOf(absl::StrCat("fd:", *adopted)), ::getuid());
  EXPECT_EQ(PeerUidOf(absl::StrCat("ipv4:127.0.0.1:", *adopted)), std::nullopt);
  EXPECT_EQ(PeerUidOf("fd:x"), std::nullopt);
  // A socket the acceptor never adopted names nobody, whoever is behind it.
  const int stranger = Connection(&clients);
  EXPECT_EQ(PeerUidOf(absl::StrCat("fd:", stranger)), std::nullopt);
  ::close(stranger);
  ::close(*adopted);
  for (int fd : clients) ::close(fd);
}

}  // namespace
}  // namespace kvcache
