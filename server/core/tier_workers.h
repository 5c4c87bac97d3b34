// TierWorkers: threads that run the tiers' reads off the threads that serve
// requests. The cache's TierManager keeps two pools: one for background promotions (a
// lookup's SSD blocks read back into host memory before the worker fetches
// them) and one for the SSD reads of fetches, so that no gRPC callback
// thread waits on the disk (Cache::PrepareFetchAsync).
//
// A bounded queue: a job past max_queued is refused (Submit returns null and
// leaves the job to its caller), never waited for. Each accepted job gets a
// WorkTicket its submitter may wait on (with a deadline) or be called back
// by. Destroying the pool finishes the running jobs, drops the queued ones
// (each one's `drop` runs, then its ticket is notified) and joins the
// threads.
//
// Thread-safe.
#ifndef KVCACHE_SERVER_CORE_TIER_WORKERS_H_
#define KVCACHE_SERVER_CORE_TIER_WORKERS_H_

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <string_view>
#include <thread>
#include <vector>

#include "absl/functional/any_invocable.h"
#include "absl/time/time.h"
#include "server/common/counter_visitor.h"
#include "server/common/mutex.h"

namespace kvcache {

class WorkTicket {
 public:
  // True once the job ran (or was dropped at shutdown); false at the deadline.
  bool WaitFor(absl::Duration timeout);
  // Runs `callback` once the job ran (or was dropped at shutdown): at once,
  // on this thread, when it has already; else on the thread that finishes
  // it. For callers that must not block a thread to wait (gRPC reactors).
  void OnDone(std::function<void()> callback);
  void Notify();

 private:
  Mutex mu_;
  std::condition_variable_any cv_;
  bool done_ ABSL_GUARDED_BY(mu_) = false;
  std::vector<std::function<void()>> on_done_ ABSL_GUARDED_BY(mu_);
};

struct WorkStats {
  uint64_t issued = 0;     // jobs queued
  uint64_t completed = 0;  // jobs run
  uint64_t dropped = 0;    // refused: the queue was full
  uint64_t late = 0;       // a submitter stopped waiting before its job ran

  // As the prefetches of the tier they read from, labelled with its `tier`.
  void VisitPrefetchCounters(std::string_view tier, CounterVisitor& visitor) const;
  // As the fetches whose reads went to the fetch-read threads (`dropped`:
  // the queue was full, so they read on their caller's thread).
  void VisitFetchReadCounters(std::string_view tier, CounterVisitor& visitor) const;
};

class TierWorkers {
 public:
  // REQUIRES: threads >= 1, max_queued >= 1.
  TierWorkers(uint32_t threads, uint32_t max_queued);
  ~TierWorkers();
  TierWorkers(const TierWorkers&) = delete;
  TierWorkers& operator=(const TierWorkers&) = delete;

  using Job = absl::AnyInvocable<void() &&>;
  // Queues `run`; nullptr (and `run` discarded) when the queue is full or
  // the pool is shutting down.
  std::shared_ptr<WorkTicket> Submit(Job run);
  // Queues `run`, with `drop` to run instead should the shutdown drop it;
  // nullptr, and both left to the caller as they were, when the queue is
  // full or the pool is shutting down. For work whose submitter must hear
  // back whatever happens.
  std::shared_ptr<WorkTicket> TrySubmit(Job& run, Job& drop);
  // Counts a submitter that gave up waiting.
  void CountLate();

  WorkStats GetStats() const;

 private:
  struct Queued {
    Job run;
    Job drop;
    std::shared_ptr<WorkTicket> ticket;
  };
  void Work();

  const uint32_t max_queued_;
  mutable Mutex mu_;
  std::condition_variable_any cv_;
  std::deque<Queued> queue_ ABSL_GUARDED_BY(mu_);
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  WorkStats stats_ ABSL_GUARDED_BY(mu_);
  std::vector<std::thread> threads_;
};

}  // namespace kvcache

#endif  // KVCACHE_SERVER_CORE_TIER_WORKERS_H_
