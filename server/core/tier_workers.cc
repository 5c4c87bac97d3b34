#include "server/core/tier_workers.h"

#include <chrono>
#include <utility>

namespace kvcache {

bool WorkTicket::WaitFor(absl::Duration timeout) {
  MutexLock lock(&mu_);  // cv_ waits on the Mutex itself, which the analysis follows
  auto done = [this] {
    mu_.AssertHeld();
    return done_;
  };
  if (timeout == absl::InfiniteDuration()) {  // wait_for would overflow its deadline
    cv_.wait(mu_, done);
    return true;
  }
  return cv_.wait_for(mu_, absl::ToChronoNanoseconds(timeout), done);
}

void WorkTicket::OnDone(std::function<void()> callback) {
  {
    MutexLock lock(&mu_);
    if (!done_) {
      on_done_.push_back(std::move(callback));
      return;
    }
  }
  callback();
}

void WorkTicket::Notify() {
  std::vector<std::function<void()>> callbacks;
  {
    MutexLock lock(&mu_);
    done_ = true;
    callbacks.swap(on_done_);
  }
  cv_.notify_all();
  for (std::function<void()>& callback : callbacks) callback();
}

TierWorkers::TierWorkers(uint32_t threads, uint32_t max_queued) : max_queued_(max_queued) {
  for (uint32_t i = 0; i < threads; ++i) threads_.emplace_back([this] { Work(); });
}

TierWorkers::~TierWorkers() {
  std::deque<Queued> dropped;
  {
    MutexLock lock(&mu_);
    stopping_ = true;
    dropped.swap(queue_);
  }
  cv_.notify_all();
  for (std::thread& t : threads_) t.join();
  for (Queued& job : dropped) {
    if (job.drop) std::move(job.drop)();
    job.ticket->Notify();
  }
}

std::shared_ptr<WorkTicket> TierWorkers::Submit(Job run) {
  Job drop;
  return TrySubmit(run, drop);
}

std::shared_ptr<WorkTicket> TierWorkers::TrySubmit(Job& run, Job& drop) {
  auto ticket = std::make_shared<WorkTicket>();
  {
    MutexLock lock(&mu_);
    if (stopping_ || queue_.size() >= max_queued_) {
      ++stats_.dropped;
      return nullptr;
    }
    queue_.push_back({std::move(run), std::move(drop), ticket});
    ++stats_.issued;
  }
  cv_.notify_one();
  return ticket;
}

void TierWorkers::CountLate() {
  MutexLock lock(&mu_);
  ++stats_.late;
}

void WorkStats::VisitPrefetchCounters(std::string_view tier, CounterVisitor& visitor) const {
  constexpr CounterFamily kPrefetches{"kvcached_tier_prefetches_total",
                                      "Lookup prefetches of a tier's blocks, by outcome",
                                      CounterType::kCounter};
  visitor.Visit(kPrefetches, {{"tier", tier}, {"outcome", "issued"}}, issued);
  visitor.Visit(kPrefetches, {{"tier", tier}, {"outcome", "completed"}}, completed);
  visitor.Visit(kPrefetches, {{"tier", tier}, {"outcome", "dropped"}}, dropped);
  visitor.Visit(kPrefetches, {{"tier", tier}, {"outcome", "late"}}, late);
}

void WorkStats::VisitFetchReadCounters(std::string_view tier, CounterVisitor& visitor) const {
  constexpr CounterFamily kFetchReads{
      "kvcached_tier_fetch_reads_total",
      "Fetches that read a tier's blocks back, by where the reads ran: queued for the "
      "fetch-read threads (and completed there), or inline on the request's thread (the queue "
      "was full)",
      CounterType::kCounter};
  visitor.Visit(kFetchReads, {{"tier", tier}, {"outcome", "queued"}}, issued);
  visitor.Visit(kFetchReads, {{"tier", tier}, {"outcome", "completed"}}, completed);
  visitor.Visit(kFetchReads, {{"tier", tier}, {"outcome", "inline"}}, dropped);
}

WorkStats TierWorkers::GetStats() const {
  MutexLock lock(&mu_);
  return stats_;
}

void TierWorkers::Work() {
  while (true) {
    Queued job;
    {
      MutexLock lock(&mu_);
      cv_.wait(mu_, [this] {
        mu_.AssertHeld();
        return stopping_ || !queue_.empty();
      });
      if (stopping_) return;
      job = std::move(queue_.front());
      queue_.pop_front();
    }
    std::move(job.run)();
    {
      MutexLock lock(&mu_);
      ++stats_.completed;  // before the waiter wakes, so it sees the count
    }
    job.ticket->Notify();
  }
}

}  // namespace kvcache
