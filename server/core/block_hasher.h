// BlockHasher: the keyed hashes that name the blocks of one (namespace, model).
//
// A PrefixIndex gives every block two 64-bit hashes chained over its whole
// prefix: a lookup hash (the index's map key) and a chain key (the block's
// name in the API, the status page, checkpoints and logs). Both are keyed:
// each is XXH3 of the block's tokens under a 192-byte XXH3 secret, chained to
// the parent's value through a bijective mix. Each secret is expanded
// (XXH3_generateSecret) from its own 256-bit per-model key, which the daemon
// derives as HMAC-SHA256(a key derived from its secret for that purpose,
// namespace NUL model) (kvcached's daemon_security.cc, daemon_secret.h), so:
//   - nobody without the daemon's secret can compute the key of a prompt, and
//     a key one tenant learns names nothing another tenant (or model) caches:
//     the same tokens hash differently in every (namespace, model);
//   - nobody can craft prompts whose blocks collide with another's (to keep
//     them out of the cache): the hash is not known to them.
// The two keys are independent: chain keys are shown to callers, and what
// one might learn from many of them says nothing of the lookup hashes.
// XXH3 with a secret is a keyed hash, not a MAC: the index never trusts a
// hash alone to hand out KV (it compares tokens, prefix_index.h), and every
// place that names a block by key resolves it inside one index
// (docs/architecture.md, "Block keys").
//
// Immutable after construction: thread-safe to share (PrefixIndex hands out
// shared_ptrs so callers hash outside the cache's lock).
#ifndef KVCACHE_SERVER_CORE_BLOCK_HASHER_H_
#define KVCACHE_SERVER_CORE_BLOCK_HASHER_H_

#include <array>
#include <cstdint>
#include <memory>
#include <span>

#include "server/core/layout.h"

namespace kvcache {

// A 256-bit key of one (namespace, model)'s hashes.
using BlockHashKey = std::array<uint8_t, 32>;

// The keys of one (namespace, model): one per hash.
struct BlockHashKeys {
  BlockHashKey lookup{};
  BlockHashKey chain{};
};

class BlockHasher {
 public:
  // Size of each XXH3 secret (XXH3_SECRET_SIZE_MIN is 136).
  static constexpr size_t kSecretBytes = 192;

  using Secret = std::array<uint8_t, kSecretBytes>;

  explicit BlockHasher(const BlockHashKeys& keys);

  // The hasher of the all-zero keys: for tests and tools, and for a Cache
  // built without CacheOptions::block_hash_keys. Its hashes are public.
  static std::shared_ptr<const BlockHasher> Unkeyed();

  // Lookup hash of a block given its parent's (0 for a first block).
  uint64_t LookupHash(uint64_t parent_hash, std::span<const Token> block) const;
  // Chain key of a block given its parent's (0 for a first block).
  uint64_t ChainKey(uint64_t parent_key, std::span<const Token> block) const;

 private:
  alignas(64) Secret lookup_secret_;
  alignas(64) Secret chain_secret_;
};

}  // namespace kvcache

#endif  // KVCACHE_SERVER_CORE_BLOCK_HASHER_H_
