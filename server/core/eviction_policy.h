// EvictionPolicy: decides which cached block leaves first when the host tier
// is full.
//
// The Cache tells the policy about every block in every index: Insert() when
// it is added, Touch() when a lookup, fetch or append uses it, Erase() when it
// leaves for any reason. When memory is needed the Cache asks PickVictim()
// for the best block to drop among those `evictable` accepts (the Cache's rule:
// a leaf, referenced by nothing but the index, so neither leased nor being
// fetched), then erases it itself. The Cache touches a path leaf-first, so a
// parent is always at least as recent as its children.
//
// Implementations are not thread-safe; the Cache serialises calls. The
// importance-aware policy will implement this same interface; every policy
// passes eviction_policy_test.cc's behaviour suite.
#ifndef KVCACHE_SERVER_CORE_EVICTION_POLICY_H_
#define KVCACHE_SERVER_CORE_EVICTION_POLICY_H_

#include <memory>
#include <string_view>

#include "absl/functional/function_ref.h"
#include "server/core/prefix_index.h"

namespace kvcache {

class EvictionPolicy {
 public:
  virtual ~EvictionPolicy() = default;

  // REQUIRES: `node` is not tracked yet.
  virtual void Insert(IndexNode* node) = 0;
  // REQUIRES: `node` is tracked.
  virtual void Touch(IndexNode* node) = 0;
  // REQUIRES: `node` is tracked; it is not tracked afterwards.
  virtual void Erase(IndexNode* node) = 0;
  // The block to evict first among those for which `evictable` is true, or
  // nullptr when there is none. Does not erase it.
  virtual IndexNode* PickVictim(absl::FunctionRef<bool(const IndexNode&)> evictable) = 0;

  virtual size_t size() const = 0;
  virtual std::string_view name() const = 0;
};

// Least recently used first.
std::unique_ptr<EvictionPolicy> NewLruPolicy();

}  // namespace kvcache

#endif  // KVCACHE_SERVER_CORE_EVICTION_POLICY_H_
