// Caller: the principal making one call, and the namespaces it may use.
//
// Built once per call by AccessControl::Admit; every handler takes the
// namespace it acts on from NamespaceOf(), never straight from a request
// field, so a worker can only ever touch its tenant's namespace and the
// shared ones.
#ifndef KVCACHE_SERVER_SECURITY_CALLER_H_
#define KVCACHE_SERVER_SECURITY_CALLER_H_

#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "server/security/principal.h"

namespace kvcache {

class Caller {
 public:
  // With authentication off: an admin of every namespace.
  static Caller Anonymous();

  Caller(Principal principal, std::shared_ptr<const std::vector<std::string>> shared_namespaces);

  const Principal& principal() const { return principal_; }
  bool every_namespace() const { return principal_.tenant == kAllNamespaces; }
  const std::vector<std::string>& shared_namespaces() const { return *shared_; }

  // The namespace a request that names `requested` acts on. An empty
  // `requested` means the tenant's own namespace (for a caller of every
  // namespace: empty, which the model key reads as "default"). A caller of
  // every namespace gets `requested` back; any other caller gets its tenant
  // or a shared namespace back, and PERMISSION_DENIED for anything else.
  absl::StatusOr<std::string> NamespaceOf(std::string_view requested) const;

  // Whether listings (ListModels, GetStats) may show this caller `ns`.
  bool MaySee(std::string_view ns) const;

 private:
  Principal principal_;
  std::shared_ptr<const std::vector<std::string>> shared_;
};

}  // namespace kvcache

#endif  // KVCACHE_SERVER_SECURITY_CALLER_H_
