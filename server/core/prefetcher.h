// Prefetcher: worker threads that run the cache's background promotions (a
// lookup's SSD blocks read back into host memory before the worker fetches
// them). A bounded queue: work past max_queued is dropped, never waited for.
//
// Each submitted job gets a PrefetchTicket its submitter may wait on (with a
// deadline). Destroying the Prefetcher finishes the running jobs, drops the
// queued ones (their tickets are notified) and joins the threads.
//
// Thread-safe.
#ifndef KVCACHE_SERVER_CORE_PREFETCHER_H_
#define KVCACHE_SERVER_CORE_PREFETCHER_H_

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <string_view>
#include <thread>
#include <vector>

#include "absl/time/time.h"
#include "server/common/counter_visitor.h"
#include "server/common/mutex.h"

namespace kvcache {

class PrefetchTicket {
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

struct PrefetchStats {
  uint64_t issued = 0;     // jobs queued
  uint64_t completed = 0;  // jobs run
  uint64_t dropped = 0;    // refused: the queue was full
  uint64_t late = 0;       // a submitter stopped waiting before its job ran

  // The prefetches of the tier they read from, labelled with its `tier`.
  void VisitCounters(std::string_view tier, CounterVisitor& visitor) const;
};

class Prefetcher {
 public:
  // REQUIRES: threads >= 1, max_queued >= 1.
  Prefetcher(uint32_t threads, uint32_t max_queued);
  ~Prefetcher();
  Prefetcher(const Prefetcher&) = delete;
  Prefetcher& operator=(const Prefetcher&) = delete;

  // Queues `job`; nullptr (and nothing queued) when the queue is full.
  std::shared_ptr<PrefetchTicket> Submit(std::function<void()> job);
  // Counts a submitter that gave up waiting.
  void CountLate();

  PrefetchStats GetStats() const;

 private:
  struct Job {
    std::function<void()> run;
    std::shared_ptr<PrefetchTicket> ticket;
  };
  void Work();

  const uint32_t max_queued_;
  mutable Mutex mu_;
  std::condition_variable_any cv_;
  std::deque<Job> queue_ ABSL_GUARDED_BY(mu_);
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  PrefetchStats stats_ ABSL_GUARDED_BY(mu_);
  std::vector<std::thread> threads_;
};

}  // namespace kvcache

#endif  // KVCACHE_SERVER_CORE_PREFETCHER_H_
