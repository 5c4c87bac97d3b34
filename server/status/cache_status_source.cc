#include "server/status/cache_status_source.h"

#include <algorithm>
#include <utility>

namespace kvcache {

CacheStatusSource::CacheStatusSource(Cache* cache, StatusIdentity identity, std::string config_json,
                                     std::shared_ptr<const EventLog> events,
                                     std::function<CacheStats()> stats, Clock* clock,
                                     absl::Duration costly_walk)
    : cache_(cache),
      inspector_(cache),
      identity_(std::move(identity)),
      config_json_(std::move(config_json)),
      events_(std::move(events)),
      stats_(std::move(stats)),
      clock_(clock),
      costly_walk_(costly_walk) {}

std::optional<MemoryBreakdown> CacheStatusSource::Memory() const {
  if (!memory_) return std::nullopt;
  return memory_();
}

CacheStats CacheStatusSource::Stats() const { return stats_ ? stats_() : cache_->GetStats(); }

std::vector<PrefixSummary> CacheStatusSource::TopPrefixes(size_t limit) const {
  MutexLock lock(&top_mu_);  // one walk at a time; concurrent pollers share it
  const absl::Time now = clock_->Now();
  if (now - top_at_ >= kTopPrefixesRefresh || limit > top_limit_) {
    std::vector<PrefixSummary> walked = inspector_.TopPrefixes(limit);
    const absl::Time done = clock_->Now();
    if (done - now < costly_walk_) {
      top_at_ = absl::InfinitePast();  // cheap: walk again next time
      return walked;
    }
    top_ = std::move(walked);
    top_limit_ = limit;
    top_at_ = now;
  }
  return std::vector<PrefixSummary>(
      top_.begin(), top_.begin() + static_cast<ptrdiff_t>(std::min(limit, top_.size())));
}

std::vector<LoggedMessage> CacheStatusSource::RecentErrors() const {
  return events_ != nullptr ? events_->RecentMessages() : std::vector<LoggedMessage>{};
}

std::vector<LoggedMove> CacheStatusSource::RecentMoves() const {
  return events_ != nullptr ? events_->RecentMoves() : std::vector<LoggedMove>{};
}

absl::StatusOr<SequenceInspection> CacheStatusSource::InspectPrefix(
    const ModelKey& model, uint64_t first_block_key) const {
  return inspector_.InspectHottestPath(model, first_block_key, /*include_heads=*/true);
}

}  // namespace kvcache
