#include "server/daemon/remote_tier.h"

#include <spdlog/spdlog.h>

#include <fstream>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "server/remote/cluster_topology.h"
#include "server/security/daemon_secret.h"

namespace kvcache {
namespace {

// The first line of `path`, without its line end.
absl::StatusOr<std::string> ReadPassword(const std::string& path) {
  std::ifstream in(path);
  if (!in) {
    return absl::NotFoundError(absl::StrCat("remote_tier.password_file ", path, " cannot be read"));
  }
  std::string line;
  std::getline(in, line);
  if (!line.empty() && line.back() == '\r') line.pop_back();
  if (line.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat("remote_tier.password_file ", path, " holds no password on its first line"));
  }
  return line;
}

}  // namespace

absl::StatusOr<RemoteStoreOptions> RemoteStoreOptionsFromConfig(
    const v1::RemoteTierConfig& config) {
  RemoteStoreOptions options{
      .cluster = {.seeds = {},
                  .node = {.connect_timeout = absl::Milliseconds(config.connect_timeout_ms()),
                           .io_timeout = absl::Milliseconds(config.io_timeout_ms()),
                           .user = config.user(),
                           .password = ""},
                  .max_redirects = static_cast<int>(config.max_redirects()),
                  .try_again_pause = absl::Milliseconds(10),
                  .read_from_replicas = config.read_from_replicas()},
      .write_queue_blocks = config.write_queue_blocks(),
      .write_batch_blocks = config.write_batch_blocks(),
      .breaker_failures = config.breaker_failures(),
      .breaker_cooldown = absl::Milliseconds(config.breaker_cooldown_ms()),
      .batch_deadline = absl::Milliseconds(config.batch_deadline_ms())};
  for (const std::string& seed : config.seeds()) {
    absl::StatusOr<NodeAddress> address = ParseNodeAddress(seed);
    if (!address.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat("remote_tier.seeds: ", address.status().message()));
    }
    options.cluster.seeds.push_back(*std::move(address));
  }
  if (!config.password_file().empty()) {
    absl::StatusOr<std::string> password = ReadPassword(config.password_file());
    if (!password.ok()) return password.status();
    options.cluster.node.password = *std::move(password);
  }
  return options;
}

absl::StatusOr<std::unique_ptr<RemoteTier>> RemoteTier::Start(const v1::RemoteTierConfig& config,
                                                              Cache* cache) {
  if (config.seeds().empty()) return nullptr;
  absl::StatusOr<DaemonSecret> shared =
      DaemonSecret::Load(config.key_file(), "the remote tier's key file (remote_tier.key_file)");
  if (!shared.ok()) return shared.status();
  absl::StatusOr<RemoteStoreOptions> options = RemoteStoreOptionsFromConfig(config);
  if (!options.ok()) return options.status();
  absl::StatusOr<std::unique_ptr<RemoteStore>> store = RemoteStore::Start(*options, *shared);
  if (!store.ok()) return store.status();
  const std::string seeds = absl::StrJoin(config.seeds(), ", ");
  if (absl::Status connected = (*store)->Connect(); connected.ok()) {
    spdlog::info("remote tier: connected to the Redis Cluster of {}", seeds);
  } else {
    spdlog::warn(
        "remote tier: the Redis Cluster of {} cannot be used yet ({}); serving from "
        "this daemon's own tiers until it can",
        seeds, connected.ToString());
  }
  auto sharing = std::make_unique<RemoteSharing>(
      cache, store->get(), *shared,
      RemoteSharingOptions{.share_queue = config.share_queue(),
                           .max_discover_blocks = config.max_discover_blocks(),
                           .discover_queue = config.discover_queue()});
  return std::unique_ptr<RemoteTier>(
      new RemoteTier(std::vector<std::string>(config.seeds().begin(), config.seeds().end()),
                     *std::move(store), std::move(sharing)));
}

v1::RemoteTierStatus RemoteTier::Status() const {
  const RemoteSharing::Stats s = sharing_->stats();
  const RemoteStore::Stats st = store_->stats();
  v1::RemoteTierStatus out;
  out.set_enabled(true);
  for (const std::string& seed : seeds_) out.add_seeds(seed);
  out.set_breaker_open(st.breaker_open);
  out.set_write_queue_blocks(st.write_queue);
  out.set_blocks_written(st.writes_done);
  out.set_writes_dropped(st.writes_dropped_full + st.writes_dropped_open);
  out.set_writes_failed(st.writes_failed);
  out.set_blocks_read(st.reads);
  out.set_read_hits(st.hits);
  out.set_read_misses_absent(st.misses_absent);
  out.set_read_misses_unreadable(st.misses_unreadable + st.misses_checksum);
  out.set_read_misses_unavailable(st.misses_unavailable);
  out.set_searches(s.discoveries);
  out.set_searches_dropped(s.discoveries_dropped);
  out.set_blocks_adopted(s.blocks_adopted);
  return out;
}

}  // namespace kvcache
