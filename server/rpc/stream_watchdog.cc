#include "server/rpc/stream_watchdog.h"

#include <chrono>

namespace kvcache {
namespace {

// The id whose callback this thread is running; 0 when none.
thread_local StreamWatchdog::Id running_here = 0;

}  // namespace

StreamWatchdog::StreamWatchdog(absl::Duration idle_timeout, Clock* clock, bool start_reaper)
    : idle_timeout_(idle_timeout), clock_(clock) {
  if (start_reaper) reaper_ = std::thread([this] { RunReaper(); });
}

StreamWatchdog::~StreamWatchdog() {
  {
    MutexLock lock(&mu_);
    stopping_ = true;
  }
  cv_.notify_all();
  if (reaper_.joinable()) reaper_.join();
}

StreamWatchdog::Id StreamWatchdog::Watch(std::function<void()> on_idle) {
  const absl::Time deadline = clock_->Now() + idle_timeout_;
  MutexLock lock(&mu_);
  const Id id = next_id_++;
  entries_.emplace(id, Entry{deadline, std::move(on_idle)});
  // Every deadline is now + the same timeout, so a new one is never earlier
  // than those queued: the reaper needs waking only when it has none.
  if (heap_.empty()) cv_.notify_all();
  heap_.emplace(deadline, id);
  return id;
}

void StreamWatchdog::Touch(Id id) {
  const absl::Time deadline = clock_->Now() + idle_timeout_;
  MutexLock lock(&mu_);
  auto it = entries_.find(id);
  if (it != entries_.end()) it->second.deadline = deadline;
}

void StreamWatchdog::Unwatch(Id id) {
  MutexLock lock(&mu_);
  entries_.erase(id);
  // Inside the callback itself (or a reaction it ran inline) there is nothing
  // to wait for: the caller is the callback. cv_ waits on the Mutex itself,
  // which the analysis follows.
  cv_.wait(mu_, [&] {
    mu_.AssertHeld();
    return running_ != id || running_here == id;
  });
}

int StreamWatchdog::ExpireIdle() {
  const absl::Time now = clock_->Now();
  int ran = 0;
  MutexLock lock(&mu_);
  while (!heap_.empty() && heap_.top().first <= now) {
    const Id id = heap_.top().second;
    heap_.pop();
    auto it = entries_.find(id);
    if (it == entries_.end()) continue;  // unwatched since
    if (it->second.deadline > now) {     // touched since
      heap_.emplace(it->second.deadline, id);
      continue;
    }
    std::function<void()> on_idle = std::move(it->second.on_idle);
    entries_.erase(it);
    running_ = id;
    mu_.Unlock();
    running_here = id;
    on_idle();
    running_here = 0;
    mu_.Lock();
    running_ = 0;
    cv_.notify_all();
    ++ran;
  }
  return ran;
}

size_t StreamWatchdog::watched() const {
  MutexLock lock(&mu_);
  return entries_.size();
}

void StreamWatchdog::RunReaper() {
  mu_.Lock();  // cv_ waits on the Mutex itself, which the analysis follows
  while (!stopping_) {
    if (heap_.empty()) {
      cv_.wait(mu_);
      continue;
    }
    const absl::Duration wait = heap_.top().first - clock_->Now();
    if (wait > absl::ZeroDuration()) {
      cv_.wait_for(mu_, absl::ToChronoNanoseconds(wait));
      continue;
    }
    mu_.Unlock();
    ExpireIdle();
    mu_.Lock();
  }
  mu_.Unlock();
}

}  // namespace kvcache
