// ClaimTable: the blocks that appends in flight are storing.
//
// An append claims each block it will store, by (model incarnation, chain
// key), when it begins; a second append of the same tokens that begins while
// the first streams finds the claim and does not stage another copy (its
// commit reports those blocks pending). A claim is let go when its append
// commits, fails or is dropped.
//
// Thread-safe, with locks of its own: appends claim while holding the
// cache's lock shared (so beside each other), and let go with or without it.
// A begin that finds a block absent from the index and claims it does both
// under one hold of the cache's lock and its model's index_lock, at least
// shared; the index only gains a block under the index_lock held
// exclusively (or the cache's lock), so the block cannot appear between the
// two. The table is sharded by model incarnation (kShards, a lock each), so
// appends of different models rarely share a lock.
#ifndef KVCACHE_SERVER_CORE_CLAIM_TABLE_H_
#define KVCACHE_SERVER_CORE_CLAIM_TABLE_H_

#include <array>
#include <cstddef>
#include <cstdint>
#include <span>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "server/common/mutex.h"

namespace kvcache {

class ClaimTable {
 public:
  // For each keys[j] with wanted[j] set: claims it for `owner` unless another
  // owner holds it. Returns, for every j, whether `owner` holds keys[j] now
  // (false where it was not wanted, or another append stores it). One hold
  // of the table's lock: two appends claiming the same keys each get a key
  // whole or not at all (the keys of one incarnation are in one shard).
  // REQUIRES: keys.size() == wanted.size().
  std::vector<bool> Claim(uint64_t incarnation, std::span<const uint64_t> keys,
                          const std::vector<bool>& wanted, const void* owner);

  // Lets go of the keys[j] with held[j] set that `owner` holds; another
  // owner's claim of the same key is left alone.
  void Release(uint64_t incarnation, std::span<const uint64_t> keys, const std::vector<bool>& held,
               const void* owner);

  // Claims held now, by every owner.
  size_t size() const;

  static constexpr size_t kShards = 16;

 private:
  struct alignas(64) Shard {
    mutable Mutex mu;
    absl::flat_hash_map<std::pair<uint64_t, uint64_t>, const void*> claims ABSL_GUARDED_BY(mu);
  };
  Shard& ShardOf(uint64_t incarnation) { return shards_[incarnation % kShards]; }

  std::array<Shard, kShards> shards_;
};

}  // namespace kvcache

#endif  // KVCACHE_SERVER_CORE_CLAIM_TABLE_H_
