// Which role each RPC needs: the one table every front door consults.
//
// Every method of the Cache and Admin gRPC services and of the shared-memory
// data plane is listed; a method that is not is refused to everyone but
// admins (so a new RPC is admin-only until someone decides otherwise, and
// access_policy_test fails until it is listed).
#ifndef KVCACHE_SERVER_SECURITY_ACCESS_POLICY_H_
#define KVCACHE_SERVER_SECURITY_ACCESS_POLICY_H_

#include <optional>
#include <string_view>

#include "server/security/principal.h"

namespace kvcache {

enum class Access {
  kAnyRole,  // describes the server or the caller; reads no KV
  kData,     // reads or writes KV or leases in the caller's namespaces
  kAdmin,    // operates on models, in the caller's namespaces
  kDaemon,   // operates the whole daemon, or reaches past namespaces (device memory):
             // an admin of every namespace only
};

// The access `method` (its name as logged: "Lookup", "GetStats",
// "ShmFetchInto", ...) needs; nullopt for a method the table does not know.
std::optional<Access> AccessOf(std::string_view method);

// Whether `role` may make a call that needs `access`.
bool RoleAllows(Role role, Access access);

}  // namespace kvcache

#endif  // KVCACHE_SERVER_SECURITY_ACCESS_POLICY_H_
