// Authentication of checkpoint files (docs/checkpoint-format.md,
// "Authentication"): the MACs that make a checkpoint restorable only by a
// daemon holding the secret it was written under.
//
// Every key here derives from one 256-bit checkpoint key, which the daemon
// derives from its own secret (DaemonSecret::Derive("checkpoint-mac"),
// server/security/daemon_secret.h):
//   manifest key = HMAC-SHA256(checkpoint key, "kvcached checkpoint manifest")
//   frame key    = HMAC-SHA256(checkpoint key, "kvcached checkpoint frame")
// A manifest carries the full HMAC-SHA256 of its text under the manifest key;
// each frame carries the first 64 bits of the HMAC-SHA256, under the frame key,
// of (checkpoint id, sequence, the frame's offset, its header fields, its
// stored bytes), so a frame is bound to its place in its checkpoint's data
// file and cannot be moved, reordered or spliced in from another checkpoint.
//
// FrameMac is immutable after construction: Tag() may be called from several
// threads at once. The free functions are pure.
#ifndef KVCACHE_SERVER_CHECKPOINT_CHECKPOINT_MAC_H_
#define KVCACHE_SERVER_CHECKPOINT_CHECKPOINT_MAC_H_

#include <array>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>

#include "absl/strings/string_view.h"
#include "server/security/daemon_secret.h"

namespace kvcache::checkpoint {

// The key every checkpoint MAC derives from. All-zero in tests only.
using CheckpointKey = SecretKey;

// A checkpoint's random 128-bit identity: in its data header and manifest.
using CheckpointId = std::array<uint8_t, 16>;
inline constexpr size_t kCheckpointIdBytes = 16;

// 16 random bytes (OpenSSL's CSPRNG).
CheckpointId NewCheckpointId();

// 32 lowercase hex digits, and back (nullopt unless exactly that).
std::string HexId(const CheckpointId& id);
bool ParseHexId(absl::string_view hex, CheckpointId* id);

// HMAC-SHA256 of a manifest's text (everything before its MAC field) under
// the manifest key derived from `key`; 64 lowercase hex digits.
std::string ManifestMacHex(const CheckpointKey& key, absl::string_view body);
// Whether `hex` is exactly ManifestMacHex(key, body), compared in constant time.
bool ManifestMacMatches(const CheckpointKey& key, absl::string_view body, absl::string_view hex);

struct FrameHeader;

// The frame tags of one checkpoint's data file.
class FrameMac {
 public:
  FrameMac(const CheckpointKey& key, const CheckpointId& id, uint64_t sequence);
  ~FrameMac();
  FrameMac(const FrameMac&) = delete;
  FrameMac& operator=(const FrameMac&) = delete;

  // The 64-bit tag of the frame at `offset` with these header fields (bytes
  // 0..15 of the frame header, as EncodeFrameHeader writes them) and stored
  // bytes: the first 8 bytes of the HMAC, read little-endian.
  uint64_t Tag(const FrameHeader& header, uint64_t offset, std::span<const std::byte> stored) const;

 private:
  struct State;
  std::unique_ptr<State> state_;
  std::array<std::byte, 24> prefix_;  // id, sequence
};

}  // namespace kvcache::checkpoint

#endif  // KVCACHE_SERVER_CHECKPOINT_CHECKPOINT_MAC_H_
