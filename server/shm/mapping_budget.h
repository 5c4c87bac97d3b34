// MappingBudget: caps on the workers' regions the daemon maps at once, for
// the whole daemon and per owner (a tenant, or a uid when authentication is
// off), so that one worker cannot use up the daemon's address space or its
// map count (vm.max_map_count) and make every other tenant's attaches fail.
//
// Each ShmSession asks for a Grant before it maps a region and holds it while
// the region stays attached; the Grant gives its share back when destroyed.
// A refusal is RESOURCE_EXHAUSTED naming the limit (its config field).
//
// Thread-safe: sessions answered on every worker share one budget. Grants
// must not outlive it.
#ifndef KVCACHE_SERVER_SHM_MAPPING_BUDGET_H_
#define KVCACHE_SERVER_SHM_MAPPING_BUDGET_H_

#include <cstdint>
#include <string>
#include <string_view>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "server/common/counter_visitor.h"
#include "server/common/mutex.h"

namespace kvcache {

struct MappingLimits {
  uint64_t max_mappings = 16384;                 // shm.max_mappings
  uint64_t max_bytes = uint64_t{16} << 40;       // shm.max_mapped_bytes
  uint64_t max_owner_mappings = 4096;            // shm.max_tenant_mappings
  uint64_t max_owner_bytes = uint64_t{4} << 40;  // shm.max_tenant_mapped_bytes
};

class MappingBudget {
 public:
  // One mapping's share of the budget; empty when default-constructed.
  class Grant {
   public:
    Grant() = default;
    ~Grant() { Reset(); }
    Grant(Grant&& other) noexcept;
    Grant& operator=(Grant&& other) noexcept;
    Grant(const Grant&) = delete;
    Grant& operator=(const Grant&) = delete;
    // Gives the share back now.
    void Reset();

   private:
    friend class MappingBudget;
    Grant(MappingBudget* budget, std::string owner, uint64_t bytes)
        : budget_(budget), owner_(std::move(owner)), bytes_(bytes) {}
    MappingBudget* budget_ = nullptr;
    std::string owner_;
    uint64_t bytes_ = 0;
  };

  explicit MappingBudget(const MappingLimits& limits) : limits_(limits) {}
  MappingBudget(const MappingBudget&) = delete;
  MappingBudget& operator=(const MappingBudget&) = delete;

  // A share for one mapping of `bytes` bytes owned by `owner` (e.g.
  // "tenant acme", "uid 1000"); RESOURCE_EXHAUSTED when it would pass a limit,
  // whose config field is then stored in `*limit` (when not null).
  absl::StatusOr<Grant> Reserve(const std::string& owner, uint64_t bytes,
                                std::string_view* limit = nullptr);

  // What is granted now: daemon-wide, and for one owner.
  uint64_t mappings() const;
  uint64_t mapped_bytes() const;
  uint64_t owner_mappings(const std::string& owner) const;
  uint64_t owner_mapped_bytes(const std::string& owner) const;
  // kvcached_shm_mappings and kvcached_shm_mapped_bytes (gauges; docs/metrics.md).
  void VisitCounters(CounterVisitor& visitor) const;

 private:
  struct Usage {
    uint64_t mappings = 0;
    uint64_t bytes = 0;
  };
  void Release(const std::string& owner, uint64_t bytes);

  const MappingLimits limits_;
  mutable Mutex mu_;
  Usage total_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<std::string, Usage> owners_ ABSL_GUARDED_BY(mu_);  // owners with a grant
};

}  // namespace kvcache

#endif  // KVCACHE_SERVER_SHM_MAPPING_BUDGET_H_
