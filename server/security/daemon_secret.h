// DaemonSecret: the daemon's own 256-bit secret, and the keys derived from it.
//
// Some of what kvcached writes or shows must be bound to this daemon so that
// nobody who can read or write it elsewhere can forge or predict it:
//   - checkpoint files carry an HMAC-SHA256 under a key derived from the
//     secret, so a checkpoint planted or edited by anyone without the secret
//     is refused at restore (docs/checkpoints.md);
//   - block chain keys and lookup hashes are keyed with keys derived from the
//     secret per (namespace, model) (server/core/block_hasher.h), so a key
//     reveals nothing about its tokens and nobody can craft colliding prompts.
//
// The secret lives in a file of its own, outside the checkpoint folder
// (security.secret_file; by default "<checkpoint.dir>.secret"), mode 0600,
// created with random bytes the first time. Without checkpoints and without a
// file the secret is random for the life of the process (nothing that
// outlives it depends on the secret then).
//
// Values are immutable after construction: thread-safe to share.
#ifndef KVCACHE_SERVER_SECURITY_DAEMON_SECRET_H_
#define KVCACHE_SERVER_SECURITY_DAEMON_SECRET_H_

#include <array>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace kvcache {

// A 256-bit key for one purpose.
using SecretKey = std::array<uint8_t, 32>;

class DaemonSecret {
 public:
  static constexpr size_t kBytes = 32;

  // A fresh random secret (OpenSSL's CSPRNG).
  static DaemonSecret Random();

  // A secret with exactly these bytes (tests and fuzzers).
  static DaemonSecret FromBytes(const SecretKey& bytes) { return DaemonSecret(bytes); }

  // Reads the secret from `path` (64 hexadecimal digits and an optional
  // newline), or creates the file with a random one (mode 0600, written to a
  // temporary name, synced and renamed) when it does not exist. Refused, with
  // a message naming the path: a file that is not a regular file, that others
  // than its owner may read or write (mode & 0077), or whose text is not 64
  // hex digits (FAILED_PRECONDITION / DATA_LOSS); an unreadable or
  // uncreatable one (the errno's code).
  static absl::StatusOr<DaemonSecret> LoadOrCreate(const std::string& path);

  // Reads a secret that must exist already, with the same checks (a secret
  // that several daemons share, e.g. remote_tier.key_file: one created here
  // would match no other daemon's). `what` names it in messages ("the
  // remote tier's key file"). NOT_FOUND when there is no file.
  static absl::StatusOr<DaemonSecret> Load(const std::string& path, std::string_view what);

  // HMAC-SHA256(secret, purpose): independent keys for different purposes
  // (e.g. "checkpoint-mac", "chain-key").
  SecretKey Derive(std::string_view purpose) const;

  // The first 64 bits of Derive(purpose), for hash seeds.
  uint64_t DeriveSeed(std::string_view purpose) const;

 private:
  explicit DaemonSecret(const SecretKey& bytes) : bytes_(bytes) {}
  SecretKey bytes_;
};

// HMAC-SHA256 of `data` under `key`.
SecretKey HmacSha256(const SecretKey& key, std::span<const uint8_t> data);
SecretKey HmacSha256(const SecretKey& key, std::string_view data);

// Compares two MACs in time independent of where they differ.
bool MacEquals(const SecretKey& a, const SecretKey& b);

// An incremental HMAC-SHA256 (for files written or read in pieces). Not
// thread-safe; one per stream.
class HmacStream {
 public:
  explicit HmacStream(const SecretKey& key);
  ~HmacStream();
  HmacStream(const HmacStream&) = delete;
  HmacStream& operator=(const HmacStream&) = delete;

  void Update(std::span<const uint8_t> data);
  void Update(std::string_view data);
  // The MAC of everything given so far. REQUIRES: called once.
  SecretKey Finish();

 private:
  struct State;
  State* state_;
};

}  // namespace kvcache

#endif  // KVCACHE_SERVER_SECURITY_DAEMON_SECRET_H_
