// EventLog: the recent events the status page lists (server/status): the
// daemon's warnings and errors, and the blocks it moved between tiers.
//
// Two bounded rings of `capacity` entries each (status_page.recent_events);
// the oldest entry goes when a new one arrives. Warnings and errors arrive
// through an spdlog sink (NewEventLogSink) attached to the daemon's logger;
// tier moves from the migrator, which drains TierManager::DrainMoves() into the
// migration log and here. Texts are kept as logged, cut at
// kMaxMessageBytes; the page escapes them.
//
// Thread-safe.
#ifndef KVCACHE_SERVER_STATUS_EVENT_LOG_H_
#define KVCACHE_SERVER_STATUS_EVENT_LOG_H_

#include <spdlog/sinks/sink.h>

#include <cstddef>
#include <cstdint>
#include <deque>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/time/time.h"
#include "server/common/mutex.h"
#include "server/core/cache_stats.h"

namespace kvcache {

struct LoggedMessage {
  absl::Time when;
  std::string level;  // "warning", "error", "critical"
  std::string text;
};

// A MoveRecord that owns its strings.
struct LoggedMove {
  absl::Time when;
  uint64_t key = 0;
  std::string from;
  std::string to;
  std::string reason;
  uint64_t bytes = 0;
  absl::Duration took = absl::ZeroDuration();
};

class EventLog {
 public:
  static constexpr size_t kMaxMessageBytes = 2048;

  // REQUIRES: capacity >= 1.
  explicit EventLog(size_t capacity);

  void AddMessage(LoggedMessage message);
  void AddMove(const MoveRecord& move);

  // Newest first.
  std::vector<LoggedMessage> RecentMessages() const;
  std::vector<LoggedMove> RecentMoves() const;
  // Everything added so far, also what the rings no longer hold.
  uint64_t messages_total() const;
  uint64_t moves_total() const;
  size_t capacity() const { return capacity_; }

 private:
  const size_t capacity_;
  mutable Mutex mu_;
  std::deque<LoggedMessage> messages_ ABSL_GUARDED_BY(mu_);
  std::deque<LoggedMove> moves_ ABSL_GUARDED_BY(mu_);
  uint64_t messages_total_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t moves_total_ ABSL_GUARDED_BY(mu_) = 0;
};

// An spdlog sink that adds every warning, error and critical line to `log`
// (lower levels are ignored whatever the logger's level). Add it to a
// logger's sinks before the logger is shared between threads.
std::shared_ptr<spdlog::sinks::sink> NewEventLogSink(std::shared_ptr<EventLog> log);

}  // namespace kvcache

#endif  // KVCACHE_SERVER_STATUS_EVENT_LOG_H_
