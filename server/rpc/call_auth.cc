#include "server/rpc/call_auth.h"

#include <grpcpp/security/auth_context.h>

#include <string>

#include "absl/strings/match.h"
#include "server/rpc/unix_acceptor.h"

namespace kvcache {

Credentials CredentialsOf(const grpc::ServerContextBase& ctx) {
  Credentials credentials;
  const auto& metadata = ctx.client_metadata();
  auto it = metadata.find(std::string(kAuthorizationHeader));
  if (metadata.count(std::string(kAuthorizationHeader)) > 1) {
    // Two tokens: which one decides would be a guess. Neither does.
    credentials.malformed_authorization = true;
  } else if (it != metadata.end()) {
    const absl::string_view value(it->second.data(), it->second.size());
    constexpr absl::string_view kBearer = "Bearer ";
    if (value.size() > kBearer.size() && absl::StartsWithIgnoreCase(value, kBearer)) {
      credentials.bearer_token = std::string(value.substr(kBearer.size()));
    } else {
      credentials.malformed_authorization = true;
    }
  }
  credentials.unix_uid = PeerUidOf(ctx.peer());
  std::shared_ptr<const grpc::AuthContext> auth = ctx.auth_context();
  if (auth != nullptr && auth->IsPeerAuthenticated()) {
    for (const grpc::string_ref& identity : auth->GetPeerIdentity()) {
      credentials.certificate_identities.emplace_back(identity.data(), identity.size());
    }
  }
  return credentials;
}

absl::StatusOr<Caller> AdmitCall(AccessControl* access, const grpc::ServerContextBase& ctx,
                                 std::string_view method) {
  if (access == nullptr || !access->enabled()) return Caller::Anonymous();
  return access->Admit(CredentialsOf(ctx), method);
}

}  // namespace kvcache
