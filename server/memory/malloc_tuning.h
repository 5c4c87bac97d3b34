// Tuning of glibc's allocator for a long-running daemon whose large buffers
// come and go (blocks read back from SSD into the heap, decoded blocks, gRPC
// and checkpoint buffers), and the allocator's own numbers.
//
// - ApplyMallocTuning: mallopt() once at start-up, before threads exist.
//   M_MMAP_THRESHOLD puts every allocation of at least that many bytes in its
//   own mapping, so it goes back to the OS when freed instead of staying in a
//   heap arena; M_ARENA_MAX caps the arenas (glibc makes up to 8 per core,
//   each keeping its own free memory).
// - MallocTrimmer: a thread that calls malloc_trim(0) every `interval`, and
//   at once when asked (RequestTrim, after a large free), so the free memory
//   the arenas keep is given back; it counts the trims.
// - ReadMallocStats: mallinfo2(): bytes in use, free but kept, mapped.
//
// Thread-safe unless noted. Without glibc (another libc) the functions do
// nothing and the numbers are 0.
#ifndef KVCACHE_SERVER_MEMORY_MALLOC_TUNING_H_
#define KVCACHE_SERVER_MEMORY_MALLOC_TUNING_H_

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <thread>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "server/common/mutex.h"

namespace kvcache {

struct MallocTuningOptions {
  // Allocations of at least this many bytes get their own mapping; 0 keeps
  // glibc's (dynamic) threshold. 4 KiB .. 32 MiB.
  uint64_t mmap_threshold_bytes = uint64_t{64} << 10;
  // Most malloc arenas; 0 keeps glibc's default (8 per core).
  uint32_t arena_max = 4;

  // INVALID_ARGUMENT naming the field when out of range.
  absl::Status Validate() const;
};

// mallopt()s `options`. REQUIRES: called once, before other threads
// allocate. INTERNAL when glibc refuses a setting.
absl::Status ApplyMallocTuning(const MallocTuningOptions& options);

struct MallocStats {
  uint64_t in_use_bytes = 0;  // handed out (small chunks and mapped ones)
  uint64_t free_bytes = 0;    // free in the arenas, still resident until trimmed
  uint64_t mapped_bytes = 0;  // allocations in their own mappings (in in_use_bytes)
  uint32_t arenas = 0;        // not known from mallinfo2: 0
};

// The allocator's numbers now (mallinfo2; walks every arena under its lock,
// so call it at scrape time, not per request).
MallocStats ReadMallocStats();

// Calls malloc_trim(0) every `interval` (0: only when asked) on its own
// thread until destroyed.
class MallocTrimmer {
 public:
  explicit MallocTrimmer(absl::Duration interval);
  ~MallocTrimmer();  // stops and joins the thread
  MallocTrimmer(const MallocTrimmer&) = delete;
  MallocTrimmer& operator=(const MallocTrimmer&) = delete;

  // Trims soon (on the trimmer's thread), e.g. after a large free.
  void RequestTrim();
  // Trims on the caller's thread now.
  void TrimNow();
  // malloc_trim calls so far (kvcached_malloc_trims_total).
  uint64_t trims() const { return trims_.load(std::memory_order_relaxed); }

 private:
  void Run();

  const absl::Duration interval_;
  std::atomic<uint64_t> trims_{0};
  Mutex mu_;
  std::condition_variable_any wake_;
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  bool requested_ ABSL_GUARDED_BY(mu_) = false;
  std::thread thread_;
};

}  // namespace kvcache

#endif  // KVCACHE_SERVER_MEMORY_MALLOC_TUNING_H_
