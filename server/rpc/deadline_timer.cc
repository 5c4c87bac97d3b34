#include "server/rpc/deadline_timer.h"

#include <chrono>
#include <vector>

namespace kvcache {

DeadlineTimer::DeadlineTimer() : thread_([this] { Run(); }) {}

DeadlineTimer::~DeadlineTimer() {
  {
    MutexLock lock(&mu_);
    stopping_ = true;
  }
  cv_.notify_all();
  thread_.join();
}

DeadlineTimer::Id DeadlineTimer::Schedule(absl::Time deadline, std::function<void()> callback) {
  Id id;
  bool earliest;
  {
    MutexLock lock(&mu_);
    id = next_id_++;
    queue_.emplace(std::pair{deadline, id}, std::move(callback));
    deadlines_.emplace(id, deadline);
    earliest = queue_.begin()->first.second == id;
  }
  if (earliest) cv_.notify_all();
  return id;
}

bool DeadlineTimer::Cancel(Id id) {
  MutexLock lock(&mu_);
  auto it = deadlines_.find(id);
  if (it == deadlines_.end()) return false;
  queue_.erase({it->second, id});
  deadlines_.erase(it);
  return true;
}

void DeadlineTimer::FireAllNow() {
  {
    MutexLock lock(&mu_);
    if (queue_.empty()) return;
    for (auto& [when, callback] : queue_) fire_now_.push_back(std::move(callback));
    queue_.clear();
    deadlines_.clear();
  }
  cv_.notify_all();
}

size_t DeadlineTimer::pending() const {
  MutexLock lock(&mu_);
  return queue_.size();
}

void DeadlineTimer::Run() {
  mu_.Lock();  // cv_ waits on the Mutex itself, which the analysis follows
  while (true) {
    if (!fire_now_.empty()) {
      std::vector<std::function<void()>> now;
      now.swap(fire_now_);
      mu_.Unlock();
      for (std::function<void()>& callback : now) callback();
      mu_.Lock();
      continue;
    }
    const bool stopping = stopping_;
    if (stopping && queue_.empty()) break;
    if (queue_.empty()) {
      cv_.wait(mu_);
      continue;
    }
    const absl::Time now = absl::Now();
    auto first = queue_.begin();
    if (!stopping && first->first.first > now) {
      const absl::Duration wait = first->first.first - now;
      if (wait >= absl::Hours(24)) {
        cv_.wait_for(mu_, std::chrono::hours(24));  // wait_for would overflow an infinite one
      } else {
        cv_.wait_for(mu_, absl::ToChronoNanoseconds(wait));
      }
      continue;
    }
    std::function<void()> callback = std::move(first->second);
    deadlines_.erase(first->first.second);
    queue_.erase(first);
    mu_.Unlock();
    callback();
    mu_.Lock();
  }
  mu_.Unlock();
}

}  // namespace kvcache
