#include "server/status/event_log.h"

#include <spdlog/details/log_msg.h>
#include <spdlog/sinks/base_sink.h>
// The compiled spdlog instantiates base_sink only for its own mutex types.
#include <spdlog/sinks/base_sink-inl.h>

#include <utility>

#include "absl/time/clock.h"
#include "server/logging/log_format.h"

namespace kvcache {
namespace {

// base_sink holds its mutex around sink_it_ and its formatter: it guards
// spdlog's fields, none of ours (the EventLog locks itself), so nothing here
// is ABSL_GUARDED_BY it. A kvcache::Mutex, like every lock of the daemon.
class EventLogSink final : public spdlog::sinks::base_sink<Mutex> {
 public:
  explicit EventLogSink(std::shared_ptr<EventLog> log) : log_(std::move(log)) {
    set_level(spdlog::level::warn);
  }

 private:
  void sink_it_(const spdlog::details::log_msg& msg) override {
    if (msg.level < spdlog::level::warn || msg.level == spdlog::level::off) return;
    const auto level = spdlog::level::to_string_view(msg.level);
    log_->AddMessage({.when = absl::FromChrono(msg.time),
                      .level = std::string(level.data(), level.size()),
                      .text = LogPayloadAsText({msg.payload.data(), msg.payload.size()})});
  }
  void flush_() override {}

  const std::shared_ptr<EventLog> log_;
};

}  // namespace

EventLog::EventLog(size_t capacity) : capacity_(capacity < 1 ? 1 : capacity) {}

void EventLog::AddMessage(LoggedMessage message) {
  if (message.text.size() > kMaxMessageBytes) {
    message.text.resize(kMaxMessageBytes);
    message.text += "...";
  }
  MutexLock lock(&mu_);
  ++messages_total_;
  messages_.push_back(std::move(message));
  while (messages_.size() > capacity_) messages_.pop_front();
}

void EventLog::AddMove(const MoveRecord& m) {
  LoggedMove move{.when = m.when,
                  .key = m.key,
                  .from = m.from != nullptr ? m.from : "",
                  .to = m.to != nullptr ? m.to : "",
                  .reason = m.reason != nullptr ? m.reason : "",
                  .bytes = m.bytes,
                  .took = m.took};
  MutexLock lock(&mu_);
  ++moves_total_;
  moves_.push_back(std::move(move));
  while (moves_.size() > capacity_) moves_.pop_front();
}

std::vector<LoggedMessage> EventLog::RecentMessages() const {
  MutexLock lock(&mu_);
  return std::vector<LoggedMessage>(messages_.rbegin(), messages_.rend());
}

std::vector<LoggedMove> EventLog::RecentMoves() const {
  MutexLock lock(&mu_);
  return std::vector<LoggedMove>(moves_.rbegin(), moves_.rend());
}

uint64_t EventLog::messages_total() const {
  MutexLock lock(&mu_);
  return messages_total_;
}

uint64_t EventLog::moves_total() const {
  MutexLock lock(&mu_);
  return moves_total_;
}

std::shared_ptr<spdlog::sinks::sink> NewEventLogSink(std::shared_ptr<EventLog> log) {
  return std::make_shared<EventLogSink>(std::move(log));
}

}  // namespace kvcache
