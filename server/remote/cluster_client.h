// ClusterClient: commands to a Redis Cluster, each sent to the master that
// serves its key's slot, batched into one pipeline per node.
//
// It reads the slot map (CLUSTER SLOTS) from the first seed that answers,
// connects to each master when first needed, and follows the cluster's
// redirects (the cluster specification, "Redirection and resharding"):
//
//   MOVED slot host:port   the slot lives elsewhere now: the map learns it,
//                          the command goes there, and the whole map is read
//                          again once the batch is done
//   ASK slot host:port     the slot is migrating and this key has left:
//                          ASKING, then the command, to that node, once
//                          (the map is unchanged)
//   TRYAGAIN               a multi-key command met a slot mid-migration:
//                          sent again after a short pause
//
// A node that cannot be reached, or whose connection fails, is dropped (a
// later command connects anew) and the map is read again; a command whose
// node stays unreachable, or that is redirected more than max_redirects
// times, gets UNAVAILABLE. Nothing waits longer than the node timeouts
// allow (RedisNodeOptions): a cluster in trouble costs a bounded wait, then
// errors, never a hang.
//
// Thread-compatible: one thread at a time (an I/O thread owns one).
#ifndef KVCACHE_SERVER_REMOTE_CLUSTER_CLIENT_H_
#define KVCACHE_SERVER_REMOTE_CLUSTER_CLIENT_H_

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "server/remote/cluster_topology.h"
#include "server/remote/redis_node.h"

namespace kvcache {

struct ClusterClientOptions {
  std::vector<NodeAddress> seeds;  // any nodes of the cluster; >= 1
  RedisNodeOptions node;
  // Redirects (or failed nodes) a command may meet before it fails.
  int max_redirects = 5;
  absl::Duration try_again_pause = absl::Milliseconds(10);
  // Read-only commands (KeyedCommand::read_only) go to a replica of their
  // slot, in turn, when it has one (every connection sends READONLY); a
  // redirect or a failed replica sends them on to the master. A replica may
  // lag its master: a read there can miss what was just written.
  bool read_from_replicas = false;
  // The slot map is read again at the first Run this long after the last
  // read, besides after each MOVED or failed node: learns what changes
  // without a redirect (replicas added, or listed once they have replicated
  // something: Redis leaves a replica that has not out of CLUSTER SLOTS).
  absl::Duration refresh_interval = absl::Seconds(10);
};

// A command and the key that decides its slot (a word of the command).
struct KeyedCommand {
  std::string key;
  RedisCommand command;
  bool read_only = false;  // a replica may answer it (read_from_replicas)
};

class ClusterClient {
 public:
  // Counters since creation.
  struct Stats {
    uint64_t commands = 0;
    uint64_t moved = 0;          // MOVED replies followed
    uint64_t asked = 0;          // ASK replies followed
    uint64_t try_again = 0;      // TRYAGAIN replies waited out
    uint64_t refreshes = 0;      // slot maps read (the first included)
    uint64_t connects = 0;       // connections opened
    uint64_t node_failures = 0;  // connections that failed or could not open
    uint64_t unavailable = 0;    // commands answered UNAVAILABLE
    uint64_t replica_reads = 0;  // commands sent to a replica
  };

  // INVALID_ARGUMENT without seeds; UNAVAILABLE (with each seed's reason)
  // when no seed gives a slot map.
  static absl::StatusOr<std::unique_ptr<ClusterClient>> Connect(ClusterClientOptions options);

  // Runs `commands`, pipelined per master; result i is commands[i]'s reply
  // (an error reply of the command itself is a value) or UNAVAILABLE. No
  // new step (a pipeline, a connection, a slot map read) starts after
  // `deadline`: what is left then is UNAVAILABLE, so the whole call takes
  // at most about `deadline` plus one step's timeouts.
  std::vector<absl::StatusOr<RespValue>> Run(std::span<const KeyedCommand> commands,
                                             absl::Time deadline = absl::InfiniteFuture());
  absl::StatusOr<RespValue> Run(const KeyedCommand& command,
                                absl::Time deadline = absl::InfiniteFuture());

  // Reads the slot map again, from the known masters first, then the seeds
  // (each node once), asking none after `deadline`. UNAVAILABLE when none
  // answers (the old map is kept).
  absl::Status Refresh(absl::Time deadline = absl::InfiniteFuture());

  const ClusterTopology& topology() const { return topology_; }
  const Stats& stats() const { return stats_; }

 private:
  explicit ClusterClient(ClusterClientOptions options) : options_(std::move(options)) {}

  // The open connection to `address`, opened if needed; why not (counted)
  // when it cannot be: unreachable, or AUTH refused.
  absl::StatusOr<RedisNode*> NodeAt(const NodeAddress& address);
  void DropNode(const NodeAddress& address);
  // The slot map as `address` sees it.
  absl::Status ReadSlotsFrom(const NodeAddress& address);

  const ClusterClientOptions options_;
  ClusterTopology topology_;
  uint64_t next_replica_ = 0;  // read_from_replicas: which replica the next read asks
  absl::Time refreshed_at_ = absl::InfinitePast();                      // the last slot map read
  absl::flat_hash_map<std::string, std::unique_ptr<RedisNode>> nodes_;  // by "host:port"
  Stats stats_;
};

}  // namespace kvcache

#endif  // KVCACHE_SERVER_REMOTE_CLUSTER_CLIENT_H_
