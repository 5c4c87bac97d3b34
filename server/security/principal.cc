#include "server/security/principal.h"

namespace kvcache {

std::string_view RoleName(Role role) {
  switch (role) {
    case Role::kReader:
      return "reader";
    case Role::kWorker:
      return "worker";
    case Role::kAdmin:
      return "admin";
  }
  return "reader";
}

std::optional<Role> ParseRole(std::string_view name) {
  if (name == "reader") return Role::kReader;
  if (name == "worker") return Role::kWorker;
  if (name == "admin") return Role::kAdmin;
  return std::nullopt;
}

std::string_view AuthMethodName(AuthMethod method) {
  switch (method) {
    case AuthMethod::kNone:
      return "none";
    case AuthMethod::kToken:
      return "token";
    case AuthMethod::kCertificate:
      return "certificate";
    case AuthMethod::kUnixUid:
      return "unix_uid";
  }
  return "none";
}

}  // namespace kvcache
