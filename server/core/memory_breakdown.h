// MemoryBreakdown: where the daemon's own memory goes, part by part, and the
// bound it is kept under (docs/operations.md, "Memory").
//
// The daemon's own memory is VmRSS minus RssShmem (ProcessMemory::OwnBytes:
// the workers' shared-memory regions it maps are the workers'). It is split
// into the parts below; what no part explains is `unattributed`, so the parts
// always add up to the measured figure, and a large `unattributed` is itself
// the finding. The bound is 1.1 x the host tier's capacity + 64 MiB.
//
// BreakDownMemory is a pure function of plain numbers gathered by the caller
// (the daemon, at scrape or GetStats time), so tests feed it made-up inputs.
// Thread-safe: no state.
#ifndef KVCACHE_SERVER_CORE_MEMORY_BREAKDOWN_H_
#define KVCACHE_SERVER_CORE_MEMORY_BREAKDOWN_H_

#include <array>
#include <cstdint>
#include <string_view>

#include "server/common/counter_visitor.h"
#include "server/memory/malloc_tuning.h"
#include "server/memory/process_memory.h"

namespace kvcache {

// What the breakdown is computed from.
struct MemoryInputs {
  ProcessMemory process;  // measured: /proc/self/status
  MallocStats malloc;     // measured: the allocator's own numbers
  uint64_t malloc_trims = 0;
  uint64_t capacity_bytes = 0;       // host_tier.capacity_bytes
  uint64_t pool_reserved_bytes = 0;  // the host pool's mapped spans (block payloads)
  uint64_t metadata_bytes = 0;       // index metadata and lease tokens (counted by the cache)
  uint64_t ssd_staging_bytes = 0;    // the SSD tier's bounce buffers
  uint64_t checkpoint_writer_bytes = 0;
  uint64_t shm_connections = 0;  // shared-memory connections open now
};

// The parts, in the order they are reported.
enum class MemoryPart : uint8_t {
  kHostPool,          // block payloads: the host pool's mapped spans
  kIndexMetadata,     // index nodes, tokens, importance state, lease tokens
  kSsdStaging,        // SSD bounce buffers (kept idle up to ssd_tier.staging_cache_bytes)
  kCheckpointWriter,  // the writer's buffer, scratch and zstd context, while one runs
  kConnections,       // other heap in use: gRPC's and the shared-memory plane's
                      // per-connection and per-call buffers, requests in flight
  kThreadStacks,      // resident stack pages, estimated per thread
  kAllocatorFree,     // free heap the allocator keeps until trimmed (at most what the
                      // other parts leave: its free lists include trimmed pages)
  kBinary,            // file-backed pages: the executable and its libraries
  kUnattributed,      // own memory minus every part above (never negative)
  kCount,
};
inline constexpr size_t kMemoryParts = static_cast<size_t>(MemoryPart::kCount);

// The label value of a part ("host_pool", "index_metadata", ...).
std::string_view MemoryPartName(MemoryPart part);

// Resident bytes assumed per thread's stack (glibc maps 8 MiB, threads touch
// a few pages of it; measured at 26 KiB each under the soak).
inline constexpr uint64_t kThreadStackResidentBytes = uint64_t{32} << 10;

// The bound: 1.1 x capacity + 64 MiB.
uint64_t MemoryBoundBytes(uint64_t capacity_bytes);

struct MemoryBreakdown {
  ProcessMemory process;
  MallocStats malloc;
  uint64_t malloc_trims = 0;
  uint64_t capacity_bytes = 0;
  uint64_t bound_bytes = 0;  // MemoryBoundBytes(capacity_bytes)
  uint64_t own_bytes = 0;    // process.OwnBytes()
  uint64_t shm_connections = 0;
  std::array<uint64_t, kMemoryParts> parts{};  // by MemoryPart; sums to own_bytes

  uint64_t part(MemoryPart p) const { return parts[static_cast<size_t>(p)]; }
  bool over_bound() const { return own_bytes > bound_bytes; }

  // kvcached_memory_bytes{part}, kvcached_memory_resident_bytes{kind},
  // kvcached_memory_bound_bytes, kvcached_process_threads,
  // kvcached_malloc_trims_total.
  void VisitCounters(CounterVisitor& visitor) const;
};

// Splits `in.process.OwnBytes()` into the parts. The heap parts the daemon
// counts itself (metadata, staging, the checkpoint writer) are carved out of
// the allocator's in-use bytes, and what remains of those is `connections`.
// Then each part takes what it wants of what the parts before it left, in
// the order: host pool, binary, thread stacks, metadata, staging, checkpoint
// writer, connections, allocator free (an upper bound: trimmed pages stay on
// the allocator's free lists), so the parts always add up to own_bytes; what
// is left is `unattributed`.
MemoryBreakdown BreakDownMemory(const MemoryInputs& in);

}  // namespace kvcache

#endif  // KVCACHE_SERVER_CORE_MEMORY_BREAKDOWN_H_
