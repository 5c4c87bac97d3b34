// DeadlineTimer: runs callbacks at deadlines, on one thread of its own.
//
// The gRPC front door uses it to answer a call that waits for something
// (a PREFETCH_WAIT lookup waits for its read-back) at the call's deadline
// without holding a gRPC callback thread: the call schedules its answer here
// and returns; whichever comes first, the awaited event or the deadline,
// answers it.
//
// Thread-safe. Callbacks run on the timer's thread without its lock held
// and may call Schedule() and Cancel(). Destroying the timer runs every
// callback still pending at once (so calls waiting on it are answered at
// shutdown), then joins the thread.
#ifndef KVCACHE_SERVER_RPC_DEADLINE_TIMER_H_
#define KVCACHE_SERVER_RPC_DEADLINE_TIMER_H_

#include <condition_variable>
#include <cstdint>
#include <functional>
#include <map>
#include <thread>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/time/time.h"
#include "server/common/mutex.h"

namespace kvcache {

class DeadlineTimer {
 public:
  using Id = uint64_t;

  DeadlineTimer();
  ~DeadlineTimer();
  DeadlineTimer(const DeadlineTimer&) = delete;
  DeadlineTimer& operator=(const DeadlineTimer&) = delete;

  // Runs `callback` once at `deadline` (at once when it has passed). Ids are
  // never 0.
  Id Schedule(absl::Time deadline, std::function<void()> callback);
  // Drops a callback that has not started; false when it ran, is running, or
  // the id is unknown. Does not wait for a running callback.
  bool Cancel(Id id);
  // Runs every callback pending now at once, as if its deadline had come
  // (shutdown: calls waiting on the timer are answered before the server
  // drains). Returns without waiting for them.
  void FireAllNow();
  // Callbacks scheduled and not yet run.
  size_t pending() const;

 private:
  void Run();

  mutable Mutex mu_;
  std::condition_variable_any cv_;
  // Pending callbacks by (deadline, id), and each id's deadline.
  std::map<std::pair<absl::Time, Id>, std::function<void()>> queue_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<Id, absl::Time> deadlines_ ABSL_GUARDED_BY(mu_);
  Id next_id_ ABSL_GUARDED_BY(mu_) = 1;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  // Callbacks FireAllNow took out of the queue, for the thread to run.
  std::vector<std::function<void()>> fire_now_ ABSL_GUARDED_BY(mu_);
  std::thread thread_;
};

}  // namespace kvcache

#endif  // KVCACHE_SERVER_RPC_DEADLINE_TIMER_H_
