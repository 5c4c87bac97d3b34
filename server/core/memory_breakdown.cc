#include "server/core/memory_breakdown.h"

#include <algorithm>
#include <utility>

namespace kvcache {
namespace {

constexpr CounterFamily kMemoryBytes{
    "kvcached_memory_bytes",
    "The daemon's own memory (VmRSS minus RssShmem) by part; the parts add up to it "
    "(docs/operations.md, Memory)",
    CounterType::kGauge};
constexpr CounterFamily kResidentBytes{
    "kvcached_memory_resident_bytes",
    "Resident memory as the kernel counts it (/proc/self/status): rss (VmRSS), anonymous, file, "
    "shared (the workers' regions mapped in) and own (rss minus shared)",
    CounterType::kGauge};
constexpr CounterFamily kBoundBytes{
    "kvcached_memory_bound_bytes",
    "The bound the daemon's own memory is kept under: 1.1 x host capacity + 64 MiB",
    CounterType::kGauge};
constexpr CounterFamily kThreads{"kvcached_process_threads", "Threads of the daemon now",
                                 CounterType::kGauge};
constexpr CounterFamily kTrims{"kvcached_malloc_trims_total",
                               "Times the allocator's free memory was given back (malloc_trim)",
                               CounterType::kCounter};

uint64_t Take(uint64_t& from, uint64_t want) {
  const uint64_t got = std::min(from, want);
  from -= got;
  return got;
}

}  // namespace

std::string_view MemoryPartName(MemoryPart part) {
  switch (part) {
    case MemoryPart::kHostPool:
      return "host_pool";
    case MemoryPart::kIndexMetadata:
      return "index_metadata";
    case MemoryPart::kSsdStaging:
      return "ssd_staging";
    case MemoryPart::kCheckpointWriter:
      return "checkpoint_writer";
    case MemoryPart::kConnections:
      return "connections";
    case MemoryPart::kThreadStacks:
      return "thread_stacks";
    case MemoryPart::kAllocatorFree:
      return "allocator_free";
    case MemoryPart::kBinary:
      return "binary";
    case MemoryPart::kUnattributed:
    case MemoryPart::kCount:
      break;
  }
  return "unattributed";
}

uint64_t MemoryBoundBytes(uint64_t capacity_bytes) {
  return capacity_bytes + capacity_bytes / 10 + (uint64_t{64} << 20);
}

MemoryBreakdown BreakDownMemory(const MemoryInputs& in) {
  MemoryBreakdown b;
  b.process = in.process;
  b.malloc = in.malloc;
  b.malloc_trims = in.malloc_trims;
  b.capacity_bytes = in.capacity_bytes;
  b.bound_bytes = MemoryBoundBytes(in.capacity_bytes);
  b.own_bytes = in.process.OwnBytes();
  b.shm_connections = in.shm_connections;

  // The heap the allocator hands out holds the counted heap parts; what is
  // left of it is the connections' and calls' buffers.
  uint64_t heap = in.malloc.in_use_bytes;
  const uint64_t metadata = Take(heap, in.metadata_bytes);
  const uint64_t staging = Take(heap, in.ssd_staging_bytes);
  const uint64_t writer = Take(heap, in.checkpoint_writer_bytes);
  // Each part takes what it wants of what the parts before it left, measured
  // parts first, so the parts add up to own_bytes exactly. The allocator's
  // free bytes come last: they include pages malloc_trim already gave back
  // (still on its free lists, not resident), an upper bound.
  const std::pair<MemoryPart, uint64_t> wants[] = {
      {MemoryPart::kHostPool, in.pool_reserved_bytes},
      {MemoryPart::kBinary, in.process.rss_file_bytes},
      {MemoryPart::kThreadStacks, uint64_t{in.process.threads} * kThreadStackResidentBytes},
      {MemoryPart::kIndexMetadata, metadata},
      {MemoryPart::kSsdStaging, staging},
      {MemoryPart::kCheckpointWriter, writer},
      {MemoryPart::kConnections, heap},
      {MemoryPart::kAllocatorFree, in.malloc.free_bytes},
  };
  uint64_t rest = b.own_bytes;
  for (const auto& [part, want] : wants) b.parts[static_cast<size_t>(part)] = Take(rest, want);
  b.parts[static_cast<size_t>(MemoryPart::kUnattributed)] = rest;
  return b;
}

void MemoryBreakdown::VisitCounters(CounterVisitor& visitor) const {
  for (size_t i = 0; i < kMemoryParts; ++i) {
    visitor.Visit(kMemoryBytes, {{"part", MemoryPartName(static_cast<MemoryPart>(i))}},
                  static_cast<double>(parts[i]));
  }
  visitor.Visit(kResidentBytes, {{"kind", "rss"}}, static_cast<double>(process.vm_rss_bytes));
  visitor.Visit(kResidentBytes, {{"kind", "anonymous"}},
                static_cast<double>(process.rss_anon_bytes));
  visitor.Visit(kResidentBytes, {{"kind", "file"}}, static_cast<double>(process.rss_file_bytes));
  visitor.Visit(kResidentBytes, {{"kind", "shared"}}, static_cast<double>(process.rss_shmem_bytes));
  visitor.Visit(kResidentBytes, {{"kind", "own"}}, static_cast<double>(own_bytes));
  visitor.Visit(kBoundBytes, static_cast<double>(bound_bytes));
  visitor.Visit(kThreads, static_cast<double>(process.threads));
  visitor.Visit(kTrims, static_cast<double>(malloc_trims));
}

}  // namespace kvcache
