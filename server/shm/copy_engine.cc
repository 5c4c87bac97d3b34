#include "server/shm/copy_engine.h"

#include <algorithm>
#include <atomic>
#include <cstring>

namespace kvcache {

struct CopyEngine::Job {
  std::vector<CopyRange> pieces;
  std::atomic<size_t> next{0};
  int helpers = 0;  // helpers working on the job; guarded by the engine's mu_
};

CopyEngine::CopyEngine(uint32_t helpers, uint64_t min_parallel_bytes)
    : min_parallel_bytes_(min_parallel_bytes) {
  helpers_.reserve(helpers);
  for (uint32_t i = 0; i < helpers; ++i) helpers_.emplace_back([this] { HelperLoop(); });
}

CopyEngine::~CopyEngine() {
  {
    MutexLock lock(&mu_);
    stopping_ = true;
  }
  work_.notify_all();
  for (std::thread& t : helpers_) t.join();
}

void CopyEngine::Copy(std::span<const CopyRange> ranges) {
  uint64_t total = 0;
  for (const CopyRange& r : ranges) total += r.bytes;
  if (helpers_.empty() || total < min_parallel_bytes_) {
    for (const CopyRange& r : ranges) {
      if (r.bytes > 0) std::memcpy(r.dst, r.src, r.bytes);
    }
    return;
  }
  Job job;
  for (const CopyRange& r : ranges) {
    for (size_t at = 0; at < r.bytes; at += kPieceBytes) {
      job.pieces.push_back({r.dst + at, r.src + at, std::min(kPieceBytes, r.bytes - at)});
    }
  }
  {
    MutexLock lock(&mu_);
    queue_.push_back(&job);
  }
  work_.notify_all();
  Work(job);
  // Every piece is taken. Unqueue the job, then wait for the helpers still
  // copying theirs: once none holds it, every piece is copied.
  MutexLock lock(&mu_);
  if (auto it = std::find(queue_.begin(), queue_.end(), &job); it != queue_.end()) {
    queue_.erase(it);
  }
  idle_.wait(mu_, [this, &job] {
    mu_.AssertHeld();
    return job.helpers == 0;
  });
}

void CopyEngine::Work(Job& job) {
  for (;;) {
    const size_t i = job.next.fetch_add(1);
    if (i >= job.pieces.size()) return;
    const CopyRange& p = job.pieces[i];
    std::memcpy(p.dst, p.src, p.bytes);
  }
}

void CopyEngine::HelperLoop() {
  for (;;) {
    Job* job = nullptr;
    {
      MutexLock lock(&mu_);
      work_.wait(mu_, [this] {
        mu_.AssertHeld();
        return stopping_ || !queue_.empty();
      });
      if (stopping_) return;
      job = queue_.front();
      if (job->next.load() >= job->pieces.size()) {
        queue_.pop_front();  // exhausted: its caller is finishing it
        continue;
      }
      ++job->helpers;
    }
    Work(*job);
    {
      MutexLock lock(&mu_);
      --job->helpers;
    }
    idle_.notify_all();
  }
}

}  // namespace kvcache
