// The remote tier kvcached starts from its config (remote_tier): a store on
// the Redis Cluster that the seeds name, and the sharing of the cache's
// blocks through it (server/remote, docs/scale-out.md). Off unless
// remote_tier.seeds is set.
//
// A key file or password file that cannot be read stops the start (a
// daemon keyed differently from its peers would share nothing); a cluster
// that cannot be reached does not: the daemon serves from its own tiers,
// logs why, and uses the cluster once it answers.
#ifndef KVCACHE_SERVER_DAEMON_REMOTE_TIER_H_
#define KVCACHE_SERVER_DAEMON_REMOTE_TIER_H_

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "kvcache/v1/admin.pb.h"
#include "kvcache/v1/config.pb.h"
#include "server/core/cache.h"
#include "server/remote/remote_sharing.h"
#include "server/remote/remote_store.h"

namespace kvcache {

class RemoteTier {
 public:
  // Null when remote_tier is off. REQUIRES: `cache` outlives the tier;
  // `config` passed ValidateConfig.
  static absl::StatusOr<std::unique_ptr<RemoteTier>> Start(const v1::RemoteTierConfig& config,
                                                           Cache* cache);

  // What the front doors tell of appends and short lookups.
  SharedTier* shared() { return sharing_.get(); }
  const RemoteSharing& sharing() const { return *sharing_; }
  // What GetServerInfo and the status page show of it.
  v1::RemoteTierStatus Status() const;

 private:
  RemoteTier(std::vector<std::string> seeds, std::unique_ptr<RemoteStore> store,
             std::unique_ptr<RemoteSharing> sharing)
      : seeds_(std::move(seeds)), store_(std::move(store)), sharing_(std::move(sharing)) {}

  const std::vector<std::string> seeds_;
  std::unique_ptr<RemoteStore> store_;
  std::unique_ptr<RemoteSharing> sharing_;  // uses store_: declared after it, destroyed first
};

// RemoteStoreOptions of remote_tier, with `password` for AUTH.
absl::StatusOr<RemoteStoreOptions> RemoteStoreOptionsFromConfig(const v1::RemoteTierConfig& config);

}  // namespace kvcache

#endif  // KVCACHE_SERVER_DAEMON_REMOTE_TIER_H_
