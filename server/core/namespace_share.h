// NamespaceShare: how much of a budget all namespaces share one namespace may
// take (security.tenant_limits.max_share, docs/security.md "Tenant limits").
//
// A namespace is the core's tenant. A share of 1 leaves the budget whole to
// any namespace (authentication off); below 1 each namespace may hold at most
// that fraction of it, and never less than one unit, so one tenant cannot
// exhaust what every tenant needs. Pure functions: thread-safe.
#ifndef KVCACHE_SERVER_CORE_NAMESPACE_SHARE_H_
#define KVCACHE_SERVER_CORE_NAMESPACE_SHARE_H_

#include <algorithm>
#include <cstdint>
#include <string>

#include "absl/strings/str_cat.h"

namespace kvcache {

// The part of `budget` one namespace may hold under `share` (0 < share <= 1):
// floor(budget * share), at least 1, and the whole budget at share >= 1.
inline uint64_t NamespaceShareOf(uint64_t budget, double share) {
  if (share >= 1.0 || budget == 0) return budget;
  const auto part = static_cast<uint64_t>(static_cast<double>(budget) * share);
  return std::clamp<uint64_t>(part, 1, budget);
}

// The message of a RESOURCE_EXHAUSTED refusal: namespace `ns` holds `held`
// of `what`, and `more` would pass its share of the budget `setting`.
inline std::string NamespaceShareMessage(const std::string& ns, const std::string& what,
                                         uint64_t held, uint64_t more, const std::string& setting,
                                         uint64_t budget, double share) {
  std::string message = absl::StrCat("namespace \"", ns, "\" holds ", held, " ", what, "; ", more,
                                     " more would pass its share ");
  absl::StrAppend(&message, NamespaceShareOf(budget, share), " (", setting, " ", budget,
                  " x security.tenant_limits.max_share ", share, "); release some or retry later");
  return message;
}

}  // namespace kvcache

#endif  // KVCACHE_SERVER_CORE_NAMESPACE_SHARE_H_
