// AccessControl: the one place that decides who a caller is and whether it
// may make a call (docs/security.md).
//
// Every front door (the gRPC services, the shared-memory data plane) turns
// what it knows about a call into Credentials and asks Admit() before it
// does anything else; the Caller it gets back scopes every namespace the
// call touches. With no principals file authentication is off and every
// caller is an anonymous admin of every namespace.
//
// Statuses: UNAUTHENTICATED when no credential maps to a principal (none
// given, an unknown token, an unmapped certificate or uid); PERMISSION_DENIED
// when the principal's role may not make the call; RESOURCE_EXHAUSTED past a
// tenant's requests per second, concurrent streams, or its share
// (max_share) of the daemon's concurrent unary calls or shared-memory
// connections. Admins are not limited.
//
// Thread-safe. Reload() swaps the principals in whole; calls admitted before
// keep the principal they were admitted as.
#ifndef KVCACHE_SERVER_SECURITY_ACCESS_CONTROL_H_
#define KVCACHE_SERVER_SECURITY_ACCESS_CONTROL_H_

#include <sys/types.h>

#include <array>
#include <atomic>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "server/common/clock.h"
#include "server/common/mutex.h"
#include "server/security/caller.h"
#include "server/security/principals_file.h"

namespace kvcache {

struct AccessControlOptions {
  std::string principals_file;  // empty: authentication off
  std::vector<std::string> shared_namespaces;
  uint32_t max_requests_per_second = 0;  // per tenant, data calls; 0: no limit
  uint32_t max_concurrent_streams = 0;   // per tenant, Append/Fetch; 0: no limit
  // A tenant may hold at most this fraction (security.tenant_limits.max_share)
  // of the daemon's limits.max_concurrent_unary unary calls and
  // shm.max_connections connections (at least one of each); 1: no share.
  double max_share = 1.0;
  uint32_t daemon_max_concurrent_unary = 0;  // 0: no per-tenant share
  uint32_t daemon_max_shm_connections = 0;   // 0: no per-tenant share
  Clock* clock = SystemClock::Get();
};

// What a front door knows about who is calling.
struct Credentials {
  // The token of an "authorization: Bearer <token>" header, when one came.
  std::optional<std::string> bearer_token;
  // An authorization header that is not "Bearer <token>".
  bool malformed_authorization = false;
  // The verified identities (SANs, else the CN) of a TLS client certificate.
  std::vector<std::string> certificate_identities;
  // The peer's uid on a Unix socket, when the front door could read it.
  std::optional<uid_t> unix_uid;
};

// The Credentials of a request whose Authorization headers (HTTP: the
// status page) are `values`: one "Bearer <token>" gives its token; any other
// value, or more than one header, is malformed; none gives no credentials.
Credentials CredentialsOfAuthorization(const std::vector<std::string>& values);

class AccessControl;

// What AdmitSession remembers of a caller whose credentials stay the same from
// call to call (a shared-memory session): its principal, until a reload.
struct SessionPrincipal {
  uint64_t generation = 0;
  std::optional<Principal> principal;
};

// What a TenantStreamSlot holds a place in.
enum class TenantBudget : uint8_t { kStreams = 0, kUnaryCalls = 1, kShmConnections = 2 };

// A tenant's slot for one open stream (or unary call, or shared-memory
// connection: its TenantBudget); gives it back when destroyed.
class TenantStreamSlot {
 public:
  TenantStreamSlot() = default;
  TenantStreamSlot(TenantStreamSlot&& other) noexcept;
  TenantStreamSlot& operator=(TenantStreamSlot&& other) noexcept;
  ~TenantStreamSlot();

 private:
  friend class AccessControl;
  TenantStreamSlot(AccessControl* owner, TenantBudget budget, std::string tenant)
      : owner_(owner), budget_(budget), tenant_(std::move(tenant)) {}
  AccessControl* owner_ = nullptr;
  TenantBudget budget_ = TenantBudget::kStreams;
  std::string tenant_;
};

class AccessControl {
 public:
  // Loads the principals file, if any. The file's errors come back as they are.
  static absl::StatusOr<std::unique_ptr<AccessControl>> Create(AccessControlOptions options);

  bool enabled() const { return !options_.principals_file.empty(); }
  size_t principals() const;
  // Distinct tenants among the principals (admins of every namespace aside).
  size_t tenants() const;

  // Who is calling `method` (its logged name, access_policy.h) and whether it
  // may. Credentials are tried in this order: bearer token, certificate,
  // unix uid; a token that is given must be right (a wrong token is not
  // excused by a good certificate).
  absl::StatusOr<Caller> Admit(const Credentials& credentials, std::string_view method);
  // As Admit, for a session whose credentials never change: the principal is
  // looked up (a SHA-256 of the token) once per session and principals file,
  // not per call. Roles, tenants and limits are checked on every call.
  absl::StatusOr<Caller> AdmitSession(const Credentials& credentials, std::string_view method,
                                      SessionPrincipal* session);

  // A slot for one Append or Fetch stream (or shared-memory fetch_into or
  // append_from) of `caller`'s tenant.
  absl::StatusOr<TenantStreamSlot> OpenStream(const Caller& caller);
  // A slot for one unary call of `caller`'s tenant, within its share of
  // limits.max_concurrent_unary.
  absl::StatusOr<TenantStreamSlot> OpenUnaryCall(const Caller& caller);
  // A slot for one shared-memory connection of `caller`'s tenant, within its
  // share of shm.max_connections.
  absl::StatusOr<TenantStreamSlot> OpenShmConnection(const Caller& caller);

  // Re-reads the principals file; on error the principals in force stay.
  absl::Status Reload();

 private:
  friend class TenantStreamSlot;
  struct Bucket {
    double tokens = 0;
    absl::Time refilled;
  };

  explicit AccessControl(AccessControlOptions options);
  absl::StatusOr<Principal> Authenticate(const Credentials& credentials) const;
  // Whether `principal` may call `method`, and its tenant's rate.
  absl::StatusOr<Caller> Authorize(Principal principal, std::string_view method);
  absl::Status ChargeRequest(const std::string& tenant);
  // A slot of `budget` for `caller`'s tenant, at most `limit` (0: none) at once.
  absl::StatusOr<TenantStreamSlot> Open(const Caller& caller, TenantBudget budget, uint32_t limit);
  void Close(TenantBudget budget, const std::string& tenant);

  const AccessControlOptions options_;
  const std::shared_ptr<const std::vector<std::string>> shared_;
  mutable Mutex table_mu_;
  std::shared_ptr<const PrincipalTable> table_ ABSL_GUARDED_BY(table_mu_);
  std::atomic<uint64_t> generation_{1};  // bumped by each successful reload
  Mutex limits_mu_;
  absl::flat_hash_map<std::string, Bucket> buckets_ ABSL_GUARDED_BY(limits_mu_);
  // Slots open per budget (TenantBudget's value) and tenant.
  std::array<absl::flat_hash_map<std::string, uint32_t>, 3> open_ ABSL_GUARDED_BY(limits_mu_);
};

}  // namespace kvcache

#endif  // KVCACHE_SERVER_SECURITY_ACCESS_CONTROL_H_
