#include "server/security/access_control.h"

#include <algorithm>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "server/common/status_macros.h"
#include "server/security/access_policy.h"

namespace kvcache {

TenantStreamSlot::TenantStreamSlot(TenantStreamSlot&& other) noexcept
    : owner_(std::exchange(other.owner_, nullptr)),
      budget_(other.budget_),
      tenant_(std::move(other.tenant_)) {}

TenantStreamSlot& TenantStreamSlot::operator=(TenantStreamSlot&& other) noexcept {
  if (this != &other) {
    if (owner_ != nullptr) owner_->Close(budget_, tenant_);
    owner_ = std::exchange(other.owner_, nullptr);
    budget_ = other.budget_;
    tenant_ = std::move(other.tenant_);
  }
  return *this;
}

TenantStreamSlot::~TenantStreamSlot() {
  if (owner_ != nullptr) owner_->Close(budget_, tenant_);
}

AccessControl::AccessControl(AccessControlOptions options)
    : options_(std::move(options)),
      shared_(std::make_shared<const std::vector<std::string>>(options_.shared_namespaces)) {}

absl::StatusOr<std::unique_ptr<AccessControl>> AccessControl::Create(AccessControlOptions options) {
  std::unique_ptr<AccessControl> access(new AccessControl(std::move(options)));
  if (access->enabled()) {
    KVCACHE_RETURN_IF_ERROR(access->Reload());
  }
  return access;
}

size_t AccessControl::principals() const {
  MutexLock lock(&table_mu_);
  return table_ == nullptr ? 0 : table_->size();
}

size_t AccessControl::tenants() const {
  MutexLock lock(&table_mu_);
  return table_ == nullptr ? 0 : table_->tenants().size();
}

absl::Status AccessControl::Reload() {
  if (!enabled()) return absl::OkStatus();
  absl::StatusOr<PrincipalTable> table = LoadPrincipalsFile(options_.principals_file);
  if (!table.ok()) return table.status();
  auto fresh = std::make_shared<const PrincipalTable>(*std::move(table));
  MutexLock lock(&table_mu_);
  table_ = std::move(fresh);
  generation_.fetch_add(1, std::memory_order_release);
  return absl::OkStatus();
}

Credentials CredentialsOfAuthorization(const std::vector<std::string>& values) {
  Credentials credentials;
  if (values.empty()) return credentials;
  constexpr absl::string_view kBearer = "Bearer ";
  const absl::string_view value(values.front().data(), values.front().size());
  if (values.size() == 1 && value.size() > kBearer.size() &&
      absl::StartsWithIgnoreCase(value, kBearer)) {
    credentials.bearer_token = std::string(value.substr(kBearer.size()));
  } else {
    credentials.malformed_authorization = true;  // two tokens: neither decides
  }
  return credentials;
}

absl::StatusOr<Principal> AccessControl::Authenticate(const Credentials& credentials) const {
  std::shared_ptr<const PrincipalTable> table;
  {
    MutexLock lock(&table_mu_);
    table = table_;
  }
  if (credentials.malformed_authorization) {
    return absl::UnauthenticatedError(
        "send one authorization header, \"Bearer <token>\" (docs/security.md)");
  }
  if (credentials.bearer_token.has_value()) {
    if (const Principal* p = table->FindToken(*credentials.bearer_token); p != nullptr) return *p;
    return absl::UnauthenticatedError("the bearer token is not known to this daemon");
  }
  for (const std::string& identity : credentials.certificate_identities) {
    if (const Principal* p = table->FindCertificate(identity); p != nullptr) return *p;
  }
  if (credentials.unix_uid.has_value()) {
    if (const Principal* p = table->FindUid(*credentials.unix_uid); p != nullptr) return *p;
  }
  if (!credentials.certificate_identities.empty()) {
    return absl::UnauthenticatedError(absl::StrCat("the client certificate (",
                                                   credentials.certificate_identities.front(),
                                                   ") names no principal of this daemon"));
  }
  if (credentials.unix_uid.has_value()) {
    return absl::UnauthenticatedError(
        absl::StrCat("uid ", *credentials.unix_uid, " names no principal of this daemon"));
  }
  return absl::UnauthenticatedError(
      "authentication required: send \"authorization: Bearer <token>\" (kvcachectl --token-file, "
      "KVCACHE_TOKEN) or a client certificate");
}

absl::StatusOr<Caller> AccessControl::Admit(const Credentials& credentials,
                                            std::string_view method) {
  if (!enabled()) return Caller::Anonymous();
  absl::StatusOr<Principal> principal = Authenticate(credentials);
  if (!principal.ok()) return principal.status();
  return Authorize(*std::move(principal), method);
}

absl::StatusOr<Caller> AccessControl::AdmitSession(const Credentials& credentials,
                                                   std::string_view method,
                                                   SessionPrincipal* session) {
  if (!enabled()) return Caller::Anonymous();
  // Read before authenticating: a reload in between is seen at the next call.
  const uint64_t generation = generation_.load(std::memory_order_acquire);
  if (!session->principal.has_value() || session->generation != generation) {
    absl::StatusOr<Principal> principal = Authenticate(credentials);
    if (!principal.ok()) {
      session->principal.reset();
      return principal.status();
    }
    session->principal = *std::move(principal);
    session->generation = generation;
  }
  return Authorize(*session->principal, method);
}

absl::StatusOr<Caller> AccessControl::Authorize(Principal principal, std::string_view method) {
  const std::optional<Access> access = AccessOf(method);
  if (!RoleAllows(principal.role, access.value_or(Access::kDaemon))) {
    return absl::PermissionDeniedError(absl::StrCat(principal.name, " (role ",
                                                    std::string(RoleName(principal.role)),
                                                    ") may not call ", std::string(method)));
  }
  if (access.value_or(Access::kDaemon) == Access::kDaemon && principal.tenant != kAllNamespaces) {
    return absl::PermissionDeniedError(absl::StrCat(
        principal.name, " (admin of tenant \"", principal.tenant, "\") may not call ",
        std::string(method), ": it acts on the whole daemon, for admins of every namespace"));
  }
  if (access == Access::kData && principal.role != Role::kAdmin) {
    KVCACHE_RETURN_IF_ERROR(ChargeRequest(principal.tenant));
  }
  return Caller(std::move(principal), shared_);
}

absl::Status AccessControl::ChargeRequest(const std::string& tenant) {
  const uint32_t rate = options_.max_requests_per_second;
  if (rate == 0) return absl::OkStatus();
  const absl::Time now = options_.clock->Now();
  MutexLock lock(&limits_mu_);
  auto [it, fresh] = buckets_.try_emplace(tenant, Bucket{.tokens = double(rate), .refilled = now});
  Bucket& b = it->second;
  if (!fresh) {
    b.tokens = std::min<double>(rate, b.tokens + absl::ToDoubleSeconds(now - b.refilled) * rate);
    b.refilled = now;
  }
  if (b.tokens < 1) {
    return absl::ResourceExhaustedError(
        absl::StrCat("tenant \"", tenant, "\" is past its ", rate,
                     " requests per second (security.tenant_limits.max_requests_per_second)"));
  }
  b.tokens -= 1;
  return absl::OkStatus();
}

namespace {

// Names a budget in a refusal: what is counted, and the settings that bound it.
std::string BudgetLimit(TenantBudget budget, uint32_t limit, const AccessControlOptions& options) {
  switch (budget) {
    case TenantBudget::kStreams:
      return absl::StrCat("streams open, its limit ", limit,
                          " (security.tenant_limits.max_concurrent_streams)");
    case TenantBudget::kUnaryCalls:
      return absl::StrCat("unary calls in flight, its share ", limit,
                          " (limits.max_concurrent_unary ", options.daemon_max_concurrent_unary,
                          " x security.tenant_limits.max_share ", options.max_share, ")");
    case TenantBudget::kShmConnections:
      return absl::StrCat("shared-memory connections, its share ", limit, " (shm.max_connections ",
                          options.daemon_max_shm_connections,
                          " x security.tenant_limits.max_share ", options.max_share, ")");
  }
  return "";
}

// A tenant's share of `budget` (0: no share, the budget alone applies).
uint32_t ShareOf(uint32_t budget, double share) {
  if (budget == 0 || share >= 1.0) return 0;
  return std::clamp<uint32_t>(static_cast<uint32_t>(budget * share), 1, budget);
}

}  // namespace

absl::StatusOr<TenantStreamSlot> AccessControl::OpenStream(const Caller& caller) {
  return Open(caller, TenantBudget::kStreams, options_.max_concurrent_streams);
}

absl::StatusOr<TenantStreamSlot> AccessControl::OpenUnaryCall(const Caller& caller) {
  return Open(caller, TenantBudget::kUnaryCalls,
              ShareOf(options_.daemon_max_concurrent_unary, options_.max_share));
}

absl::StatusOr<TenantStreamSlot> AccessControl::OpenShmConnection(const Caller& caller) {
  return Open(caller, TenantBudget::kShmConnections,
              ShareOf(options_.daemon_max_shm_connections, options_.max_share));
}

absl::StatusOr<TenantStreamSlot> AccessControl::Open(const Caller& caller, TenantBudget budget,
                                                     uint32_t limit) {
  if (limit == 0 || caller.principal().role == Role::kAdmin) return TenantStreamSlot();
  const std::string& tenant = caller.principal().tenant;
  MutexLock lock(&limits_mu_);
  uint32_t& open = open_[static_cast<size_t>(budget)][tenant];
  if (open >= limit) {
    return absl::ResourceExhaustedError(absl::StrCat("tenant \"", tenant, "\" has ", open, " ",
                                                     BudgetLimit(budget, limit, options_)));
  }
  ++open;
  return TenantStreamSlot(this, budget, tenant);
}

void AccessControl::Close(TenantBudget budget, const std::string& tenant) {
  MutexLock lock(&limits_mu_);
  auto& open = open_[static_cast<size_t>(budget)];
  auto it = open.find(tenant);
  if (it != open.end() && --it->second == 0) open.erase(it);
}

}  // namespace kvcache
