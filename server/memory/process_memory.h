// ProcessMemory: what the kernel says this process holds in RAM, read from
// /proc/self/status (VmRSS and its parts RssAnon, RssFile, RssShmem, and the
// thread count). The daemon's own memory is VmRSS minus RssShmem: the shared
// memory it maps (the workers' sealed memfd regions of the shared-memory data
// plane) is charged to the workers that created it, and counted once there.
//
// Plain values and free functions; thread-safe (each call reads the file
// anew). No dependency besides Abseil.
#ifndef KVCACHE_SERVER_MEMORY_PROCESS_MEMORY_H_
#define KVCACHE_SERVER_MEMORY_PROCESS_MEMORY_H_

#include <cstdint>
#include <string_view>

#include "absl/status/statusor.h"

namespace kvcache {

struct ProcessMemory {
  uint64_t vm_rss_bytes = 0;     // resident, all kinds (VmRSS)
  uint64_t rss_anon_bytes = 0;   // anonymous: heap, stacks, the host pool (RssAnon)
  uint64_t rss_file_bytes = 0;   // file-backed: the binary and its libraries (RssFile)
  uint64_t rss_shmem_bytes = 0;  // shared memory mapped in: workers' regions (RssShmem)
  uint32_t threads = 0;          // Threads

  // VmRSS minus RssShmem: what this process itself costs the host.
  uint64_t OwnBytes() const {
    return vm_rss_bytes > rss_shmem_bytes ? vm_rss_bytes - rss_shmem_bytes : 0;
  }
};

// Parses the text of a /proc/<pid>/status file. INVALID_ARGUMENT naming the
// first field (VmRSS, RssAnon, RssFile, RssShmem, Threads) that is missing or
// not a number; the sizes are in kB there and are returned in bytes.
absl::StatusOr<ProcessMemory> ParseProcStatus(std::string_view text);

// ParseProcStatus of /proc/self/status; UNAVAILABLE when it cannot be read.
absl::StatusOr<ProcessMemory> ReadProcessMemory();

}  // namespace kvcache

#endif  // KVCACHE_SERVER_MEMORY_PROCESS_MEMORY_H_
