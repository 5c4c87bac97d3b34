// CheckpointService: checkpoints as the daemon runs them (docs/checkpoints.md).
//
// Owns the Checkpointer and the Restorer of one checkpoint directory:
//   Open()            creates the directory, finds the next sequence, and
//                     turns on the lower tier's retention of freed space,
//                     within lower_retained_share of its capacity
//   PrepareRestore()  before serving: picks the checkpoint to restore and
//                     re-attaches its lower-tier copies
//   Start()           a thread that restores the rest while the daemon
//                     serves, then takes a checkpoint every `interval`, at a
//                     lower CPU priority than serving (nice +10)
//   CheckpointNow()   one checkpoint on demand (kvcachectl checkpoint now),
//                     taken by that thread; the caller waits for it
//   Shutdown()        stops the thread; then, when asked, a final checkpoint
// No checkpoint is taken until the restore has finished: a checkpoint of a
// half-restored cache would become the newest and lose the rest.
//
// Thread-safe.
#ifndef KVCACHE_SERVER_CHECKPOINT_CHECKPOINT_SERVICE_H_
#define KVCACHE_SERVER_CHECKPOINT_CHECKPOINT_SERVICE_H_

#include <atomic>
#include <condition_variable>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "server/checkpoint/checkpoint_types.h"
#include "server/checkpoint/checkpointer.h"
#include "server/checkpoint/file_system.h"
#include "server/checkpoint/restorer.h"
#include "server/common/mutex.h"
#include "server/core/cache.h"

namespace kvcache::checkpoint {

struct CheckpointServiceOptions {
  CheckpointerOptions checkpointer;            // dir, keep, full_every, zstd level
  absl::Duration interval = absl::Minutes(5);  // zero: no periodic checkpoints
  bool restore_on_start = true;
  // Share of the lower (SSD) tier's capacity that space retained for the
  // newest checkpoint may hold against new writes; past it, writes reuse the
  // oldest retained space (Tier::SetRetentionBudget). 1: never.
  double lower_retained_share = 0.10;
  // Called after each checkpoint run, ok or not, with no lock held: the
  // daemon asks its allocator to give the writer's freed buffers back to the
  // OS (MallocTrimmer::RequestTrim). Empty: nothing.
  std::function<void()> after_run;
};

struct CheckpointServiceStatus {
  std::string dir;
  absl::Duration interval;
  absl::Time started;  // when the service was opened
  RestoreProgress restore;
  std::optional<CheckpointRun> last;  // the last committed by this daemon
  absl::Time last_time = absl::InfinitePast();
  uint64_t ok = 0;
  uint64_t failed = 0;
  std::string last_error;
  bool in_progress = false;
  uint64_t writer_bytes = 0;  // host memory of the checkpoint being written
};

// What Verify() read.
struct VerifyOutcome {
  CheckpointInfo info;  // state kComplete when every record verified
  uint64_t records = 0;
  uint64_t bytes = 0;
};

// Lowers the calling thread's CPU priority (nice +10), as the service's
// thread runs: a checkpoint yields the cores to serving. Best effort.
void LowerCurrentThreadPriority();

class CheckpointService {
 public:
  // REQUIRES: cache and fs outlive the service. UNAVAILABLE when the
  // directory cannot be created or listed.
  static absl::StatusOr<std::unique_ptr<CheckpointService>> Open(Cache* cache, FileSystem* fs,
                                                                 CheckpointServiceOptions options);
  ~CheckpointService();  // Shutdown(false) if not done

  // Errors as Restorer::Prepare (a checkpoint of a newer format version).
  absl::Status PrepareRestore();
  void Start();
  // FAILED_PRECONDITION while the restore runs; the checkpointer's error otherwise.
  absl::StatusOr<CheckpointRun> CheckpointNow();
  absl::StatusOr<std::vector<CheckpointInfo>> List() const;
  // Reads checkpoint `sequence` (0: the newest complete one) and verifies
  // every record. NOT_FOUND when there is no such checkpoint.
  absl::StatusOr<VerifyOutcome> Verify(uint64_t sequence) const;
  CheckpointServiceStatus Status() const;
  // Stops the background thread (a restore in progress stops where it is);
  // with `final_checkpoint`, then takes one (unless the restore had not
  // finished). Idempotent.
  void Shutdown(bool final_checkpoint);

 private:
  CheckpointService(Cache* cache, FileSystem* fs, CheckpointServiceOptions options,
                    uint64_t next_sequence);
  void Loop();
  absl::StatusOr<CheckpointRun> RunAndRecord(const char* why, Pacing pacing = Pacing::kLimited);

  FileSystem* const fs_;
  const CheckpointServiceOptions options_;
  Checkpointer checkpointer_;
  Restorer restorer_;
  std::atomic<bool> stop_{false};
  std::thread thread_;
  mutable Mutex mu_;
  std::condition_variable_any wake_;  // the thread: stop, or a request
  std::condition_variable_any done_;  // callers of CheckpointNow
  bool shut_down_ ABSL_GUARDED_BY(mu_) = false;
  uint64_t requested_ ABSL_GUARDED_BY(mu_) = 0;                   // on-demand requests so far
  uint64_t completed_ ABSL_GUARDED_BY(mu_) = 0;                   // requests served so far
  absl::StatusOr<CheckpointRun> on_demand_ ABSL_GUARDED_BY(mu_);  // the last one's result
  std::optional<CheckpointRun> last_ ABSL_GUARDED_BY(mu_);
  absl::Time last_time_ ABSL_GUARDED_BY(mu_) = absl::InfinitePast();
  uint64_t ok_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t failed_ ABSL_GUARDED_BY(mu_) = 0;
  std::string last_error_ ABSL_GUARDED_BY(mu_);
  std::atomic<bool> in_progress_{false};
  const absl::Time started_ = absl::Now();
};

}  // namespace kvcache::checkpoint

#endif  // KVCACHE_SERVER_CHECKPOINT_CHECKPOINT_SERVICE_H_
