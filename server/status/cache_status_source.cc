#include "server/status/cache_status_source.h"

#include <utility>

namespace kvcache {

CacheStatusSource::CacheStatusSource(const Cache* cache, StatusIdentity identity,
                                     std::string config_json,
                                     std::shared_ptr<const EventLog> events,
                                     std::function<CacheStats()> stats)
    : cache_(cache),
      identity_(std::move(identity)),
      config_json_(std::move(config_json)),
      events_(std::move(events)),
      stats_(std::move(stats)) {}

CacheStats CacheStatusSource::Stats() const { return stats_ ? stats_() : cache_->GetStats(); }

std::vector<PrefixSummary> CacheStatusSource::TopPrefixes(size_t limit) const {
  return cache_->TopPrefixes(limit);
}

std::vector<LoggedMessage> CacheStatusSource::RecentErrors() const {
  return events_ != nullptr ? events_->RecentMessages() : std::vector<LoggedMessage>{};
}

std::vector<LoggedMove> CacheStatusSource::RecentMoves() const {
  return events_ != nullptr ? events_->RecentMoves() : std::vector<LoggedMove>{};
}

absl::StatusOr<SequenceInspection> CacheStatusSource::InspectPrefix(
    const ModelKey& model, uint64_t first_block_key) const {
  return cache_->InspectHottestPath(model, first_block_key, /*include_heads=*/true);
}

}  // namespace kvcache
