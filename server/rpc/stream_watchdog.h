// StreamWatchdog: cuts off streams that stop making progress.
//
// Every Append and Fetch reactor registers with Watch() and calls Touch()
// whenever its stream makes progress (a message read, a write completed). A
// stream that goes `idle_timeout` without progress has its `on_idle`
// callback run once; the reactors cancel their call from it, so a stalled
// peer gives back its stream slot and memory. One reaper thread serves every
// stream: it sleeps until the earliest deadline in a heap of deadlines, so no
// stream costs a thread or a timer of its own.
//
// Thread-safe. `on_idle` runs on the reaper thread, without the watchdog's
// lock held; it may call Unwatch() (directly or from a reaction gRPC runs
// inline). After Unwatch(id) returns, the callback of `id` is not running
// and never will, so a reactor calls Unwatch() in OnDone() before deleting
// itself and the callback may use the reactor freely.
#ifndef KVCACHE_SERVER_RPC_STREAM_WATCHDOG_H_
#define KVCACHE_SERVER_RPC_STREAM_WATCHDOG_H_

#include <condition_variable>
#include <cstdint>
#include <functional>
#include <queue>
#include <thread>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/time/time.h"
#include "server/common/clock.h"
#include "server/common/mutex.h"

namespace kvcache {

class StreamWatchdog {
 public:
  using Id = uint64_t;

  // With `start_reaper` false no thread runs and ExpireIdle() is called by
  // hand (tests, with a ManualClock).
  // REQUIRES: idle_timeout > 0; `clock` outlives the watchdog.
  StreamWatchdog(absl::Duration idle_timeout, Clock* clock, bool start_reaper = true);
  // Stops the reaper. REQUIRES: no callback still needs to run.
  ~StreamWatchdog();
  StreamWatchdog(const StreamWatchdog&) = delete;
  StreamWatchdog& operator=(const StreamWatchdog&) = delete;

  // Starts watching a stream; its deadline is now + idle_timeout.
  Id Watch(std::function<void()> on_idle) ABSL_LOCKS_EXCLUDED(mu_);
  // The stream made progress: its deadline moves to now + idle_timeout.
  // Unknown (already expired or unwatched) ids are ignored.
  void Touch(Id id) ABSL_LOCKS_EXCLUDED(mu_);
  // Stops watching; waits for a running callback of `id` unless called from
  // that callback's thread.
  void Unwatch(Id id) ABSL_LOCKS_EXCLUDED(mu_);

  // Runs the callback of every stream whose deadline has passed (each once,
  // after which the stream is no longer watched); returns how many ran.
  int ExpireIdle() ABSL_LOCKS_EXCLUDED(mu_);

  absl::Duration idle_timeout() const { return idle_timeout_; }
  size_t watched() const ABSL_LOCKS_EXCLUDED(mu_);

 private:
  struct Entry {
    absl::Time deadline;
    std::function<void()> on_idle;
  };
  using HeapItem = std::pair<absl::Time, Id>;  // a deadline at push time

  void RunReaper() ABSL_LOCKS_EXCLUDED(mu_);

  const absl::Duration idle_timeout_;
  Clock* const clock_;

  mutable Mutex mu_;
  std::condition_variable_any cv_;  // reaper wake-up; callback finished
  absl::flat_hash_map<Id, Entry> entries_ ABSL_GUARDED_BY(mu_);
  // Min-heap of deadlines. An item may be stale (the stream was touched or
  // unwatched since): it is re-pushed or dropped when it reaches the top.
  std::priority_queue<HeapItem, std::vector<HeapItem>, std::greater<HeapItem>> heap_
      ABSL_GUARDED_BY(mu_);
  Id next_id_ ABSL_GUARDED_BY(mu_) = 1;
  Id running_ ABSL_GUARDED_BY(mu_) = 0;  // the id whose callback runs now; 0 when none
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::thread reaper_;  // set by the constructor, joined by the destructor
};

}  // namespace kvcache

#endif  // KVCACHE_SERVER_RPC_STREAM_WATCHDOG_H_
