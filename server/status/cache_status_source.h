// CacheStatusSource: the daemon's StatusSource (status_page.h), reading a
// live Cache, the event log and what the daemon knows of itself.
//
// Thread-safe: every method reads through the Cache's own locking or the
// EventLog's. The Cache must outlive this source.
//
// TopPrefixes walks every model's first blocks under the cache's lock, and
// the status page asks for it on every GET /status, which anyone who reaches
// the metrics port may send. So once a walk took at least
// `costly_walk` (a cache with many cached sequences), its answer is reused
// for kTopPrefixesRefresh: however often the page is polled, such a walk
// runs at most that often. Cheap walks are never reused, so a small cache's
// page is always current.
#ifndef KVCACHE_SERVER_STATUS_CACHE_STATUS_SOURCE_H_
#define KVCACHE_SERVER_STATUS_CACHE_STATUS_SOURCE_H_

#include <functional>
#include <memory>
#include <string>

#include "server/common/clock.h"
#include "server/common/mutex.h"
#include "server/core/cache.h"
#include "server/core/cache_inspector.h"
#include "server/status/event_log.h"
#include "server/status/status_page.h"

namespace kvcache {

class CacheStatusSource final : public StatusSource {
 public:
  // `stats` is the snapshot the metrics read (the cache's with the daemon's
  // checkpoint counters); empty: cache->GetStats(). `events` may be null (no
  // recent events). REQUIRES: cache != nullptr.
  CacheStatusSource(Cache* cache, StatusIdentity identity, std::string config_json,
                    std::shared_ptr<const EventLog> events,
                    std::function<CacheStats()> stats = nullptr, Clock* clock = SystemClock::Get(),
                    absl::Duration costly_walk = absl::Milliseconds(1));

  static constexpr absl::Duration kTopPrefixesRefresh = absl::Seconds(5);

  // Where Memory() reads the daemon's memory breakdown; unset: no Memory
  // section. REQUIRES: called before the source is shared with a server.
  void SetMemorySource(std::function<MemoryBreakdown()> memory) { memory_ = std::move(memory); }
  // Where RemoteTier() reads the remote tier's status; unset: no section.
  // REQUIRES: called before the source is shared with a server.
  void SetRemoteTierSource(std::function<v1::RemoteTierStatus()> remote) {
    remote_tier_ = std::move(remote);
  }

  StatusIdentity Identity() const override { return identity_; }
  std::string ConfigJson() const override { return config_json_; }
  CacheStats Stats() const override;
  std::optional<MemoryBreakdown> Memory() const override;
  std::optional<v1::RemoteTierStatus> RemoteTier() const override {
    if (!remote_tier_) return std::nullopt;
    return remote_tier_();
  }
  std::vector<PrefixSummary> TopPrefixes(size_t limit) const override;
  std::vector<LoggedMessage> RecentErrors() const override;
  std::vector<LoggedMove> RecentMoves() const override;
  absl::StatusOr<SequenceInspection> InspectPrefix(const ModelKey& model,
                                                   uint64_t first_block_key) const override;

 private:
  Cache* const cache_;
  const CacheInspector inspector_;
  const StatusIdentity identity_;
  const std::string config_json_;
  const std::shared_ptr<const EventLog> events_;
  const std::function<CacheStats()> stats_;
  std::function<MemoryBreakdown()> memory_;
  std::function<v1::RemoteTierStatus()> remote_tier_;
  Clock* const clock_;
  const absl::Duration costly_walk_;
  // The last costly TopPrefixes walk: when, for how many, and its answer.
  mutable Mutex top_mu_;
  mutable absl::Time top_at_ ABSL_GUARDED_BY(top_mu_) = absl::InfinitePast();
  mutable size_t top_limit_ ABSL_GUARDED_BY(top_mu_) = 0;
  mutable std::vector<PrefixSummary> top_ ABSL_GUARDED_BY(top_mu_);
};

}  // namespace kvcache

#endif  // KVCACHE_SERVER_STATUS_CACHE_STATUS_SOURCE_H_
