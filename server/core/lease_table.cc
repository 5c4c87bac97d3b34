#include "server/core/lease_table.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "server/core/namespace_share.h"

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
  if (namespace_share_ < 1.0) {
    const auto it = by_namespace_.find(lease.model.ns);
    const NamespaceUse use = it == by_namespace_.end() ? NamespaceUse{} : it->second;
    if (use.leases >= NamespaceShareOf(max_leases_, namespace_share_)) {
      return absl::ResourceExhaustedError(NamespaceShareMessage(lease.model.ns, "leases",
                                                                use.leases, 1, "limits.max_leases",
                                                                max_leases_, namespace_share_));
    }
    if (use.tokens + lease.tokens.size() > NamespaceShareOf(max_tokens_, namespace_share_)) {
      return absl::ResourceExhaustedError(
          NamespaceShareMessage(lease.model.ns, "lease tokens", use.tokens, lease.tokens.size(),
                                "limits.max_lease_tokens", max_tokens_, namespace_share_));
    }
  }
  uint64_t id;
  do {
    id = absl::Uniform<uint64_t>(ids_);
  } while (id == 0 || leases_.contains(id));
  lease.metadata_bytes = MetadataBytes(lease.tokens.size(), lease.blocks.size());
  tokens_ += lease.tokens.size();
  metadata_bytes_ += lease.metadata_bytes;
  NamespaceUse& use = by_namespace_[lease.model.ns];
  ++use.leases;
  use.tokens += lease.tokens.size();
  use.metadata_bytes += lease.metadata_bytes;
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
  Uncount(it->second);
  *out = std::move(it->second);
  leases_.erase(it);
}

void LeaseTable::Uncount(const Lease& lease) {
  tokens_ -= lease.tokens.size();
  metadata_bytes_ -= lease.metadata_bytes;
  auto it = by_namespace_.find(lease.model.ns);
  if (it == by_namespace_.end()) return;
  it->second.tokens -= lease.tokens.size();
  it->second.metadata_bytes -= lease.metadata_bytes;
  if (--it->second.leases == 0) by_namespace_.erase(it);
}

size_t LeaseTable::leases_of(const std::string& ns) const {
  auto it = by_namespace_.find(ns);
  return it == by_namespace_.end() ? 0 : it->second.leases;
}

uint64_t LeaseTable::tokens_of(const std::string& ns) const {
  auto it = by_namespace_.find(ns);
  return it == by_namespace_.end() ? 0 : it->second.tokens;
}

uint64_t LeaseTable::metadata_bytes_of(const std::string& ns) const {
  auto it = by_namespace_.find(ns);
  return it == by_namespace_.end() ? 0 : it->second.metadata_bytes;
}

void LeaseTable::Expire(absl::Time now) {
  while (!by_expiry_.empty() && by_expiry_.begin()->first <= now) {
    auto it = leases_.find(by_expiry_.begin()->second);
    if (it != leases_.end()) {
      Uncount(it->second);
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
  by_namespace_.clear();
  tokens_ = 0;
  metadata_bytes_ = 0;
}

}  // namespace kvcache
