#include "server/frontdoor/call_scope.h"

#include <string>

#include "server/frontdoor/proto_convert.h"

namespace kvcache {

absl::StatusOr<ModelKey> ScopedModelKey(const Caller& caller, std::string_view ns,
                                        std::string_view model_id) {
  absl::StatusOr<std::string> scoped = caller.NamespaceOf(ns);
  if (!scoped.ok()) return scoped.status();
  return ToModelKey(*scoped, model_id);
}

}  // namespace kvcache
