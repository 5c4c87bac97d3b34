// RedisNode: one connection to one Redis server (hiredis, blocking, with
// timeouts), which sends a batch of commands at once and reads their replies
// in order (a pipeline: one round trip for the batch).
//
// A failure of the connection itself (refused, timed out, reset, a reply
// that cannot be read) is UNAVAILABLE and leaves the node broken(): it is
// never used again, and its owner connects anew. Error replies (-ERR,
// -MOVED, ...) are values, not failures.
//
// Thread-compatible: one thread at a time.
#ifndef KVCACHE_SERVER_REMOTE_REDIS_NODE_H_
#define KVCACHE_SERVER_REMOTE_REDIS_NODE_H_

#include <memory>
#include <span>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "server/remote/cluster_topology.h"
#include "server/remote/resp_value.h"

struct redisContext;

namespace kvcache {

// A command's words ("SET", key, value, ...); binary-safe.
using RedisCommand = std::vector<std::string>;

struct RedisNodeOptions {
  absl::Duration connect_timeout = absl::Milliseconds(200);
  // Each read or write on the socket (so a batch's whole round trip is
  // bounded by about twice this, for a reply that comes in time).
  absl::Duration io_timeout = absl::Milliseconds(500);
  // AUTH on connect when set: `password` alone, or `user` and `password`
  // (Redis 6 ACLs).
  std::string user;
  std::string password;
};

class RedisNode {
 public:
  // UNAVAILABLE when `address` cannot be reached in time; PERMISSION_DENIED
  // when AUTH is refused.
  static absl::StatusOr<std::unique_ptr<RedisNode>> Connect(const NodeAddress& address,
                                                            const RedisNodeOptions& options);
  ~RedisNode();
  RedisNode(const RedisNode&) = delete;
  RedisNode& operator=(const RedisNode&) = delete;

  // Sends `commands` and reads one reply for each, in order. UNAVAILABLE
  // (the node broken) when the connection fails part way.
  absl::StatusOr<std::vector<RespValue>> Pipeline(std::span<const RedisCommand> commands);
  absl::StatusOr<RespValue> Run(const RedisCommand& command);

  const NodeAddress& address() const { return address_; }
  bool broken() const { return broken_; }

 private:
  RedisNode(NodeAddress address, redisContext* context);
  absl::Status Broke(const char* doing);

  const NodeAddress address_;
  redisContext* const context_;
  bool broken_ = false;
};

}  // namespace kvcache

#endif  // KVCACHE_SERVER_REMOTE_REDIS_NODE_H_
