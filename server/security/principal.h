// Principal: who a caller is and what it may do, once authenticated.
//
// A principal comes from the principals file (principals_file.h): a name, a
// tenant (the namespace it owns; kAllNamespaces for an admin of every
// namespace) and a role. With authentication off every caller is
// Principal::Anonymous(), an admin of every namespace.
#ifndef KVCACHE_SERVER_SECURITY_PRINCIPAL_H_
#define KVCACHE_SERVER_SECURITY_PRINCIPAL_H_

#include <optional>
#include <string>
#include <string_view>

namespace kvcache {

// What a principal may call (access_policy.h maps each method to a role).
enum class Role {
  kReader,  // server info, stats, model list, WhoAmI: nothing that reads KV
  kWorker,  // the reader's calls plus the data calls, in its tenant only
  kAdmin,   // everything, in every namespace
};

// How a caller proved who it is.
enum class AuthMethod {
  kNone,         // authentication is off
  kToken,        // "authorization: Bearer <token>"
  kCertificate,  // a TLS client certificate's identity
  kUnixUid,      // the peer's uid on a Unix socket (SO_PEERCRED)
};

// The tenant of a principal that may use every namespace.
inline constexpr std::string_view kAllNamespaces = "*";

struct Principal {
  std::string name;
  std::string tenant;  // a namespace, or kAllNamespaces
  Role role = Role::kReader;
  AuthMethod authenticated_by = AuthMethod::kNone;

  // The caller when authentication is off: an admin of every namespace.
  static Principal Anonymous() {
    return {.name = "anonymous",
            .tenant = std::string(kAllNamespaces),
            .role = Role::kAdmin,
            .authenticated_by = AuthMethod::kNone};
  }
};

// "reader", "worker", "admin".
std::string_view RoleName(Role role);
// The role named `name`; nullopt for any other text.
std::optional<Role> ParseRole(std::string_view name);
// "none", "token", "certificate", "unix_uid".
std::string_view AuthMethodName(AuthMethod method);

}  // namespace kvcache

#endif  // KVCACHE_SERVER_SECURITY_PRINCIPAL_H_
