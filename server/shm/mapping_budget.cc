#include "server/shm/mapping_budget.h"

#include <utility>

#include "absl/strings/str_cat.h"

namespace kvcache {

MappingBudget::Grant::Grant(Grant&& other) noexcept
    : budget_(std::exchange(other.budget_, nullptr)),
      owner_(std::move(other.owner_)),
      bytes_(std::exchange(other.bytes_, 0)) {}

MappingBudget::Grant& MappingBudget::Grant::operator=(Grant&& other) noexcept {
  if (this != &other) {
    Reset();
    budget_ = std::exchange(other.budget_, nullptr);
    owner_ = std::move(other.owner_);
    bytes_ = std::exchange(other.bytes_, 0);
  }
  return *this;
}

void MappingBudget::Grant::Reset() {
  if (budget_ != nullptr) budget_->Release(owner_, bytes_);
  budget_ = nullptr;
  bytes_ = 0;
}

absl::StatusOr<MappingBudget::Grant> MappingBudget::Reserve(const std::string& owner,
                                                            uint64_t bytes,
                                                            std::string_view* limit) {
  std::string_view ignored;
  if (limit == nullptr) limit = &ignored;
  MutexLock lock(&mu_);
  const Usage mine = owners_.contains(owner) ? owners_.at(owner) : Usage{};
  if (total_.mappings + 1 > limits_.max_mappings) {
    *limit = "shm.max_mappings";
    return absl::ResourceExhaustedError(
        absl::StrCat("the daemon maps ", total_.mappings,
                     " shared-memory regions, the limit (shm.max_mappings); detach one"));
  }
  if (bytes > limits_.max_bytes - total_.bytes) {
    *limit = "shm.max_mapped_bytes";
    return absl::ResourceExhaustedError(absl::StrCat(
        "the daemon maps ", total_.bytes, " bytes of shared-memory regions; ", bytes,
        " more would pass the limit of ", limits_.max_bytes, " (shm.max_mapped_bytes)"));
  }
  if (mine.mappings + 1 > limits_.max_owner_mappings) {
    *limit = "shm.max_tenant_mappings";
    return absl::ResourceExhaustedError(
        absl::StrCat(owner, " has ", mine.mappings,
                     " shared-memory regions mapped, the limit (shm.max_tenant_mappings)"));
  }
  if (bytes > limits_.max_owner_bytes - mine.bytes) {
    *limit = "shm.max_tenant_mapped_bytes";
    return absl::ResourceExhaustedError(
        absl::StrCat(owner, " has ", mine.bytes, " bytes of shared-memory regions mapped; ", bytes,
                     " more would pass the limit of ", limits_.max_owner_bytes,
                     " (shm.max_tenant_mapped_bytes)"));
  }
  Usage& usage = owners_[owner];
  ++usage.mappings;
  usage.bytes += bytes;
  ++total_.mappings;
  total_.bytes += bytes;
  return Grant(this, owner, bytes);
}

void MappingBudget::Release(const std::string& owner, uint64_t bytes) {
  MutexLock lock(&mu_);
  auto it = owners_.find(owner);
  if (it == owners_.end()) return;  // not ours: cannot happen
  --it->second.mappings;
  it->second.bytes -= bytes;
  if (it->second.mappings == 0) owners_.erase(it);
  --total_.mappings;
  total_.bytes -= bytes;
}

uint64_t MappingBudget::mappings() const {
  MutexLock lock(&mu_);
  return total_.mappings;
}

uint64_t MappingBudget::mapped_bytes() const {
  MutexLock lock(&mu_);
  return total_.bytes;
}

uint64_t MappingBudget::owner_mappings(const std::string& owner) const {
  MutexLock lock(&mu_);
  auto it = owners_.find(owner);
  return it == owners_.end() ? 0 : it->second.mappings;
}

uint64_t MappingBudget::owner_mapped_bytes(const std::string& owner) const {
  MutexLock lock(&mu_);
  auto it = owners_.find(owner);
  return it == owners_.end() ? 0 : it->second.bytes;
}

void MappingBudget::VisitCounters(CounterVisitor& visitor) const {
  Usage total;
  {
    MutexLock lock(&mu_);
    total = total_;
  }
  visitor.Visit({"kvcached_shm_mappings", "Workers' shared-memory regions the daemon maps now",
                 CounterType::kGauge},
                {}, static_cast<double>(total.mappings));
  visitor.Visit({"kvcached_shm_mapped_bytes",
                 "Bytes of the workers' shared-memory regions the daemon maps now (address space)",
                 CounterType::kGauge},
                {}, static_cast<double>(total.bytes));
}

}  // namespace kvcache
