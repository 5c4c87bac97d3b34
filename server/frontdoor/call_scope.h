// call_scope: the model a call acts on, scoped to its caller's tenant. Both
// front doors (gRPC handlers and the shared-memory sessions) resolve every
// (namespace, model_id) a request names through ScopedModelKey, never from
// the request alone (docs/security.md, "Tenants are namespaces").
#ifndef KVCACHE_SERVER_FRONTDOOR_CALL_SCOPE_H_
#define KVCACHE_SERVER_FRONTDOOR_CALL_SCOPE_H_

#include <string_view>

#include "absl/status/statusor.h"
#include "server/core/layout.h"
#include "server/security/caller.h"

namespace kvcache {

// The model a request naming (`ns`, `model_id`) acts on for `caller`:
// PERMISSION_DENIED for a namespace the caller may not use, INVALID_ARGUMENT
// for a malformed name.
absl::StatusOr<ModelKey> ScopedModelKey(const Caller& caller, std::string_view ns,
                                        std::string_view model_id);

}  // namespace kvcache

#endif  // KVCACHE_SERVER_FRONTDOOR_CALL_SCOPE_H_
