#include "server/checkpoint/checkpoint_service.h"

#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"
#include "server/checkpoint/checkpoint_directory.h"
#include "spdlog/spdlog.h"

namespace kvcache::checkpoint {

void LowerCurrentThreadPriority() {
  // Linux applies a nice value to the calling thread alone.
  if (::setpriority(PRIO_PROCESS, static_cast<id_t>(::gettid()), 10) != 0) {
    spdlog::debug("checkpoints: could not lower the thread's priority: {}", std::strerror(errno));
  }
}

absl::StatusOr<std::unique_ptr<CheckpointService>> CheckpointService::Open(
    Cache* cache, FileSystem* fs, CheckpointServiceOptions options) {
  const std::string& dir = options.checkpointer.dir;
  if (absl::Status s = fs->CreateDir(dir); !s.ok()) {
    return absl::Status(s.code(), absl::StrCat("checkpoint.dir ", dir, ": ", s.message()));
  }
  absl::StatusOr<uint64_t> next =
      CheckpointDirectory(fs, dir, options.checkpointer.mac_key).NextSequence();
  if (!next.ok()) return next.status();
  if (Tier* lower = cache->tiers().lower_tier(); lower != nullptr && lower->persistent()) {
    lower->SetRetention(true);
    const double share = std::clamp(options.lower_retained_share, 0.0, 1.0);
    lower->SetRetentionBudget(
        share >= 1.0 ? UINT64_MAX
                     : static_cast<uint64_t>(share * lower->GetStats().capacity_bytes));
  }
  return std::unique_ptr<CheckpointService>(
      new CheckpointService(cache, fs, std::move(options), *next));
}

CheckpointService::CheckpointService(Cache* cache, FileSystem* fs, CheckpointServiceOptions options,
                                     uint64_t next_sequence)
    : fs_(fs),
      options_(std::move(options)),
      checkpointer_(cache, fs, options_.checkpointer, next_sequence),
      restorer_(cache, fs, options_.checkpointer.dir, options_.checkpointer.mac_key) {}

CheckpointService::~CheckpointService() { Shutdown(false); }

absl::Status CheckpointService::PrepareRestore() {
  if (!options_.restore_on_start) return absl::OkStatus();
  return restorer_.Prepare();
}

void CheckpointService::Start() {
  thread_ = std::thread([this] { Loop(); });
}

void CheckpointService::Loop() {
  restorer_.Run(stop_);
  checkpointer_.SeedPayloads(restorer_.TakePayloads());
  LowerCurrentThreadPriority();
  while (!stop_.load()) {
    uint64_t serving = 0;
    uint64_t completed = 0;
    mu_.Lock();  // cv_any waits on the Mutex itself, which the analysis follows
    auto woken = [this] {
      mu_.AssertHeld();
      return stop_.load() || requested_ > completed_;
    };
    if (options_.interval == absl::ZeroDuration()) {
      wake_.wait(mu_, woken);
    } else {
      wake_.wait_for(mu_, absl::ToChronoNanoseconds(options_.interval), woken);
    }
    serving = requested_;
    completed = completed_;
    mu_.Unlock();
    if (stop_.load()) break;
    const bool on_demand = serving > completed;
    absl::StatusOr<CheckpointRun> run = RunAndRecord(on_demand ? "on demand" : "periodic");
    if (on_demand) {
      MutexLock lock(&mu_);
      on_demand_ = std::move(run);
      completed_ = serving;
    }
    done_.notify_all();
  }
  done_.notify_all();
}

absl::StatusOr<CheckpointRun> CheckpointService::RunAndRecord(const char* why, Pacing pacing) {
  if (!restorer_.finished()) {
    return absl::FailedPreconditionError(
        "the restore from the last checkpoint is still running; a checkpoint now would replace "
        "it with a partial one (kvcachectl checkpoint list shows its progress)");
  }
  in_progress_ = true;
  absl::StatusOr<CheckpointRun> run = checkpointer_.Run(pacing);
  in_progress_ = false;
  if (options_.after_run) options_.after_run();
  MutexLock lock(&mu_);
  if (run.ok()) {
    ++ok_;
    last_ = *run;
    last_time_ = absl::Now();
    spdlog::info(
        "checkpoint {} ({}, {}): {} blocks, {} payloads written, {} referenced, {} lower copies, "
        "{} bytes in {}",
        run->sequence, why, run->full ? "full" : "incremental", run->blocks, run->host_payloads,
        run->referenced_payloads, run->lower_copies, run->data_bytes,
        absl::FormatDuration(run->duration));
  } else {
    ++failed_;
    last_error_ = std::string(run.status().message());
    spdlog::error("checkpoint ({}) failed: {}; the previous checkpoint stays the newest", why,
                  run.status().ToString());
  }
  return run;
}

absl::StatusOr<CheckpointRun> CheckpointService::CheckpointNow() {
  if (!restorer_.finished()) return RunAndRecord("on demand");  // FAILED_PRECONDITION
  MutexLock lock(&mu_);
  if (shut_down_) return absl::UnavailableError("kvcached is shutting down");
  if (!thread_.joinable()) {  // not started: the caller's thread takes it
    mu_.Unlock();
    absl::StatusOr<CheckpointRun> run = RunAndRecord("on demand");
    mu_.Lock();
    return run;
  }
  const uint64_t ticket = ++requested_;
  wake_.notify_all();
  done_.wait(mu_, [&] {
    mu_.AssertHeld();
    return completed_ >= ticket || stop_.load();
  });
  if (completed_ < ticket) return absl::UnavailableError("kvcached is shutting down");
  return on_demand_;
}

absl::StatusOr<std::vector<CheckpointInfo>> CheckpointService::List() const {
  return CheckpointDirectory(fs_, options_.checkpointer.dir, options_.checkpointer.mac_key).List();
}

absl::StatusOr<VerifyOutcome> CheckpointService::Verify(uint64_t sequence) const {
  CheckpointDirectory directory(fs_, options_.checkpointer.dir, options_.checkpointer.mac_key);
  if (sequence == 0) {
    absl::StatusOr<CheckpointInfo> newest = directory.NewestComplete();
    if (!newest.ok()) return newest.status();
    sequence = newest->sequence;
  }
  absl::StatusOr<std::vector<CheckpointInfo>> listed = directory.List();
  if (!listed.ok()) return listed.status();
  VerifyOutcome out;
  auto it = std::find_if(listed->begin(), listed->end(),
                         [&](const CheckpointInfo& i) { return i.sequence == sequence; });
  if (it == listed->end()) {
    return absl::NotFoundError(
        absl::StrCat("there is no checkpoint ", sequence, " in ", options_.checkpointer.dir));
  }
  out.info = *it;
  absl::StatusOr<VerifyReport> report = directory.Verify(sequence);
  if (!report.ok()) return report.status();
  out.records = report->records_read;
  out.bytes = report->data_bytes;
  if (!report->status.ok() && out.info.state == CheckpointState::kComplete) {
    out.info.state = CheckpointState::kCorrupt;
    out.info.reason = std::string(report->status.message());
  }
  return out;
}

CheckpointServiceStatus CheckpointService::Status() const {
  CheckpointServiceStatus s;
  s.dir = options_.checkpointer.dir;
  s.interval = options_.interval;
  s.started = started_;
  s.restore = restorer_.progress();
  s.in_progress = in_progress_.load();
  s.writer_bytes = checkpointer_.writer_bytes();
  MutexLock lock(&mu_);
  s.last = last_;
  s.last_time = last_time_;
  s.ok = ok_;
  s.failed = failed_;
  s.last_error = last_error_;
  return s;
}

void CheckpointService::Shutdown(bool final_checkpoint) {
  {
    MutexLock lock(&mu_);
    if (shut_down_) return;
    shut_down_ = true;
    stop_ = true;
  }
  wake_.notify_all();
  if (thread_.joinable()) thread_.join();
  if (final_checkpoint) {
    if (!restorer_.finished() || restorer_.progress().state == RestoreState::kStopped) {
      spdlog::warn(
          "no checkpoint at shutdown: the restore had not finished, and the checkpoint it was "
          "restoring stays the newest");
      return;
    }
    (void)RunAndRecord("shutdown", Pacing::kFullSpeed);  // nothing is served any more
  }
}

}  // namespace kvcache::checkpoint
