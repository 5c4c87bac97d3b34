// call_auth: a gRPC call's credentials, for AccessControl (server/security).
//
// Every handler of the Cache and Admin services starts with AdmitCall(); the
// namespace it then acts on comes from ScopedModelKey()
// (server/frontdoor/call_scope.h), never from the request alone.
#ifndef KVCACHE_SERVER_RPC_CALL_AUTH_H_
#define KVCACHE_SERVER_RPC_CALL_AUTH_H_

#include <grpcpp/server_context.h>

#include <string_view>

#include "absl/status/statusor.h"
#include "server/security/access_control.h"

namespace kvcache {

// The metadata key a bearer token comes in: "authorization: Bearer <token>".
inline constexpr std::string_view kAuthorizationHeader = "authorization";

// What the call carries: its bearer token, its TLS client certificate's
// verified identities, and on the Unix socket its peer's uid.
Credentials CredentialsOf(const grpc::ServerContextBase& ctx);

// Who is making the call `method` on `ctx`, or why it is refused. A null
// `access` admits every caller as the anonymous admin.
absl::StatusOr<Caller> AdmitCall(AccessControl* access, const grpc::ServerContextBase& ctx,
                                 std::string_view method);

}  // namespace kvcache

#endif  // KVCACHE_SERVER_RPC_CALL_AUTH_H_
