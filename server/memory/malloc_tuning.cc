#include "server/memory/malloc_tuning.h"

#include <chrono>

#include "absl/strings/str_cat.h"
#include "server/common/status_macros.h"

#if defined(__GLIBC__)
#include <malloc.h>
#endif

namespace kvcache {

absl::Status MallocTuningOptions::Validate() const {
  if (mmap_threshold_bytes != 0 &&
      (mmap_threshold_bytes < (uint64_t{4} << 10) || mmap_threshold_bytes > (uint64_t{32} << 20))) {
    return absl::InvalidArgumentError(
        absl::StrCat("memory.mmap_threshold_bytes is ", mmap_threshold_bytes,
                     "; allowed: 0 (glibc's default) or 4096 .. 33554432"));
  }
  if (arena_max > 1024) {
    return absl::InvalidArgumentError(absl::StrCat("memory.malloc_arena_max is ", arena_max,
                                                   "; allowed: 0 (glibc's default) .. 1024"));
  }
  return absl::OkStatus();
}

absl::Status ApplyMallocTuning(const MallocTuningOptions& options) {
  KVCACHE_RETURN_IF_ERROR(options.Validate());
#if defined(__GLIBC__)
  if (options.mmap_threshold_bytes != 0 &&
      mallopt(M_MMAP_THRESHOLD, static_cast<int>(options.mmap_threshold_bytes)) != 1) {
    return absl::InternalError(
        absl::StrCat("mallopt(M_MMAP_THRESHOLD, ", options.mmap_threshold_bytes, ") failed"));
  }
  if (options.arena_max != 0 && mallopt(M_ARENA_MAX, static_cast<int>(options.arena_max)) != 1) {
    return absl::InternalError(
        absl::StrCat("mallopt(M_ARENA_MAX, ", options.arena_max, ") failed"));
  }
#endif
  return absl::OkStatus();
}

MallocStats ReadMallocStats() {
  MallocStats s;
#if defined(__GLIBC__) && (__GLIBC__ > 2 || (__GLIBC__ == 2 && __GLIBC_MINOR__ >= 33))
  const struct mallinfo2 info = mallinfo2();
  s.mapped_bytes = info.hblkhd;
  s.in_use_bytes = info.uordblks + info.hblkhd;
  s.free_bytes = info.fordblks;
#endif
  return s;
}

MallocTrimmer::MallocTrimmer(absl::Duration interval)
    : interval_(interval), thread_([this] { Run(); }) {}

MallocTrimmer::~MallocTrimmer() {
  {
    MutexLock lock(&mu_);
    stop_ = true;
  }
  wake_.notify_all();
  thread_.join();
}

void MallocTrimmer::RequestTrim() {
  {
    MutexLock lock(&mu_);
    requested_ = true;
  }
  wake_.notify_all();
}

void MallocTrimmer::TrimNow() {
#if defined(__GLIBC__)
  malloc_trim(0);
#endif
  trims_.fetch_add(1, std::memory_order_relaxed);
}

void MallocTrimmer::Run() {
  const bool periodic = interval_ > absl::ZeroDuration();
  const auto period = absl::ToChronoMilliseconds(interval_);
  for (;;) {
    {
      std::unique_lock<Mutex> lock(mu_);
      auto done = [this]() ABSL_NO_THREAD_SAFETY_ANALYSIS { return stop_ || requested_; };
      if (periodic) {
        wake_.wait_for(lock, period, done);
      } else {
        wake_.wait(lock, done);
      }
      mu_.AssertHeld();
      if (stop_) return;
      requested_ = false;
    }
    TrimNow();
  }
}

}  // namespace kvcache
