#include "server/frontdoor/fair_scheduler.h"

#include <pthread.h>

#include <algorithm>

namespace kvcache {

std::string_view DataPathName(DataPathKind path) {
  return path == DataPathKind::kGrpc ? "grpc" : "shm";
}

struct FairScheduler::Tenant {
  std::string name;
  int flows = 0;
  std::deque<Flow*> ready;  // its flows with steps waiting, least recently served first
  bool in_ring = false;
  uint64_t served = 0;  // the grant that last went to one of its flows (0: none)
};

namespace {

// Inserts `x` into `queue`, kept in order of `served` (the grant each was
// last served by), after those served as recently: a flow or tenant coming
// back after a while goes ahead of those that were served since.
template <typename T>
void InsertByService(std::deque<T*>& queue, T* x) {
  auto it = queue.end();
  while (it != queue.begin() && (*std::prev(it))->served > x->served) --it;
  queue.insert(it, x);
}

}  // namespace

class FairScheduler::Flow {
 public:
  Flow(std::string key, Tenant* tenant, DataPathKind path)
      : key(std::move(key)), tenant(tenant), path(path) {}
  const std::string key;
  Tenant* const tenant;
  const DataPathKind path;
  // Guarded by the scheduler's mu_.
  std::deque<Waiter*> waiting;
  bool ready = false;   // in tenant->ready
  uint64_t served = 0;  // the grant that last went to it (0: none)
};

struct FairScheduler::Waiter {
  std::shared_ptr<Flow> flow;
  absl::Time since;
  Step step;  // Submit(); empty for Acquire()
  // Acquire(): set under the scheduler's mu_.
  bool granted = false;
  bool failed = false;
  std::condition_variable_any cv;
};

FairScheduler::Slot& FairScheduler::Slot::operator=(Slot&& other) noexcept {
  if (this != &other) {
    Release();
    scheduler_ = std::exchange(other.scheduler_, nullptr);
    path_ = other.path_;
  }
  return *this;
}

void FairScheduler::Slot::Release() {
  if (scheduler_ == nullptr) return;
  std::exchange(scheduler_, nullptr)->Release(path_);
}

FairScheduler::FairScheduler(const FairSchedulerOptions& options)
    : slots_(std::max<uint32_t>(1, options.slots)), clock_(options.clock) {
  const uint32_t threads = std::max<uint32_t>(1, options.threads);
  for (uint32_t i = 0; i < threads; ++i) {
    threads_.emplace_back([this] {
      pthread_setname_np(pthread_self(), "kv-fair");
      RunGranted();
    });
  }
}

FairScheduler::~FairScheduler() { Shutdown(); }

std::shared_ptr<FairScheduler::Flow> FairScheduler::Join(std::string_view tenant,
                                                         std::string_view connection,
                                                         DataPathKind path) {
  std::string key(DataPathName(path));
  key.append(1, '\x1f').append(tenant).append(1, '\x1f').append(connection);
  MutexLock lock(&mu_);
  auto it = flows_.find(key);
  if (it != flows_.end()) {
    if (std::shared_ptr<Flow> flow = it->second.lock()) return flow;
  }
  std::unique_ptr<Tenant>& t = tenants_[std::string(tenant)];
  if (t == nullptr) {
    t = std::make_unique<Tenant>();
    t->name = std::string(tenant);
  }
  ++t->flows;
  std::shared_ptr<Flow> flow(new Flow(key, t.get(), path), [this](Flow* f) { Leave(f); });
  flows_[std::move(key)] = flow;
  return flow;
}

void FairScheduler::Leave(Flow* flow) {
  {
    MutexLock lock(&mu_);
    auto it = flows_.find(flow->key);
    if (it != flows_.end() && it->second.expired()) flows_.erase(it);
    Tenant* t = flow->tenant;
    if (--t->flows == 0 && !t->in_ring) tenants_.erase(t->name);
  }
  delete flow;
}

void FairScheduler::CountAdmittedLocked(DataPathKind path, absl::Duration waited, bool queued) {
  PathStats& p = paths_[static_cast<int>(path)];
  ++in_flight_;
  ++p.in_flight;
  ++p.admitted;
  if (!queued) return;
  ++p.queued;
  p.waited += waited;
  static constexpr absl::Duration kBounds[] = {absl::Microseconds(100), absl::Milliseconds(1),
                                               absl::Milliseconds(10), absl::Milliseconds(100),
                                               absl::Seconds(1)};
  size_t b = 0;
  while (b < std::size(kBounds) && waited > kBounds[b]) ++b;
  ++p.waits_by_bucket[b];
}

void FairScheduler::EnqueueLocked(Waiter* waiter) {
  Flow* f = waiter->flow.get();
  f->waiting.push_back(waiter);
  ++paths_[static_cast<int>(f->path)].waiting;
  if (!f->ready) {
    f->ready = true;
    InsertByService(f->tenant->ready, f);
  }
  if (!f->tenant->in_ring) {
    f->tenant->in_ring = true;
    InsertByService(ring_, f->tenant);
  }
}

uint32_t FairScheduler::ShmLimitLocked() const {
  const uint64_t g = grpc_operations_;
  if (g == 0 || slots_ == 1) return slots_;
  const uint64_t s =
      std::max<uint64_t>(1, paths_[static_cast<int>(DataPathKind::kSharedMemory)].waiting +
                                paths_[static_cast<int>(DataPathKind::kSharedMemory)].in_flight);
  const uint64_t reserve = std::min<uint64_t>(slots_ - 1, (slots_ * g + (g + s) / 2) / (g + s));
  return slots_ - static_cast<uint32_t>(reserve);
}

bool FairScheduler::MayRunLocked(DataPathKind path) const {
  if (in_flight_ >= slots_) return false;
  return path != DataPathKind::kSharedMemory ||
         paths_[static_cast<int>(path)].in_flight < ShmLimitLocked();
}

void FairScheduler::GrantLocked() {
  while (in_flight_ < slots_ && !ring_.empty()) {
    // The first tenant in turn with a flow that may run now, and its first
    // such flow (shm flows are passed over while shm is at its share).
    const bool shm_may_run = MayRunLocked(DataPathKind::kSharedMemory);
    size_t ti = 0, fi = 0;
    bool found = false;
    for (; ti < ring_.size() && !found; ++ti) {
      const std::deque<Flow*>& ready = ring_[ti]->ready;
      for (fi = 0; fi < ready.size(); ++fi) {
        if (shm_may_run || ready[fi]->path != DataPathKind::kSharedMemory) {
          found = true;
          break;
        }
      }
    }
    if (!found) break;
    --ti;
    Tenant* t = ring_[ti];
    ring_.erase(ring_.begin() + static_cast<std::ptrdiff_t>(ti));
    Flow* f = t->ready[fi];
    t->ready.erase(t->ready.begin() + static_cast<std::ptrdiff_t>(fi));
    Waiter* w = f->waiting.front();
    f->waiting.pop_front();
    f->served = t->served = ++grants_;
    if (!f->waiting.empty()) {
      t->ready.push_back(f);
    } else {
      f->ready = false;
    }
    if (!t->ready.empty()) {
      ring_.push_back(t);
    } else {
      t->in_ring = false;
    }
    --paths_[static_cast<int>(f->path)].waiting;
    CountAdmittedLocked(f->path, clock_->Now() - w->since, true);
    if (w->step) {
      granted_.push_back(w);  // the caller runs it or wakes a kv-fair thread
    } else {
      w->granted = true;
      w->cv.notify_one();
    }
  }
}

absl::StatusOr<FairScheduler::Slot> FairScheduler::Acquire(const std::shared_ptr<Flow>& flow) {
  const DataPathKind path = flow->path;
  Waiter w;
  mu_.Lock();
  if (stopping_) {
    mu_.Unlock();
    return absl::UnavailableError("the daemon is shutting down");
  }
  if (ring_.empty() && MayRunLocked(path)) {
    CountAdmittedLocked(path, absl::ZeroDuration(), false);
    mu_.Unlock();
    return Slot(this, path);
  }
  w.flow = flow;
  w.since = clock_->Now();
  EnqueueLocked(&w);
  w.cv.wait(mu_, [&w] { return w.granted || w.failed; });
  const bool granted = w.granted;
  mu_.Unlock();
  if (!granted) return absl::UnavailableError("the daemon is shutting down");
  return Slot(this, path);
}

void FairScheduler::Submit(const std::shared_ptr<Flow>& flow, Step step, bool continues) {
  const DataPathKind path = flow->path;
  mu_.Lock();
  if (!continues && path == DataPathKind::kGrpc) ++grpc_operations_;
  if (stopping_) {
    mu_.Unlock();
    std::move(step)(absl::UnavailableError("the daemon is shutting down"));
    return;
  }
  // Nothing waits that may run now: shm steps may wait while shm is at its
  // share, and then do not hold a gRPC step back.
  const bool none_eligible_waits =
      ring_.empty() || (paths_[static_cast<int>(DataPathKind::kGrpc)].waiting == 0 &&
                        !MayRunLocked(DataPathKind::kSharedMemory));
  if (continues || (MayRunLocked(path) && none_eligible_waits)) {
    CountAdmittedLocked(path, absl::ZeroDuration(), false);
    mu_.Unlock();
    std::move(step)(Slot(this, path));
    return;
  }
  auto* w = new Waiter;
  w->flow = flow;
  w->since = clock_->Now();
  w->step = std::move(step);
  EnqueueLocked(w);
  mu_.Unlock();
}

// Whether this thread is running a granted step from within Release().
thread_local bool running_granted_inline = false;

void FairScheduler::EndOperation(const std::shared_ptr<Flow>& flow) {
  if (flow->path != DataPathKind::kGrpc) return;
  MutexLock lock(&mu_);
  --grpc_operations_;
  GrantLocked();  // shm's share may have grown
  for (size_t i = 0; i < granted_.size(); ++i) work_.notify_one();
}

void FairScheduler::Release(DataPathKind path) {
  Waiter* mine = nullptr;
  {
    MutexLock lock(&mu_);
    --in_flight_;
    --paths_[static_cast<int>(path)].in_flight;
    GrantLocked();
    // The releasing thread runs one granted step itself (a wake-up of a
    // kv-fair thread costs more than the step, on a busy machine), unless it
    // is running one already: the chain is one step deep, not a recursion.
    if (!granted_.empty() && !running_granted_inline && !stopping_) {
      mine = granted_.front();
      granted_.pop_front();
    }
    for (size_t i = 0; i < granted_.size(); ++i) work_.notify_one();
  }
  if (mine == nullptr) return;
  running_granted_inline = true;
  std::move(mine->step)(Slot(this, mine->flow->path));
  running_granted_inline = false;
  delete mine;
}

void FairScheduler::RunGranted() {
  for (;;) {
    mu_.Lock();
    work_.wait(mu_, [this] {
      mu_.AssertHeld();
      return !granted_.empty() || stopping_;
    });
    if (granted_.empty()) {
      mu_.Unlock();
      return;
    }
    Waiter* w = granted_.front();
    granted_.pop_front();
    mu_.Unlock();
    std::move(w->step)(Slot(this, w->flow->path));
    delete w;
  }
}

void FairScheduler::Shutdown() {
  std::vector<Waiter*> failed;
  {
    MutexLock lock(&mu_);
    if (!stopping_) {
      stopping_ = true;
      for (Tenant* t : ring_) {
        for (Flow* f : t->ready) {
          for (Waiter* w : f->waiting) {
            if (w->step) {
              failed.push_back(w);
            } else {
              w->failed = true;
              w->cv.notify_one();
            }
          }
          f->waiting.clear();
          f->ready = false;
        }
        t->ready.clear();
        t->in_ring = false;
        if (t->flows == 0) tenants_.erase(t->name);
      }
      ring_.clear();
      for (PathStats& p : paths_) p.waiting = 0;
    }
    work_.notify_all();
  }
  for (Waiter* w : failed) {
    std::move(w->step)(absl::UnavailableError("the daemon is shutting down"));
    delete w;
  }
  for (std::thread& t : threads_) {
    if (t.joinable() && t.get_id() != std::this_thread::get_id()) t.join();
  }
}

FairScheduler::Stats FairScheduler::stats() const {
  MutexLock lock(&mu_);
  return {.slots = slots_,
          .grpc_operations = grpc_operations_,
          .shm_limit = ShmLimitLocked(),
          .paths = paths_};
}

void FairScheduler::VisitCounters(CounterVisitor& visitor) const {
  const Stats s = stats();
  visitor.Visit(
      {"kvcached_data_path_slots",
       "Data-path steps that may run at once (limits.data_path_concurrency)", CounterType::kGauge},
      {}, s.slots);
  visitor.Visit({"kvcached_data_path_grpc_operations",
                 "gRPC Append and Fetch streams admitted and not yet ended", CounterType::kGauge},
                {}, static_cast<double>(s.grpc_operations));
  visitor.Visit({"kvcached_data_path_shm_limit",
                 "Slots shared-memory steps may hold now (their share beside gRPC's operations)",
                 CounterType::kGauge},
                {}, s.shm_limit);
  static constexpr std::string_view kLe[] = {"0.0001", "0.001", "0.01", "0.1", "1", "+Inf"};
  for (int i = 0; i < kDataPathKinds; ++i) {
    const PathStats& p = s.paths[i];
    const std::string_view path = DataPathName(static_cast<DataPathKind>(i));
    visitor.Visit({"kvcached_data_path_admitted_total",
                   "Data-path steps (append and fetch work) granted a slot, by front door",
                   CounterType::kCounter},
                  {{"path", path}}, static_cast<double>(p.admitted));
    visitor.Visit(
        {"kvcached_data_path_queued_total",
         "Data-path steps that waited for a slot (every slot was taken)", CounterType::kCounter},
        {{"path", path}}, static_cast<double>(p.queued));
    visitor.Visit({"kvcached_data_path_wait_seconds_total",
                   "Seconds data-path steps waited for a slot, summed", CounterType::kCounter},
                  {{"path", path}}, absl::ToDoubleSeconds(p.waited));
    uint64_t cumulative = 0;
    for (size_t b = 0; b < p.waits_by_bucket.size(); ++b) {
      cumulative += p.waits_by_bucket[b];
      visitor.Visit(
          {"kvcached_data_path_waits_total",
           "Data-path steps that waited for a slot at most `max_seconds` seconds (cumulative)",
           CounterType::kCounter},
          {{"path", path}, {"max_seconds", kLe[b]}}, static_cast<double>(cumulative));
    }
    visitor.Visit(
        {"kvcached_data_path_in_flight", "Data-path steps holding a slot now", CounterType::kGauge},
        {{"path", path}}, p.in_flight);
    visitor.Visit({"kvcached_data_path_waiting", "Data-path steps waiting for a slot now",
                   CounterType::kGauge},
                  {{"path", path}}, p.waiting);
  }
}

}  // namespace kvcache
