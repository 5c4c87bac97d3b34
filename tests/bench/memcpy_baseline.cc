// memcpy_baseline: the memory-bandwidth yardstick that run_benchmarks.sh prints next to the
// kvcached and Redis load figures. Loading a KV block can never be faster than copying it once
// on the same machine, so this is the ceiling every transport is compared with.
//
// For each value size and thread count, every thread copies values of that size from its own
// source buffer to its own destination buffer, slot after slot, for --min-time seconds. The
// buffers of all threads together are --working-set-mib MiB of source and as much again of
// destination (256 MiB by default, far larger than the last-level cache), so successive copies
// miss the cache and the figure is DRAM bandwidth, not cache bandwidth. Every page is written
// before timing starts (pre-faulted), so no page fault is timed. GB/s counts the bytes copied
// (10^9 bytes per second; each byte is read once and written once); with several threads it is
// the aggregate over all threads for the wall time of the slowest.
//
// Output: one line per (size, threads), after a header:
//   memcpy  <size_bytes>  <threads>  <GB/s>  <copies>  <seconds>
// No gRPC and no kvcached library: it builds and runs anywhere a C++17 compiler does.

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "CLI/CLI.hpp"

namespace {

using Clock = std::chrono::steady_clock;

struct FreeDeleter {
  void operator()(char* p) const { std::free(p); }
};
using Buffer = std::unique_ptr<char, FreeDeleter>;

// Page-aligned buffer of `bytes` (rounded up to a page), every page written once.
Buffer AllocatePrefaulted(size_t bytes, unsigned char fill) {
  constexpr size_t kPage = 4096;
  size_t rounded = (bytes + kPage - 1) / kPage * kPage;
  Buffer b(static_cast<char*>(std::aligned_alloc(kPage, rounded)));
  if (b == nullptr) {
    std::fprintf(stderr, "memcpy_baseline: cannot allocate %zu bytes\n", rounded);
    std::exit(1);
  }
  std::memset(b.get(), fill, rounded);
  return b;
}

// Keeps the compiler from proving a copy dead: `p` escapes and memory is clobbered.
inline void Escape(void* p) { asm volatile("" : : "g"(p) : "memory"); }

struct ThreadResult {
  uint64_t copies = 0;
  double seconds = 0;
};

// One thread: copy `size`-byte slots from src to dst, cycling through `slots` of them, until
// `min_time` seconds have passed. Starts when `go` turns true.
void CopyLoop(const char* src, char* dst, size_t size, size_t slots, double min_time,
              const std::atomic<bool>* go, ThreadResult* out) {
  while (!go->load(std::memory_order_acquire)) std::this_thread::yield();
  // Check the clock every `batch` copies, about 16 MiB apart, so the check costs nothing.
  const uint64_t batch = std::max<uint64_t>(1, (16u << 20) / size);
  const auto start = Clock::now();
  const auto deadline = start + std::chrono::duration<double>(min_time);
  uint64_t copies = 0;
  size_t slot = 0;
  auto now = start;
  do {
    for (uint64_t i = 0; i < batch; ++i) {
      std::memcpy(dst + slot * size, src + slot * size, size);
      Escape(dst);
      if (++slot == slots) slot = 0;
    }
    copies += batch;
    now = Clock::now();
  } while (now < deadline);
  out->copies = copies;
  out->seconds = std::chrono::duration<double>(now - start).count();
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"memcpy bandwidth over a working set larger than the last-level cache"};
  std::vector<size_t> sizes = {64 << 10, 512 << 10, 2 << 20, 4 << 20};
  std::vector<int> threads = {1, 4, 16};
  size_t working_set_mib = 256;
  double min_time = 1.0;
  app.add_option("--sizes", sizes, "value sizes in bytes, comma-separated")
      ->delimiter(',')
      ->capture_default_str();
  app.add_option("--threads", threads, "thread counts, comma-separated")
      ->delimiter(',')
      ->capture_default_str();
  app.add_option("--working-set-mib", working_set_mib,
                 "source MiB over all threads (as much again for destinations)")
      ->capture_default_str();
  app.add_option("--min-time", min_time, "seconds per (size, threads) measurement")
      ->capture_default_str();
  CLI11_PARSE(app, argc, argv);
  if (min_time <= 0 || working_set_mib == 0) {
    std::fprintf(stderr, "memcpy_baseline: --min-time and --working-set-mib must be positive\n");
    return 2;
  }
  for (size_t s : sizes) {
    if (s == 0) {
      std::fprintf(stderr, "memcpy_baseline: --sizes must be positive\n");
      return 2;
    }
  }
  for (int t : threads) {
    if (t < 1 || t > 1024) {
      std::fprintf(stderr, "memcpy_baseline: --threads must be 1..1024, got %d\n", t);
      return 2;
    }
  }

  const size_t total = working_set_mib << 20;
  std::printf("# memcpy working set: %zu MiB source + %zu MiB destination over all threads\n",
              working_set_mib, working_set_mib);
  std::printf("%-7s %11s %8s %8s %10s %8s\n", "op", "size_bytes", "threads", "GB/s", "copies",
              "seconds");
  for (int nthreads : threads) {
    // Each thread's share of the working set, at least two slots of the largest size.
    const size_t largest = *std::max_element(sizes.begin(), sizes.end());
    const size_t per_thread = std::max(total / nthreads, 2 * largest);
    std::vector<Buffer> src, dst;
    for (int t = 0; t < nthreads; ++t) {
      src.push_back(AllocatePrefaulted(per_thread, 0x5a));
      dst.push_back(AllocatePrefaulted(per_thread, 0));
    }
    for (size_t size : sizes) {
      const size_t slots = per_thread / size;
      std::atomic<bool> go{false};
      std::vector<ThreadResult> results(nthreads);
      std::vector<std::thread> workers;
      for (int t = 0; t < nthreads; ++t) {
        workers.emplace_back(CopyLoop, src[t].get(), dst[t].get(), size, slots, min_time, &go,
                             &results[t]);
      }
      go.store(true, std::memory_order_release);
      for (auto& w : workers) w.join();
      uint64_t copies = 0;
      double seconds = 0;
      for (const auto& r : results) {
        copies += r.copies;
        seconds = std::max(seconds, r.seconds);
      }
      // The destination was really written: spot-check one byte per thread.
      for (int t = 0; t < nthreads; ++t) {
        if (static_cast<unsigned char>(dst[t].get()[0]) != 0x5a) {
          std::fprintf(stderr, "memcpy_baseline: destination of thread %d not written\n", t);
          return 1;
        }
      }
      std::printf("%-7s %11zu %8d %8.2f %10llu %8.3f\n", "memcpy", size, nthreads,
                  static_cast<double>(copies) * size / seconds / 1e9,
                  static_cast<unsigned long long>(copies), seconds);
      std::fflush(stdout);
    }
  }
  return 0;
}
