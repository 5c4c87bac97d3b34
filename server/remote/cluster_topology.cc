#include "server/remote/cluster_topology.h"

#include <charconv>

#include "absl/strings/str_cat.h"

namespace kvcache {
namespace {

bool ParseNumber(std::string_view text, uint64_t max, uint64_t* out) {
  if (text.empty()) return false;
  const auto [end, error] = std::from_chars(text.data(), text.data() + text.size(), *out);
  return error == std::errc() && end == text.data() + text.size() && *out <= max;
}

// One node of a CLUSTER SLOTS range: [host, port, id, ...].
absl::StatusOr<NodeAddress> NodeOf(const RespValue& v, const NodeAddress& asked) {
  if (v.type != RespValue::Type::kArray || v.elements.size() < 2 ||
      v.elements[0].type != RespValue::Type::kString ||
      v.elements[1].type != RespValue::Type::kInteger || v.elements[1].integer <= 0 ||
      v.elements[1].integer > 65535) {
    return absl::InvalidArgumentError(
        "CLUSTER SLOTS: a node is not [host, port, ...] with a port in 1..65535");
  }
  NodeAddress node{.host = v.elements[0].str, .port = static_cast<uint16_t>(v.elements[1].integer)};
  // An unknown endpoint: the node asked.
  if (node.host.empty() || node.host == "?") node.host = asked.host;
  return node;
}

}  // namespace

std::string NodeAddress::ToString() const { return absl::StrCat(host, ":", port); }

absl::StatusOr<NodeAddress> ParseNodeAddress(std::string_view text) {
  const size_t colon = text.rfind(':');
  uint64_t port = 0;
  if (colon == std::string_view::npos || !ParseNumber(text.substr(colon + 1), 65535, &port) ||
      port == 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("\"", std::string(text), "\" is not HOST:PORT with a port in 1..65535"));
  }
  return NodeAddress{.host = std::string(text.substr(0, colon)),
                     .port = static_cast<uint16_t>(port)};
}

std::optional<Redirect> ParseRedirect(std::string_view error, const NodeAddress& from) {
  Redirect r;
  if (error.starts_with("MOVED ")) {
    r.kind = Redirect::Kind::kMoved;
    error.remove_prefix(6);
  } else if (error.starts_with("ASK ")) {
    r.kind = Redirect::Kind::kAsk;
    error.remove_prefix(4);
  } else {
    return std::nullopt;
  }
  const size_t space = error.find(' ');
  uint64_t slot = 0;
  if (space == std::string_view::npos ||
      !ParseNumber(error.substr(0, space), kClusterSlots - 1, &slot)) {
    return std::nullopt;
  }
  absl::StatusOr<NodeAddress> to = ParseNodeAddress(error.substr(space + 1));
  if (!to.ok()) return std::nullopt;
  if (to->host.empty()) to->host = from.host;
  r.slot = static_cast<uint16_t>(slot);
  r.to = *std::move(to);
  return r;
}

absl::StatusOr<ClusterTopology> ClusterTopology::FromClusterSlots(const RespValue& reply,
                                                                  const NodeAddress& asked) {
  if (reply.type != RespValue::Type::kArray) {
    return absl::InvalidArgumentError("CLUSTER SLOTS: the reply is not an array");
  }
  ClusterTopology topology;
  for (const RespValue& range : reply.elements) {
    if (range.type != RespValue::Type::kArray || range.elements.size() < 3 ||
        range.elements[0].type != RespValue::Type::kInteger ||
        range.elements[1].type != RespValue::Type::kInteger) {
      return absl::InvalidArgumentError(
          "CLUSTER SLOTS: a range is not [first slot, last slot, master, replicas...]");
    }
    const int64_t first = range.elements[0].integer;
    const int64_t last = range.elements[1].integer;
    if (first < 0 || last < first || last >= kClusterSlots) {
      return absl::InvalidArgumentError(
          absl::StrCat("CLUSTER SLOTS: the range ", first, "..", last, " is not within 0..16383"));
    }
    absl::StatusOr<NodeAddress> master = NodeOf(range.elements[2], asked);
    if (!master.ok()) return master.status();
    const int16_t shard = topology.ShardOf(*master);
    for (size_t i = 3; i < range.elements.size(); ++i) {
      absl::StatusOr<NodeAddress> replica = NodeOf(range.elements[i], asked);
      if (!replica.ok()) return replica.status();
      std::vector<NodeAddress>& replicas = topology.shards_[shard].replicas;
      if (std::find(replicas.begin(), replicas.end(), *replica) == replicas.end()) {
        replicas.push_back(*std::move(replica));
      }
    }
    for (int64_t s = first; s <= last; ++s) topology.slot_shard_[s] = shard;
  }
  return topology;
}

const NodeAddress* ClusterTopology::MasterOf(uint16_t slot) const {
  const int16_t shard = slot_shard_[slot % kClusterSlots];
  return shard == kNoShard ? nullptr : &shards_[shard].master;
}

std::span<const NodeAddress> ClusterTopology::ReplicasOf(uint16_t slot) const {
  const int16_t shard = slot_shard_[slot % kClusterSlots];
  if (shard == kNoShard) return {};
  return shards_[shard].replicas;
}

void ClusterTopology::Move(uint16_t slot, const NodeAddress& to) {
  slot_shard_[slot % kClusterSlots] = ShardOf(to);
}

int ClusterTopology::covered_slots() const {
  int n = 0;
  for (const int16_t shard : slot_shard_) n += shard != kNoShard ? 1 : 0;
  return n;
}

std::vector<NodeAddress> ClusterTopology::masters() const {
  std::vector<NodeAddress> out;
  out.reserve(shards_.size());
  for (const Shard& s : shards_) out.push_back(s.master);
  return out;
}

int16_t ClusterTopology::ShardOf(const NodeAddress& master) {
  for (size_t i = 0; i < shards_.size(); ++i) {
    if (shards_[i].master == master) return static_cast<int16_t>(i);
  }
  shards_.push_back({.master = master, .replicas = {}});
  return static_cast<int16_t>(shards_.size() - 1);
}

}  // namespace kvcache
