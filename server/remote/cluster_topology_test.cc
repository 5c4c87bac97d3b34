// The cluster specification's cases: key slots (with hash tags), redirects,
// and CLUSTER SLOTS replies, good and malformed. (cluster_client_test checks
// KeySlot against a real cluster's CLUSTER KEYSLOT.)
#include "server/remote/cluster_topology.h"

#include <gtest/gtest.h>

#include "server/remote/key_slot.h"

namespace kvcache {
namespace {

TEST(KeySlotTest, Crc16IsTheXmodemVariant) {
  EXPECT_EQ(Crc16Xmodem("123456789"), 0x31C3);
  EXPECT_EQ(Crc16Xmodem(""), 0);
}

TEST(KeySlotTest, SlotsOfKnownKeys) {
  EXPECT_EQ(KeySlot("foo"), 12182);
  EXPECT_EQ(KeySlot("somekey"), 11058);
  EXPECT_EQ(KeySlot(""), 0);
}

TEST(KeySlotTest, HashTagsAsTheSpecificationDefinesThem) {
  EXPECT_EQ(HashTagOf("{user1000}.following"), "user1000");
  EXPECT_EQ(KeySlot("{user1000}.following"), KeySlot("{user1000}.followers"));
  EXPECT_EQ(HashTagOf("foo{}{bar}"), "foo{}{bar}");  // an empty first tag: the whole key
  EXPECT_EQ(HashTagOf("foo{{bar}}zap"), "{bar");
  EXPECT_EQ(HashTagOf("foo{bar}{zap}"), "bar");
  EXPECT_EQ(HashTagOf("no tag}{"), "no tag}{");  // '}' before '{', none after
  EXPECT_EQ(HashTagOf("{open"), "{open");
}

TEST(RedirectTest, MovedAndAsk) {
  const NodeAddress from{.host = "10.0.0.1", .port = 7000};
  std::optional<Redirect> moved = ParseRedirect("MOVED 3999 127.0.0.1:6381", from);
  ASSERT_TRUE(moved.has_value());
  EXPECT_EQ(moved->kind, Redirect::Kind::kMoved);
  EXPECT_EQ(moved->slot, 3999);
  EXPECT_EQ(moved->to, (NodeAddress{.host = "127.0.0.1", .port = 6381}));
  std::optional<Redirect> ask = ParseRedirect("ASK 16383 ::1:6390", from);
  ASSERT_TRUE(ask.has_value());
  EXPECT_EQ(ask->kind, Redirect::Kind::kAsk);
  EXPECT_EQ(ask->slot, 16383);
  EXPECT_EQ(ask->to, (NodeAddress{.host = "::1", .port = 6390}));
  // No host: the host of the node that answered.
  std::optional<Redirect> same_host = ParseRedirect("MOVED 1 :7001", from);
  ASSERT_TRUE(same_host.has_value());
  EXPECT_EQ(same_host->to, (NodeAddress{.host = "10.0.0.1", .port = 7001}));
}

TEST(RedirectTest, AnythingElseIsNotARedirect) {
  const NodeAddress from{.host = "h", .port = 1};
  for (const char* error :
       {"ERR unknown command", "MOVED", "MOVED 3999", "MOVED 16384 h:1", "MOVED -1 h:1",
        "MOVED x h:1", "MOVED 1 h", "MOVED 1 h:0", "MOVED 1 h:65536", "ASK 1 h:port",
        "TRYAGAIN Multiple keys request during rehashing of slot", "moved 1 h:1"}) {
    EXPECT_FALSE(ParseRedirect(error, from).has_value()) << error;
  }
}

RespValue Node(std::string host, int64_t port) {
  return RespValue::Array({RespValue::String(std::move(host)), RespValue::Integer(port),
                           RespValue::String("0123456789abcdef")});
}
RespValue Range(int64_t first, int64_t last, std::vector<RespValue> nodes) {
  std::vector<RespValue> e = {RespValue::Integer(first), RespValue::Integer(last)};
  for (RespValue& n : nodes) e.push_back(std::move(n));
  return RespValue::Array(std::move(e));
}

TEST(ClusterTopologyTest, ReadsMastersAndReplicasOfEachRange) {
  const NodeAddress asked{.host = "10.0.0.9", .port = 7000};
  const RespValue reply = RespValue::Array({
      Range(0, 5460, {Node("10.0.0.1", 7000), Node("10.0.0.4", 7003)}),
      Range(5461, 10922, {Node("10.0.0.2", 7001)}),
      Range(10923, 16000, {Node("", 7002), Node("?", 7005)}),
      Range(16001, 16383, {Node("10.0.0.1", 7000)}),  // a second range of the first master
  });
  absl::StatusOr<ClusterTopology> t = ClusterTopology::FromClusterSlots(reply, asked);
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_EQ(t->covered_slots(), kClusterSlots);
  EXPECT_EQ(t->masters().size(), 3u);
  EXPECT_EQ(*t->MasterOf(0), (NodeAddress{.host = "10.0.0.1", .port = 7000}));
  EXPECT_EQ(*t->MasterOf(16383), (NodeAddress{.host = "10.0.0.1", .port = 7000}));
  ASSERT_EQ(t->ReplicasOf(5460).size(), 1u);
  EXPECT_EQ(t->ReplicasOf(5460)[0], (NodeAddress{.host = "10.0.0.4", .port = 7003}));
  EXPECT_TRUE(t->ReplicasOf(5461).empty());
  // Empty and "?" endpoints: the node asked.
  EXPECT_EQ(*t->MasterOf(12000), (NodeAddress{.host = "10.0.0.9", .port = 7002}));
  EXPECT_EQ(t->ReplicasOf(12000)[0], (NodeAddress{.host = "10.0.0.9", .port = 7005}));
}

TEST(ClusterTopologyTest, MoveTeachesOneSlot) {
  absl::StatusOr<ClusterTopology> t = ClusterTopology::FromClusterSlots(
      RespValue::Array({Range(0, 16383, {Node("a", 1)})}), {.host = "a", .port = 1});
  ASSERT_TRUE(t.ok()) << t.status();
  t->Move(42, {.host = "b", .port = 2});
  EXPECT_EQ(*t->MasterOf(42), (NodeAddress{.host = "b", .port = 2}));
  EXPECT_EQ(*t->MasterOf(41), (NodeAddress{.host = "a", .port = 1}));
  EXPECT_EQ(t->masters().size(), 2u);
  t->Move(43, {.host = "b", .port = 2});
  EXPECT_EQ(t->masters().size(), 2u);  // the same master, not a new one
}

TEST(ClusterTopologyTest, SlotsNoRangeCoversHaveNoMaster) {
  absl::StatusOr<ClusterTopology> t = ClusterTopology::FromClusterSlots(
      RespValue::Array({Range(0, 99, {Node("a", 1)})}), {.host = "a", .port = 1});
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_EQ(t->covered_slots(), 100);
  EXPECT_EQ(t->MasterOf(100), nullptr);
  EXPECT_TRUE(t->ReplicasOf(100).empty());
  absl::StatusOr<ClusterTopology> empty =
      ClusterTopology::FromClusterSlots(RespValue::Array({}), {.host = "a", .port = 1});
  ASSERT_TRUE(empty.ok());
  EXPECT_EQ(empty->covered_slots(), 0);
}

TEST(ClusterTopologyTest, MalformedRepliesAreRefused) {
  const NodeAddress asked{.host = "a", .port = 1};
  const std::vector<RespValue> bad = {
      RespValue::Error("ERR This instance has cluster support disabled"),
      RespValue::Array({RespValue::Integer(1)}),
      RespValue::Array({Range(0, 10, {})}),
      RespValue::Array({Range(10, 0, {Node("a", 1)})}),
      RespValue::Array({Range(0, 16384, {Node("a", 1)})}),
      RespValue::Array({Range(-1, 5, {Node("a", 1)})}),
      RespValue::Array({Range(0, 5, {Node("a", 0)})}),
      RespValue::Array({Range(0, 5, {Node("a", 70000)})}),
      RespValue::Array({Range(0, 5, {RespValue::Array({RespValue::String("a")})})}),
      RespValue::Array({Range(0, 5, {Node("a", 1), RespValue::String("replica")})}),
  };
  for (size_t i = 0; i < bad.size(); ++i) {
    EXPECT_EQ(ClusterTopology::FromClusterSlots(bad[i], asked).status().code(),
              absl::StatusCode::kInvalidArgument)
        << i;
  }
}

TEST(NodeAddressTest, ParsesHostAndPort) {
  EXPECT_EQ(*ParseNodeAddress("127.0.0.1:6379"), (NodeAddress{.host = "127.0.0.1", .port = 6379}));
  EXPECT_EQ(ParseNodeAddress("127.0.0.1:6379")->ToString(), "127.0.0.1:6379");
  for (const char* bad : {"", "host", "host:", "host:0", "host:65536", "host:12ab"}) {
    EXPECT_FALSE(ParseNodeAddress(bad).ok()) << bad;
  }
}

}  // namespace
}  // namespace kvcache
