#include "server/config/tier_list.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "server/core/lower_copies.h"

namespace kvcache {
namespace {

// The kinds a level may be, in the order they may appear.
constexpr const char* kKinds[] = {"host", "ssd"};

}  // namespace

std::vector<std::string> TierListOf(const v1::ServerConfig& config) {
  if (!config.tiers().empty()) return {config.tiers().begin(), config.tiers().end()};
  std::vector<std::string> tiers = {"host"};
  if (!config.ssd_tier().path().empty()) tiers.push_back("ssd");
  return tiers;
}

absl::Status ValidateTierList(const v1::ServerConfig& config) {
  const std::vector<std::string> tiers = TierListOf(config);
  const std::string listed = absl::StrCat("tiers is [\"", absl::StrJoin(tiers, "\", \""), "\"]");
  if (tiers.front() != "host") {
    return absl::InvalidArgumentError(
        absl::StrCat(listed, "; the first level must be \"host\" (blocks are written there)"));
  }
  for (size_t i = 0; i < tiers.size(); ++i) {
    if (std::find(std::begin(kKinds), std::end(kKinds), tiers[i]) == std::end(kKinds)) {
      return absl::InvalidArgumentError(absl::StrCat(listed, "; \"", tiers[i],
                                                     "\" is not a level kvcached has (",
                                                     absl::StrJoin(kKinds, ", "), ")"));
    }
    if (std::find(tiers.begin(), tiers.begin() + i, tiers[i]) != tiers.begin() + i) {
      return absl::InvalidArgumentError(
          absl::StrCat(listed, "; \"", tiers[i], "\" is listed twice"));
    }
  }
  if (tiers.size() - 1 > kMaxLowerLevels) {
    return absl::InvalidArgumentError(
        absl::StrCat(listed, "; at most ", kMaxLowerLevels, " levels may sit below \"host\""));
  }
  const bool ssd_listed = std::find(tiers.begin(), tiers.end(), "ssd") != tiers.end();
  if (ssd_listed && config.ssd_tier().path().empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat(listed, "; \"ssd\" needs ssd_tier.path (the file or device it uses)"));
  }
  if (!ssd_listed && !config.ssd_tier().path().empty()) {
    return absl::InvalidArgumentError(absl::StrCat(
        listed, "; ssd_tier.path is set but \"ssd\" is not listed: add it, or clear the path"));
  }
  return absl::OkStatus();
}

}  // namespace kvcache
