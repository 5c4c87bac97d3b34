#include "server/core/block_hasher.h"

// XXH3_generateSecret and XXH3_SECRET_SIZE_MIN are in xxhash's static-linking
// section (stable since 0.8.1).
#define XXH_STATIC_LINKING_ONLY
#include <xxhash.h>

#if defined(KVCACHE_XXH3_DISPATCH)
#include <xxh_x86dispatch.h>
#endif

#include "server/common/splitmix64.h"

namespace kvcache {
namespace {

// XXH3 of a block's tokens under `secret`, with the widest vector unit the
// CPU has where libxxhash offers the run-time dispatch.
uint64_t HashBlock(std::span<const Token> block, const BlockHasher::Secret& secret) {
#if defined(KVCACHE_XXH3_DISPATCH)
  return XXH3_64bits_withSecret_dispatch(block.data(), block.size_bytes(), secret.data(),
                                         secret.size());
#else
  return XXH3_64bits_withSecret(block.data(), block.size_bytes(), secret.data(), secret.size());
#endif
}

// An XXH3 secret of good quality from a 256-bit key.
void Expand(const BlockHashKey& key, BlockHasher::Secret* secret) {
  XXH3_generateSecret(secret->data(), secret->size(), key.data(), key.size());
}

}  // namespace

static_assert(BlockHasher::kSecretBytes >= XXH3_SECRET_SIZE_MIN);

BlockHasher::BlockHasher(const BlockHashKeys& keys) {
  Expand(keys.lookup, &lookup_secret_);
  Expand(keys.chain, &chain_secret_);
}

std::shared_ptr<const BlockHasher> BlockHasher::Unkeyed() {
  static const std::shared_ptr<const BlockHasher> unkeyed =
      std::make_shared<const BlockHasher>(BlockHashKeys{});
  return unkeyed;
}

uint64_t BlockHasher::LookupHash(uint64_t parent_hash, std::span<const Token> block) const {
  // Mix is a bijection: distinct (parent, block hash) pairs collide only
  // when their XORs do.
  return SplitMix64Finalize(parent_hash ^ HashBlock(block, lookup_secret_));
}

uint64_t BlockHasher::ChainKey(uint64_t parent_key, std::span<const Token> block) const {
  // Offset from LookupHash's chaining, so that even under equal secrets the
  // two would differ.
  return SplitMix64Finalize(parent_key ^ HashBlock(block, chain_secret_) ^ kSplitMix64Gamma);
}

}  // namespace kvcache
