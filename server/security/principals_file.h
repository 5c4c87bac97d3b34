// The principals file: every principal the daemon knows and the credential
// each one proves itself with (docs/security.md).
//
//   {"principals": [
//     {"name": "acme-worker", "tenant": "acme", "role": "worker", "token": "..."},
//     {"name": "acme-2", "tenant": "acme", "role": "worker", "token_sha256": "<hex>"},
//     {"name": "ops", "role": "admin", "certificate": "ops.example.com"},
//     {"name": "vllm", "tenant": "acme", "role": "worker", "unix_uid": 1000}]}
//
// Each principal has a unique name, a role, and exactly one credential:
//   token         a bearer token (at least 16 characters), kept only as its SHA-256;
//   token_sha256  the SHA-256 of one, in hex, so the file need hold no secret;
//   certificate   a TLS client certificate identity (a SAN or, without SANs, the CN);
//   unix_uid      the uid of a process on the Unix socket or the shared-memory socket.
// `tenant` (a namespace name) is required for workers and readers; an admin
// without one may use every namespace. Two principals may not share a
// credential. Unknown fields are errors, so a misspelt field cannot quietly
// leave a principal with more access than meant.
#ifndef KVCACHE_SERVER_SECURITY_PRINCIPALS_FILE_H_
#define KVCACHE_SERVER_SECURITY_PRINCIPALS_FILE_H_

#include <sys/types.h>

#include <string>
#include <string_view>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "server/security/principal.h"

namespace kvcache {

// The SHA-256 of `text`, as 32 raw bytes.
std::string Sha256(std::string_view text);

// The principals of one principals file, indexed by credential. Immutable once
// built; AccessControl swaps a whole new table in on reload.
class PrincipalTable {
 public:
  // The principal whose token is `token`, or null. Looks the token up by its
  // SHA-256, so how long the look-up takes does not depend on how much of a
  // wrong token matches a right one.
  const Principal* FindToken(std::string_view token) const;
  const Principal* FindCertificate(std::string_view identity) const;
  const Principal* FindUid(uid_t uid) const;

  size_t size() const { return size_; }

 private:
  friend absl::StatusOr<PrincipalTable> ParsePrincipals(std::string_view json);

  absl::flat_hash_map<std::string, Principal> by_token_digest_;
  absl::flat_hash_map<std::string, Principal> by_certificate_;
  absl::flat_hash_map<uid_t, Principal> by_uid_;
  size_t size_ = 0;
};

// Parses a principals file's text. INVALID_ARGUMENT naming the principal and
// the field for anything malformed.
absl::StatusOr<PrincipalTable> ParsePrincipals(std::string_view json);

// Reads and parses `path`. NOT_FOUND / PERMISSION_DENIED when it cannot be read.
absl::StatusOr<PrincipalTable> LoadPrincipalsFile(const std::string& path);

}  // namespace kvcache

#endif  // KVCACHE_SERVER_SECURITY_PRINCIPALS_FILE_H_
