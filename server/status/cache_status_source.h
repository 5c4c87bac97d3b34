// CacheStatusSource: the daemon's StatusSource (status_page.h), reading a
// live Cache, the event log and what the daemon knows of itself.
//
// Thread-safe: every method reads through the Cache's own locking or the
// EventLog's. The Cache must outlive this source.
#ifndef KVCACHE_SERVER_STATUS_CACHE_STATUS_SOURCE_H_
#define KVCACHE_SERVER_STATUS_CACHE_STATUS_SOURCE_H_

#include <functional>
#include <memory>
#include <string>

#include "server/core/cache.h"
#include "server/status/event_log.h"
#include "server/status/status_page.h"

namespace kvcache {

class CacheStatusSource final : public StatusSource {
 public:
  // `stats` is the snapshot the metrics read (the cache's with the daemon's
  // checkpoint counters); empty: cache->GetStats(). `events` may be null (no
  // recent events). REQUIRES: cache != nullptr.
  CacheStatusSource(const Cache* cache, StatusIdentity identity, std::string config_json,
                    std::shared_ptr<const EventLog> events,
                    std::function<CacheStats()> stats = nullptr);

  StatusIdentity Identity() const override { return identity_; }
  std::string ConfigJson() const override { return config_json_; }
  CacheStats Stats() const override;
  std::vector<PrefixSummary> TopPrefixes(size_t limit) const override;
  std::vector<LoggedMessage> RecentErrors() const override;
  std::vector<LoggedMove> RecentMoves() const override;
  absl::StatusOr<SequenceInspection> InspectPrefix(const ModelKey& model,
                                                   uint64_t first_block_key) const override;

 private:
  const Cache* const cache_;
  const StatusIdentity identity_;
  const std::string config_json_;
  const std::shared_ptr<const EventLog> events_;
  const std::function<CacheStats()> stats_;
};

}  // namespace kvcache

#endif  // KVCACHE_SERVER_STATUS_CACHE_STATUS_SOURCE_H_
