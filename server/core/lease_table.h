// LeaseTable: the leases a Cache has handed out, by id and by expiry.
//
// A lease keeps the blocks of a matched prefix (TieredBlock references, which
// pin every copy they hold) and the matched tokens (for attention reports)
// until it is released or expires. The table enforces the two limits on live
// leases (how many, and how many tokens they copy), daemon-wide and per
// namespace (each namespace may hold at most `namespace_share` of either:
// namespace_share.h), and counts the memory they hold for the cache's
// metadata budget. Ids are random, never 0, and never
// reused while the lease lives.
//
// Not thread-safe: the owning Cache serialises access under its lock.
// Removing a lease hands it back to the caller, whose references then drop
// wherever the caller lets them (after the lock, where that matters).
#ifndef KVCACHE_SERVER_CORE_LEASE_TABLE_H_
#define KVCACHE_SERVER_CORE_LEASE_TABLE_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/container/btree_map.h"
#include "absl/container/flat_hash_map.h"
#include "absl/functional/function_ref.h"
#include "absl/random/random.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "server/core/layout.h"
#include "server/core/prefix_index.h"
#include "server/core/tiered_block.h"

namespace kvcache {

struct Lease {
  ModelKey model;
  const PrefixIndex* index = nullptr;  // the model's index when leased
  uint64_t matched_tokens = 0;
  std::vector<Token> tokens;  // the matched tokens, for attention reports
  std::vector<TieredBlock> blocks;
  absl::Time expires;
  absl::Time created = absl::InfinitePast();  // when it was taken (for the operator's view)
  uint64_t metadata_bytes = 0;                // set by the table: counted in metadata_bytes()
};

class LeaseTable {
 public:
  // REQUIRES: 0 < namespace_share <= 1.
  LeaseTable(uint32_t max_leases, uint64_t max_tokens, double namespace_share = 1.0)
      : max_leases_(max_leases), max_tokens_(max_tokens), namespace_share_(namespace_share) {}

  // Adds `lease` (its tokens, blocks and expiry set) and returns its id.
  // RESOURCE_EXHAUSTED, and nothing added, when it would pass max_leases or
  // max_tokens, or its namespace's share of either.
  absl::StatusOr<uint64_t> Add(Lease lease);
  // The live lease `id`, or null.
  Lease* Find(uint64_t id);
  // Moves lease `id` to `out` and removes it; false when there is none.
  bool Remove(uint64_t id, Lease* out);
  // Moves every lease of `model` to `out` and removes them; returns how many.
  size_t RemoveModel(const ModelKey& model, std::vector<Lease>* out);
  // Removes the leases that expired by `now` (their references drop here);
  // costs only what expires.
  void Expire(absl::Time now);
  void ForEach(absl::FunctionRef<void(Lease&)> visit);
  // Every live lease with its id, in no particular order.
  void ForEachWithId(absl::FunctionRef<void(uint64_t id, const Lease&)> visit) const;
  void Clear();

  size_t size() const { return leases_.size(); }
  uint64_t tokens() const { return tokens_; }  // tokens the live leases copied
  uint64_t metadata_bytes() const { return metadata_bytes_; }
  // Live leases of namespace `ns`, and the tokens they copied.
  size_t leases_of(const std::string& ns) const;
  uint64_t tokens_of(const std::string& ns) const;
  uint64_t metadata_bytes_of(const std::string& ns) const;

  // What a lease holds besides its block references, for the metadata budget.
  static uint64_t MetadataBytes(uint64_t tokens, uint64_t blocks) {
    return 128 + tokens * sizeof(Token) + blocks * sizeof(TieredBlock);
  }

 private:
  using Map = absl::flat_hash_map<uint64_t, Lease>;
  struct NamespaceUse {
    size_t leases = 0;
    uint64_t tokens = 0;
    uint64_t metadata_bytes = 0;
  };
  // Takes the lease at `it` out of both maps and the totals, into `out`.
  void Erase(Map::iterator it, Lease* out);
  // Takes `lease` out of the totals (daemon-wide and its namespace's).
  void Uncount(const Lease& lease);

  const uint32_t max_leases_;
  const uint64_t max_tokens_;
  const double namespace_share_;
  Map leases_;
  absl::flat_hash_map<std::string, NamespaceUse> by_namespace_;
  absl::btree_multimap<absl::Time, uint64_t> by_expiry_;
  absl::BitGen ids_;
  uint64_t tokens_ = 0;
  uint64_t metadata_bytes_ = 0;
};

}  // namespace kvcache

#endif  // KVCACHE_SERVER_CORE_LEASE_TABLE_H_
