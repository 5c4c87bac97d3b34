// ClusterTopology: which master (and replicas) serves each of a Redis
// Cluster's 16384 hash slots, as a CLUSTER SLOTS reply describes it and as
// MOVED redirects correct it (the cluster specification, "Redirection and
// resharding"). ParseRedirect reads a MOVED or ASK error.
//
// Plain data: no connections. Thread-compatible.
#ifndef KVCACHE_SERVER_REMOTE_CLUSTER_TOPOLOGY_H_
#define KVCACHE_SERVER_REMOTE_CLUSTER_TOPOLOGY_H_

#include <array>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "server/remote/key_slot.h"
#include "server/remote/resp_value.h"

namespace kvcache {

struct NodeAddress {
  std::string host;
  uint16_t port = 0;

  std::string ToString() const;  // "host:port"
  bool operator==(const NodeAddress&) const = default;
};

// "HOST:PORT" (the last ':' splits, so an IPv6 host may hold others).
// INVALID_ARGUMENT naming `text` when it is not one.
absl::StatusOr<NodeAddress> ParseNodeAddress(std::string_view text);

struct Redirect {
  enum class Kind : uint8_t { kMoved, kAsk };
  Kind kind = Kind::kMoved;
  uint16_t slot = 0;
  NodeAddress to;
};

// The redirect an error reply carries ("MOVED 3999 127.0.0.1:6381", "ASK
// 3999 127.0.0.1:6381"); nullopt for any other error, or a malformed one. An
// endpoint without a host (":6381") is on the host of `from`, the node that
// answered.
std::optional<Redirect> ParseRedirect(std::string_view error, const NodeAddress& from);

class ClusterTopology {
 public:
  ClusterTopology() { slot_shard_.fill(kNoShard); }

  // From a CLUSTER SLOTS reply asked of `asked` (whose host stands for an
  // empty or "?" endpoint). INVALID_ARGUMENT, naming what, for a reply that
  // is not one; an empty reply is a cluster that serves no slot.
  static absl::StatusOr<ClusterTopology> FromClusterSlots(const RespValue& reply,
                                                          const NodeAddress& asked);

  // The master serving `slot`; null when none does.
  const NodeAddress* MasterOf(uint16_t slot) const;
  // Its replicas (empty when none, or no master).
  std::span<const NodeAddress> ReplicasOf(uint16_t slot) const;
  // A MOVED redirect's lesson: `slot` is served by `to` now.
  void Move(uint16_t slot, const NodeAddress& to);

  // Slots some master serves (16384 in a healthy cluster).
  int covered_slots() const;
  // Every master, in the order first met.
  std::vector<NodeAddress> masters() const;

 private:
  struct Shard {
    NodeAddress master;
    std::vector<NodeAddress> replicas;
  };
  static constexpr int16_t kNoShard = -1;
  // The shard whose master is `master` (added when there is none).
  int16_t ShardOf(const NodeAddress& master);

  std::vector<Shard> shards_;
  std::array<int16_t, kClusterSlots> slot_shard_;
};

}  // namespace kvcache

#endif  // KVCACHE_SERVER_REMOTE_CLUSTER_TOPOLOGY_H_
