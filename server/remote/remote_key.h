// RemoteKeyChain: the keys under which blocks live in the shared store.
//
// Every daemon of a cluster must name the same block the same way, and the
// name must reveal nothing: a key is a keyed 128-bit chain hash of the
// prefix through the block, under a key derived from the cluster's shared
// secret for (namespace, model id, layout):
//
//   model key = Derive("remote-key" 0 ns 0 model_id 0 layout)
//   k(0)      = HMAC-SHA256(model key, tokens of block 0)       [first 16 bytes]
//   k(i)      = HMAC-SHA256(model key, k(i-1) | tokens of block i)
//   store key = "kvc:" + 32 hex digits of k(i)
//
// So a key commits to every token before it, differs across namespaces (one
// tenant cannot name another's blocks) and layouts (a model registered with
// another layout does not read blocks of the wrong size), and nobody without
// the secret can compute or invert one. Tokens are hashed as little-endian
// 32-bit words.
//
// Thread-safe (immutable after construction).
#ifndef KVCACHE_SERVER_REMOTE_REMOTE_KEY_H_
#define KVCACHE_SERVER_REMOTE_REMOTE_KEY_H_

#include <span>
#include <string>
#include <vector>

#include "server/core/layout.h"
#include "server/security/daemon_secret.h"

namespace kvcache {

class RemoteKeyChain {
 public:
  static constexpr size_t kKeyBytes = 16;

  RemoteKeyChain(const DaemonSecret& shared, const ModelKey& model, const ModelLayout& layout);

  // The store keys of `tokens`' whole blocks (a partial last block has none),
  // block 0 first.
  std::vector<std::string> KeysOf(std::span<const Token> tokens) const;

 private:
  SecretKey model_key_;
  uint32_t block_tokens_;
};

}  // namespace kvcache

#endif  // KVCACHE_SERVER_REMOTE_REMOTE_KEY_H_
