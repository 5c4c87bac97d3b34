#include "server/remote/cluster_client.h"

#include <algorithm>
#include <optional>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"

namespace kvcache {
namespace {

// Where one command of a batch goes next.
struct Pending {
  size_t index = 0;                // in the batch
  std::optional<NodeAddress> ask;  // set: ASKING first, to this node
  int hops = 0;                    // redirects and failed nodes met
};

}  // namespace

absl::StatusOr<std::unique_ptr<ClusterClient>> ClusterClient::Connect(
    ClusterClientOptions options) {
  if (options.seeds.empty()) {
    return absl::InvalidArgumentError("a Redis Cluster client needs at least one seed node");
  }
  std::unique_ptr<ClusterClient> client(new ClusterClient(std::move(options)));
  std::vector<std::string> reasons;
  for (const NodeAddress& seed : client->options_.seeds) {
    const absl::Status read = client->ReadSlotsFrom(seed);
    if (read.ok()) return client;
    reasons.push_back(std::string(read.message()));
  }
  return absl::UnavailableError(absl::StrCat("no seed of the Redis Cluster gave its slot map: ",
                                             absl::StrJoin(reasons, "; ")));
}

absl::StatusOr<RedisNode*> ClusterClient::NodeAt(const NodeAddress& address) {
  const std::string key = address.ToString();
  auto it = nodes_.find(key);
  if (it != nodes_.end() && !it->second->broken()) return it->second.get();
  absl::StatusOr<std::unique_ptr<RedisNode>> node = RedisNode::Connect(address, options_.node);
  if (!node.ok()) {
    ++stats_.node_failures;
    if (it != nodes_.end()) nodes_.erase(it);
    return node.status();
  }
  if (options_.read_from_replicas) {
    // Lets a replica answer reads of its slots (a master ignores it).
    absl::StatusOr<RespValue> readonly = (*node)->Run({"READONLY"});
    if (!readonly.ok()) {
      ++stats_.node_failures;
      if (it != nodes_.end()) nodes_.erase(it);
      return readonly.status();
    }
  }
  ++stats_.connects;
  RedisNode* raw = node->get();
  nodes_[key] = *std::move(node);
  return raw;
}

void ClusterClient::DropNode(const NodeAddress& address) {
  ++stats_.node_failures;
  nodes_.erase(address.ToString());
}

absl::Status ClusterClient::ReadSlotsFrom(const NodeAddress& address) {
  absl::StatusOr<RedisNode*> node = NodeAt(address);
  if (!node.ok()) return node.status();
  absl::StatusOr<RespValue> reply = (*node)->Run({"CLUSTER", "SLOTS"});
  if (!reply.ok()) {
    DropNode(address);
    return reply.status();
  }
  if (reply->is_error()) {
    return absl::FailedPreconditionError(
        absl::StrCat(address.ToString(), " answered CLUSTER SLOTS with ", reply->str));
  }
  absl::StatusOr<ClusterTopology> topology = ClusterTopology::FromClusterSlots(*reply, address);
  if (!topology.ok()) return topology.status();
  if (topology->covered_slots() == 0) {
    return absl::FailedPreconditionError(
        absl::StrCat(address.ToString(), " knows no node that serves a slot"));
  }
  topology_ = *std::move(topology);
  ++stats_.refreshes;
  refreshed_at_ = absl::Now();
  return absl::OkStatus();
}

absl::Status ClusterClient::Refresh(absl::Time deadline) {
  std::vector<NodeAddress> candidates = topology_.masters();
  for (const NodeAddress& seed : options_.seeds) {
    if (std::find(candidates.begin(), candidates.end(), seed) == candidates.end()) {
      candidates.push_back(seed);
    }
  }
  absl::Status last = absl::UnavailableError("no node to ask for the slot map");
  for (const NodeAddress& node : candidates) {
    if (absl::Now() >= deadline) {
      return absl::UnavailableError(
          absl::StrCat("the deadline passed reading the slot map; last: ", last.message()));
    }
    last = ReadSlotsFrom(node);
    if (last.ok()) return last;
  }
  return last;
}

absl::StatusOr<RespValue> ClusterClient::Run(const KeyedCommand& command, absl::Time deadline) {
  return std::move(Run(std::span<const KeyedCommand>(&command, 1), deadline).front());
}

std::vector<absl::StatusOr<RespValue>> ClusterClient::Run(std::span<const KeyedCommand> commands,
                                                          absl::Time deadline) {
  stats_.commands += commands.size();
  if (absl::Now() - refreshed_at_ >= options_.refresh_interval) (void)Refresh(deadline);
  std::vector<absl::StatusOr<RespValue>> results(commands.size(),
                                                 absl::UnavailableError("not sent"));
  std::vector<Pending> pending;
  pending.reserve(commands.size());
  for (size_t i = 0; i < commands.size(); ++i) pending.push_back({.index = i});
  const auto give_up = [&](const Pending& p, const std::string& why) {
    ++stats_.unavailable;
    results[p.index] = absl::UnavailableError(
        absl::StrCat("redis cluster: ", why, " (key slot ", KeySlot(commands[p.index].key), ")"));
  };
  while (!pending.empty()) {
    if (absl::Now() >= deadline) {
      for (const Pending& p : pending) give_up(p, "the deadline passed");
      break;
    }
    // One pipeline per node: the commands whose slot it serves, and those
    // an ASK sent to it.
    absl::flat_hash_map<std::string, std::pair<NodeAddress, std::vector<Pending>>> by_node;
    for (Pending& p : pending) {
      const uint16_t slot = KeySlot(commands[p.index].key);
      const NodeAddress* to = p.ask.has_value() ? &*p.ask : topology_.MasterOf(slot);
      // A read's first try goes to a replica, when asked for and there is one.
      if (!p.ask.has_value() && p.hops == 0 && options_.read_from_replicas &&
          commands[p.index].read_only) {
        const std::span<const NodeAddress> replicas = topology_.ReplicasOf(slot);
        if (!replicas.empty()) {
          to = &replicas[next_replica_++ % replicas.size()];
          ++stats_.replica_reads;
        }
      }
      if (to == nullptr) {
        give_up(p, "no node serves the slot");
        continue;
      }
      auto& group = by_node[to->ToString()];
      group.first = *to;
      group.second.push_back(std::move(p));
    }
    std::vector<Pending> again;
    bool refresh = false;
    bool pause = false;
    for (auto& [key, group] : by_node) {
      const NodeAddress& address = group.first;
      std::vector<Pending>& members = group.second;
      if (absl::Now() >= deadline) {
        for (const Pending& p : members) give_up(p, "the deadline passed");
        continue;
      }
      const auto retry_all = [&](const std::string& why) {
        for (Pending& p : members) {
          if (++p.hops > options_.max_redirects) {
            give_up(p, why);
          } else {
            again.push_back(std::move(p));
          }
        }
      };
      absl::StatusOr<RedisNode*> node = NodeAt(address);
      if (!node.ok()) {
        refresh = true;
        retry_all(std::string(node.status().message()));
        continue;
      }
      std::vector<RedisCommand> batch;
      batch.reserve(members.size());
      for (const Pending& p : members) {
        if (p.ask.has_value()) batch.push_back({"ASKING"});
        batch.push_back(commands[p.index].command);
      }
      absl::StatusOr<std::vector<RespValue>> replies = (*node)->Pipeline(batch);
      if (!replies.ok()) {
        DropNode(address);
        refresh = true;
        retry_all(std::string(replies.status().message()));
        continue;
      }
      size_t r = 0;
      for (Pending& p : members) {
        if (p.ask.has_value()) ++r;  // ASKING's +OK
        RespValue& reply = (*replies)[r++];
        if (!reply.is_error()) {
          results[p.index] = std::move(reply);
          continue;
        }
        std::optional<Redirect> redirect = ParseRedirect(reply.str, address);
        const bool try_again = reply.str.starts_with("TRYAGAIN");
        if (!redirect.has_value() && !try_again) {
          results[p.index] = std::move(reply);  // the command's own error
          continue;
        }
        if (++p.hops > options_.max_redirects) {
          give_up(p, absl::StrCat("redirected more than ", options_.max_redirects, " times"));
          continue;
        }
        p.ask.reset();
        if (try_again) {
          ++stats_.try_again;
          pause = true;
        } else if (redirect->kind == Redirect::Kind::kMoved) {
          ++stats_.moved;
          topology_.Move(redirect->slot, redirect->to);
          refresh = true;
        } else {
          ++stats_.asked;
          p.ask = redirect->to;
        }
        again.push_back(std::move(p));
      }
    }
    if (refresh) (void)Refresh(deadline);  // best effort: MOVED already taught the map
    if (pause) absl::SleepFor(options_.try_again_pause);
    pending = std::move(again);
  }
  return results;
}

}  // namespace kvcache
