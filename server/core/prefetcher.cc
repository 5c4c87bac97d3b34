#include "server/core/prefetcher.h"

#include <chrono>
#include <utility>

namespace kvcache {

bool PrefetchTicket::WaitFor(absl::Duration timeout) {
  std::unique_lock lock(mu_);
  if (timeout == absl::InfiniteDuration()) {  // wait_for would overflow its deadline
    cv_.wait(lock, [this] { return done_; });
    return true;
  }
  return cv_.wait_for(lock, absl::ToChronoNanoseconds(timeout), [this] { return done_; });
}

void PrefetchTicket::Notify() {
  {
    std::lock_guard lock(mu_);
    done_ = true;
  }
  cv_.notify_all();
}

Prefetcher::Prefetcher(uint32_t threads, uint32_t max_queued) : max_queued_(max_queued) {
  for (uint32_t i = 0; i < threads; ++i) threads_.emplace_back([this] { Work(); });
}

Prefetcher::~Prefetcher() {
  std::deque<Job> dropped;
  {
    std::lock_guard lock(mu_);
    stopping_ = true;
    dropped.swap(queue_);
  }
  cv_.notify_all();
  for (std::thread& t : threads_) t.join();
  for (Job& job : dropped) job.ticket->Notify();
}

std::shared_ptr<PrefetchTicket> Prefetcher::Submit(std::function<void()> job) {
  auto ticket = std::make_shared<PrefetchTicket>();
  {
    std::lock_guard lock(mu_);
    if (stopping_ || queue_.size() >= max_queued_) {
      ++stats_.dropped;
      return nullptr;
    }
    queue_.push_back({std::move(job), ticket});
    ++stats_.issued;
  }
  cv_.notify_one();
  return ticket;
}

void Prefetcher::CountLate() {
  std::lock_guard lock(mu_);
  ++stats_.late;
}

void PrefetchStats::VisitCounters(std::string_view tier, CounterVisitor& visitor) const {
  constexpr CounterFamily kPrefetches{"kvcached_tier_prefetches_total",
                                      "Lookup prefetches of a tier's blocks, by outcome",
                                      CounterType::kCounter};
  visitor.Visit(kPrefetches, {{"tier", tier}, {"outcome", "issued"}}, issued);
  visitor.Visit(kPrefetches, {{"tier", tier}, {"outcome", "completed"}}, completed);
  visitor.Visit(kPrefetches, {{"tier", tier}, {"outcome", "dropped"}}, dropped);
  visitor.Visit(kPrefetches, {{"tier", tier}, {"outcome", "late"}}, late);
}

PrefetchStats Prefetcher::GetStats() const {
  std::lock_guard lock(mu_);
  return stats_;
}

void Prefetcher::Work() {
  while (true) {
    Job job;
    {
      std::unique_lock lock(mu_);
      cv_.wait(lock, [this] { return stopping_ || !queue_.empty(); });
      if (stopping_) return;
      job = std::move(queue_.front());
      queue_.pop_front();
    }
    job.run();
    {
      std::lock_guard lock(mu_);
      ++stats_.completed;  // before the waiter wakes, so it sees the count
    }
    job.ticket->Notify();
  }
}

}  // namespace kvcache
