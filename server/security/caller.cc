#include "server/security/caller.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace kvcache {

Caller Caller::Anonymous() {
  static const auto* const kNone = new std::shared_ptr<const std::vector<std::string>>(
      std::make_shared<const std::vector<std::string>>());
  return Caller(Principal::Anonymous(), *kNone);
}

Caller::Caller(Principal principal,
               std::shared_ptr<const std::vector<std::string>> shared_namespaces)
    : principal_(std::move(principal)), shared_(std::move(shared_namespaces)) {}

bool Caller::MaySee(std::string_view ns) const {
  if (every_namespace() || ns == principal_.tenant) return true;
  return std::find(shared_->begin(), shared_->end(), ns) != shared_->end();
}

absl::StatusOr<std::string> Caller::NamespaceOf(std::string_view requested) const {
  if (every_namespace()) return std::string(requested);
  if (requested.empty()) return principal_.tenant;
  if (MaySee(requested)) return std::string(requested);
  std::string allowed = absl::StrCat("\"", principal_.tenant, "\"");
  if (!shared_->empty()) {
    absl::StrAppend(&allowed, " and the shared namespaces \"", absl::StrJoin(*shared_, "\", \""),
                    "\"");
  }
  return absl::PermissionDeniedError(absl::StrCat("namespace \"", std::string(requested), "\" is not open to ",
                                                  principal_.name, " (tenant \"", principal_.tenant,
                                                  "\"): it may use ", allowed));
}

}  // namespace kvcache
