// FairScheduler: fair admission of data-path work from both front doors.
//
// Append and fetch work arrives on two paths that the operating system would
// otherwise share out by thread count: every shared-memory connection has a
// daemon thread of its own, while gRPC's reactors run on a small callback
// pool. Left alone, a shared-memory worker got 25 times the service of a gRPC
// worker (issue 30). The scheduler admits each *step* of data-path work (a
// shm fetch_into or append_from; one write of a gRPC Fetch, one message of a
// gRPC Append and its commit) to one of `slots` slots
// (limits.data_path_concurrency), and when steps wait it grants freed slots
// round-robin: over the tenants with work waiting, then over the
// connections (flows) of that tenant, then over a flow's steps in order. A
// slot is held for one step, never for a stream.
//
// The turn order is least recently served first, at both levels: a tenant or
// flow that starts waiting goes behind those served longer ago than it was,
// and ahead of those served since. Flows that wait all the time are thus
// served in rotation, and a flow that was away (a gRPC stream's write and
// the client's next call take longer than a shm round trip) is not sent to
// the back of the line for it. A waiting flow is passed by each other flow
// at most once, so nothing starves.
//
// Two ways in:
//   Acquire() blocks the calling thread until a slot is granted: for threads
//     that belong to one connection (a shm session's).
//   Submit() never blocks: when a slot is free and nothing waits the step runs
//     at once on the calling thread (a gRPC callback thread); otherwise it is
//     queued, and once granted it runs on the thread that freed the slot
//     (one step, after its own), or on one of `threads` "kv-fair" threads.
//     A step must not block either: it does its work and starts the next
//     reaction, and its slot is released when it returns (or earlier, by
//     Slot::Release()).
//
// Work conservation: a gRPC step is queued only when every slot is taken, a
// shm step also while shm holds its share of the slots (below), so one path
// alone runs `slots` steps at once, and the queue orders only what competes.
//
// The shm share: most of a gRPC operation's cost is outside its steps
// (HTTP/2, the socket, the client). So a gRPC stream counts as an operation
// from its first step to EndOperation(), and while g operations are in flight
// and s shm flows wait or run, shm steps hold at most round(slots x s/(g+s))
// slots, at least 1. A stalled stream counts until it ends; it cannot shrink
// the share to 0.
//
// Shutdown() fails every waiting step (UNAVAILABLE), and every later one, and
// joins the kv-fair threads; slots held then stay valid until released.
//
// Thread-safe. Flows and slots must not outlive their scheduler.
#ifndef KVCACHE_SERVER_FRONTDOOR_FAIR_SCHEDULER_H_
#define KVCACHE_SERVER_FRONTDOOR_FAIR_SCHEDULER_H_

#include <array>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <memory>
#include <string>
#include <string_view>
#include <thread>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/functional/any_invocable.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "server/common/clock.h"
#include "server/common/counter_visitor.h"
#include "server/common/mutex.h"

namespace kvcache {

// The front door a step came through; a label of the metrics.
enum class DataPathKind : uint8_t { kSharedMemory = 0, kGrpc = 1 };
inline constexpr int kDataPathKinds = 2;
std::string_view DataPathName(DataPathKind path);  // "shm", "grpc"

struct FairSchedulerOptions {
  // Steps that run at once (limits.data_path_concurrency); >= 1.
  uint32_t slots = 2;
  // kv-fair threads that run Submit()ted steps granted after a wait; >= 1.
  uint32_t threads = 2;
  Clock* clock = SystemClock::Get();  // what wait times are measured with
};

class FairScheduler {
 public:
  class Flow;

  // One held slot; gives it back on destruction or Release(). Move-only.
  class Slot {
   public:
    Slot() = default;
    Slot(Slot&& other) noexcept { *this = std::move(other); }
    Slot& operator=(Slot&& other) noexcept;
    ~Slot() { Release(); }
    void Release();
    bool held() const { return scheduler_ != nullptr; }

   private:
    friend class FairScheduler;
    Slot(FairScheduler* scheduler, DataPathKind path) : scheduler_(scheduler), path_(path) {}
    FairScheduler* scheduler_ = nullptr;
    DataPathKind path_ = DataPathKind::kSharedMemory;
  };

  using Step = absl::AnyInvocable<void(absl::StatusOr<Slot>) &&>;

  // Counters since start, and what is in flight and waiting now.
  struct PathStats {
    uint64_t admitted = 0;  // steps granted a slot
    uint64_t queued = 0;    // of those, steps that waited for it
    absl::Duration waited;  // their waits, summed
    // Waited steps by wait: at most 100 us, 1 ms, 10 ms, 100 ms, 1 s, more.
    std::array<uint64_t, 6> waits_by_bucket{};
    uint32_t in_flight = 0;
    uint32_t waiting = 0;
  };
  struct Stats {
    uint32_t slots = 0;
    uint64_t grpc_operations = 0;  // gRPC streams admitted, not yet ended
    uint32_t shm_limit = 0;        // slots shm steps may hold now
    std::array<PathStats, kDataPathKinds> paths;
  };

  explicit FairScheduler(const FairSchedulerOptions& options);
  ~FairScheduler();  // Shutdown()
  FairScheduler(const FairScheduler&) = delete;
  FairScheduler& operator=(const FairScheduler&) = delete;

  // The flow of connection `connection` of `tenant` on `path`: the same one
  // for as long as someone holds it. Cheap enough to call per stream.
  std::shared_ptr<Flow> Join(std::string_view tenant, std::string_view connection,
                             DataPathKind path);

  // Blocks until `flow` is granted a slot; UNAVAILABLE once shut down.
  // REQUIRES: `flow` came from this scheduler.
  absl::StatusOr<Slot> Acquire(const std::shared_ptr<Flow>& flow);

  // Runs `step` with a slot: now, on this thread, when one is free and nothing
  // waits; else on a kv-fair thread once granted. After Shutdown() `step`
  // runs with UNAVAILABLE (here, or on the thread that shuts down). Never
  // blocks. REQUIRES: `flow` came from this scheduler.
  //
  // `continues`: the step continues an operation whose first step was
  // admitted (the next write of a Fetch, the next message of an Append): it
  // runs at once, on this thread, over the limit if every slot is taken, and
  // counts, so that new steps wait until in-flight steps are below the limit
  // again. An operation of several steps thus waits its turn once, like a
  // shm request of one step, and never hops threads after that.
  void Submit(const std::shared_ptr<Flow>& flow, Step step, bool continues = false);

  // The gRPC operation (stream) of `flow` whose first step was Submit()ted
  // has ended. REQUIRES: once per first step, at the stream's end.
  void EndOperation(const std::shared_ptr<Flow>& flow);

  // Idempotent. Waiting steps fail, later ones too; joins the kv-fair threads.
  void Shutdown();

  Stats stats() const;
  // kvcached_data_path_* (docs/metrics.md).
  void VisitCounters(CounterVisitor& visitor) const;

 private:
  struct Tenant;
  struct Waiter;

  void Release(DataPathKind path);
  // How many slots shm steps may hold now: all of them while no gRPC
  // operation is in flight; else slots x s/(g+s) rounded, at least 1, for g
  // gRPC operations and s shm flows waiting or running.
  uint32_t ShmLimitLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Whether a step of `path` may take a slot now.
  bool MayRunLocked(DataPathKind path) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Hands free slots to waiting steps, round-robin.
  void GrantLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Queues `waiter` behind its flow's earlier ones.
  void EnqueueLocked(Waiter* waiter) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void CountAdmittedLocked(DataPathKind path, absl::Duration waited, bool queued)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void Leave(Flow* flow);
  void RunGranted();

  const uint32_t slots_;
  Clock* const clock_;
  mutable Mutex mu_;
  std::condition_variable_any work_;  // a granted step for the kv-fair threads
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  uint32_t in_flight_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t grants_ ABSL_GUARDED_BY(mu_) = 0;  // grants after a wait, numbered
  uint64_t grpc_operations_ ABSL_GUARDED_BY(mu_) = 0;
  std::array<PathStats, kDataPathKinds> paths_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<std::string, std::unique_ptr<Tenant>> tenants_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<std::string, std::weak_ptr<Flow>> flows_ ABSL_GUARDED_BY(mu_);
  std::deque<Tenant*> ring_ ABSL_GUARDED_BY(mu_);     // tenants with steps waiting
  std::deque<Waiter*> granted_ ABSL_GUARDED_BY(mu_);  // Submit()ted, granted, not yet run
  std::vector<std::thread> threads_;
};

}  // namespace kvcache

#endif  // KVCACHE_SERVER_FRONTDOOR_FAIR_SCHEDULER_H_
