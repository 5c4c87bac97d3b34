// The ordered list of levels that hold KV (ServerConfig.tiers): "host"
// first, then the levels below it in the order blocks sink through them.
// docs/tiers.md, "Levels".
#ifndef KVCACHE_SERVER_CONFIG_TIER_LIST_H_
#define KVCACHE_SERVER_CONFIG_TIER_LIST_H_

#include <string>
#include <vector>

#include "absl/status/status.h"
#include "kvcache/v1/config.pb.h"

namespace kvcache {

// The levels of `config`, fastest first: its `tiers`, or when it lists none
// the default, "host" with "ssd" after it when ssd_tier.path is set.
std::vector<std::string> TierListOf(const v1::ServerConfig& config);

// INVALID_ARGUMENT, naming the entry, for a list whose first entry is not
// "host", with an unknown or repeated kind, more levels below host memory
// than a block has slots for, "ssd" without ssd_tier.path, or an ssd_tier.path
// that "ssd" is not listed for.
absl::Status ValidateTierList(const v1::ServerConfig& config);

}  // namespace kvcache

#endif  // KVCACHE_SERVER_CONFIG_TIER_LIST_H_
