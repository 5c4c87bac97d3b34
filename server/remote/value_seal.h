// ValueSealer: the values kvcached writes to a shared store (Redis Cluster),
// sealed so that whoever can read or change the store learns nothing of the
// KV and cannot make a daemon serve KV it did not write.
//
// AES-256-GCM under a key of its own for every value: HMAC-SHA256 of the
// namespace's key (derived from the cluster's shared secret,
// remote_tier.key_file) and 16 random bytes stored with the value. A key is
// never used twice, so the nonce can be fixed and no count of values ever
// wears a key out (a random 96-bit nonce under one key would be safe only
// for about 2^32 values). The authenticated data binds the namespace and the
// store key: a value copied under another key, or read for another
// namespace, does not open.
//
//   sealed value = version (1 byte, 1) | salt (16) | ciphertext | tag (16)
//
// Thread-safe (immutable after construction).
#ifndef KVCACHE_SERVER_REMOTE_VALUE_SEAL_H_
#define KVCACHE_SERVER_REMOTE_VALUE_SEAL_H_

#include <cstddef>
#include <span>
#include <string>
#include <string_view>

#include "absl/status/status.h"
#include "server/security/daemon_secret.h"

namespace kvcache {

class ValueSealer {
 public:
  static constexpr uint8_t kVersion = 1;
  static constexpr size_t kSaltBytes = 16;
  static constexpr size_t kTagBytes = 16;
  static constexpr size_t kOverheadBytes = 1 + kSaltBytes + kTagBytes;

  // `shared`: the secret every daemon of the cluster holds.
  explicit ValueSealer(const DaemonSecret& shared) : shared_(shared) {}

  // Appends the sealed form of `plaintext`, stored as `store_key` for
  // namespace `ns`, to `*out`.
  void Seal(std::string_view ns, std::string_view store_key, std::span<const std::byte> plaintext,
            std::string* out) const;
  // The same for the plaintext made of `pieces` one after the other (no
  // copy to join them).
  void Seal(std::string_view ns, std::string_view store_key,
            std::span<const std::span<const std::byte>> pieces, std::string* out) const;

  // The plaintext's size in a sealed value of `sealed_bytes` (0 when it is
  // too short to be one).
  static size_t OpenedBytes(size_t sealed_bytes) {
    return sealed_bytes < kOverheadBytes ? 0 : sealed_bytes - kOverheadBytes;
  }

  // Writes the plaintext of `sealed` into `out` (exactly OpenedBytes()
  // long). DATA_LOSS when `sealed` is not a value Seal made for (ns,
  // store_key) under this secret: changed, cut, swapped, of another
  // version; `out` then holds nothing to use. INVALID_ARGUMENT for an `out`
  // of the wrong size.
  absl::Status Open(std::string_view ns, std::string_view store_key, std::string_view sealed,
                    std::span<std::byte> out) const;
  // The same into `pieces` one after the other (sizes adding up to
  // OpenedBytes()).
  absl::Status Open(std::string_view ns, std::string_view store_key, std::string_view sealed,
                    std::span<const std::span<std::byte>> pieces) const;

  // The first out.size() bytes of the plaintext of `sealed`, NOT
  // authenticated: what they would be if `sealed` is genuine, for a caller
  // that needs a value's header before it opens the value (an Open of the
  // whole value confirms it, or refuses it). DATA_LOSS when `sealed` is too
  // short or of another version.
  absl::Status Peek(std::string_view ns, std::string_view store_key, std::string_view sealed,
                    std::span<std::byte> out) const;

 private:
  SecretKey ValueKey(std::string_view ns, std::span<const uint8_t> salt) const;

  const DaemonSecret shared_;
};

}  // namespace kvcache

#endif  // KVCACHE_SERVER_REMOTE_VALUE_SEAL_H_
