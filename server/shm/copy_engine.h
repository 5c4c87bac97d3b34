// CopyEngine: memcpy of many ranges, spread over helper threads when a
// request moves enough bytes to be worth it.
//
// The caller's thread always copies too; with no helper threads (the default
// on small machines) Copy() is a plain loop of memcpy. Large ranges are cut
// into pieces of at least kPieceBytes so helpers share one big block.
//
// Thread-safe: any number of threads may call Copy() at once; they share the
// helpers.
#ifndef KVCACHE_SERVER_SHM_COPY_ENGINE_H_
#define KVCACHE_SERVER_SHM_COPY_ENGINE_H_

#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <span>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "server/common/mutex.h"

namespace kvcache {

struct CopyRange {
  std::byte* dst = nullptr;
  const std::byte* src = nullptr;
  size_t bytes = 0;
};

class CopyEngine {
 public:
  static constexpr size_t kPieceBytes = size_t{1} << 20;

  // `helpers` threads besides the callers'; requests under `min_parallel_bytes`
  // are copied by the caller alone.
  CopyEngine(uint32_t helpers, uint64_t min_parallel_bytes);
  ~CopyEngine();
  CopyEngine(const CopyEngine&) = delete;
  CopyEngine& operator=(const CopyEngine&) = delete;

  // Copies every range; returns when all are copied.
  void Copy(std::span<const CopyRange> ranges);

 private:
  struct Job;
  void HelperLoop();
  // Copies pieces of `job` until none is left.
  static void Work(Job& job);

  const uint64_t min_parallel_bytes_;
  // Guards queue_, stopping_ and every Job::helpers (which the analysis
  // cannot name: a Job lives on its caller's stack).
  Mutex mu_;
  std::condition_variable_any work_;  // a job was queued, or stopping_
  std::condition_variable_any idle_;  // a helper left a job
  std::deque<Job*> queue_ ABSL_GUARDED_BY(mu_);
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::vector<std::thread> helpers_;
};

}  // namespace kvcache

#endif  // KVCACHE_SERVER_SHM_COPY_ENGINE_H_
