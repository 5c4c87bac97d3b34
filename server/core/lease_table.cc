#include "server/core/lease_table.h"

#include <utility>

#include "absl/strings/str_cat.h"

namespace kvcache {

absl::StatusOr<uint64_t> LeaseTable::Add(Lease lease) {
  if (leases_.size() >= max_leases_) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "max_leases (", max_leases_, ") leases are live; release some or retry later"));
  }
  if (tokens_ + lease.tokens.size() > max_tokens_) {
    return absl::ResourceExhaustedError(
        absl::StrCat("live leases hold ", tokens_, " tokens; this one (", lease.tokens.size(),
                     ") would pass max_lease_tokens (", max_tokens_, ")"));
  }
  uint64_t id;
  do {
    id = absl::Uniform<uint64_t>(ids_);
  } while (id == 0 || leases_.contains(id));
  lease.metadata_bytes = MetadataBytes(lease.tokens.size(), lease.blocks.size());
  tokens_ += lease.tokens.size();
  metadata_bytes_ += lease.metadata_bytes;
  by_expiry_.emplace(lease.expires, id);
  leases_.emplace(id, std::move(lease));
  return id;
}

Lease* LeaseTable::Find(uint64_t id) {
  auto it = leases_.find(id);
  return it == leases_.end() ? nullptr : &it->second;
}

bool LeaseTable::Remove(uint64_t id, Lease* out) {
  auto it = leases_.find(id);
  if (it == leases_.end()) return false;
  Erase(it, out);
  return true;
}

size_t LeaseTable::RemoveModel(const ModelKey& model, std::vector<Lease>* out) {
  std::vector<uint64_t> ids;
  for (const auto& [id, lease] : leases_) {
    if (lease.model == model) ids.push_back(id);
  }
  for (uint64_t id : ids) Erase(leases_.find(id), &out->emplace_back());
  return ids.size();
}

void LeaseTable::Erase(Map::iterator it, Lease* out) {
  auto [first, last] = by_expiry_.equal_range(it->second.expires);
  for (auto e = first; e != last; ++e) {
    if (e->second == it->first) {
      by_expiry_.erase(e);
      break;
    }
  }
  tokens_ -= it->second.tokens.size();
  metadata_bytes_ -= it->second.metadata_bytes;
  *out = std::move(it->second);
  leases_.erase(it);
}

void LeaseTable::Expire(absl::Time now) {
  while (!by_expiry_.empty() && by_expiry_.begin()->first <= now) {
    auto it = leases_.find(by_expiry_.begin()->second);
    if (it != leases_.end()) {
      tokens_ -= it->second.tokens.size();
      metadata_bytes_ -= it->second.metadata_bytes;
      leases_.erase(it);
    }
    by_expiry_.erase(by_expiry_.begin());
  }
}

void LeaseTable::ForEach(absl::FunctionRef<void(Lease&)> visit) {
  for (auto& [id, lease] : leases_) visit(lease);
}

void LeaseTable::ForEachWithId(absl::FunctionRef<void(uint64_t, const Lease&)> visit) const {
  for (const auto& [id, lease] : leases_) visit(id, lease);
}

void LeaseTable::Clear() {
  leases_.clear();
  by_expiry_.clear();
  tokens_ = 0;
  metadata_bytes_ = 0;
}

}  // namespace kvcache
