// The checkpoint container's on-disk layout (docs/checkpoint-format.md):
// file names, the data-file header and the frame header, with their encoders
// and checked decoders. Used by the writer, the reader and the directory;
// nothing here does I/O. All functions are pure and thread-safe.
#ifndef KVCACHE_SERVER_CHECKPOINT_CHECKPOINT_FORMAT_H_
#define KVCACHE_SERVER_CHECKPOINT_CHECKPOINT_FORMAT_H_

#include <array>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "server/checkpoint/checkpoint_mac.h"
#include "xxhash.h"

namespace kvcache::checkpoint {

inline constexpr uint32_t kDataMagic = 0x4b43564b;  // bytes "KVCK"
inline constexpr uint16_t kFormatVersion = 2;       // the newest version written and read
// Versions before this one carry no MAC: refused as DATA_LOSS, never restored.
inline constexpr uint16_t kFirstAuthenticatedVersion = 2;
inline constexpr size_t kDataHeaderBytes = 64;
inline constexpr size_t kFrameHeaderBytes = 24;
inline constexpr uint32_t kMaxRecordBytes = uint32_t{1} << 30;

inline constexpr uint8_t kFlagZstd = 0x01;
inline constexpr uint8_t kFlagEnd = 0x02;

// "ckpt-<20 digits>.data", ".manifest", ".manifest.tmp".
std::string DataFileName(uint64_t sequence);
std::string ManifestFileName(uint64_t sequence);
std::string ManifestTempFileName(uint64_t sequence);

// What a file name in a checkpoint directory is, if it is one of ours.
struct ParsedName {
  enum class Kind : uint8_t { kData, kManifest, kManifestTemp };
  uint64_t sequence = 0;
  Kind kind = Kind::kData;
};
std::optional<ParsedName> ParseFileName(absl::string_view name);

// FAILED_PRECONDITION "checkpoint format version N, this kvcached reads up to M"
// (with `what`, the file, in front).
absl::Status UnsupportedVersionError(absl::string_view what, uint64_t version);
// DATA_LOSS for a version before kFirstAuthenticatedVersion: "format version
// N is not authenticated ...".
absl::Status UnauthenticatedVersionError(absl::string_view what, uint64_t version);

struct DataHeader {
  uint64_t sequence = 0;
  int64_t created_unix_ms = 0;
  CheckpointId id{};  // equals the manifest's checkpoint_id
};
std::array<std::byte, kDataHeaderBytes> EncodeDataHeader(const DataHeader& header);
// Checks magic, version, header size, checksum and that the sequence is
// `expected_sequence`. DATA_LOSS (or FAILED_PRECONDITION for a newer version)
// prefixed with `what`. The header is authenticated by its manifest: the
// caller compares sequence, creation time and id with the manifest's.
absl::StatusOr<DataHeader> DecodeDataHeader(std::span<const std::byte> bytes,
                                            uint64_t expected_sequence, absl::string_view what);

struct FrameHeader {
  uint32_t stored_bytes = 0;
  uint32_t uncompressed_bytes = 0;
  uint8_t type = 0;
  uint8_t flags = 0;
  uint32_t index = 0;
  uint64_t tag = 0;  // FrameMac::Tag (checkpoint_mac.h)
};
std::array<std::byte, kFrameHeaderBytes> EncodeFrameHeader(const FrameHeader& header);
// Decodes and checks the fields alone (flags, reserved, lengths); the tag
// is checked by the caller once it has the stored bytes. DATA_LOSS naming
// `what` and `offset`.
absl::StatusOr<FrameHeader> DecodeFrameHeader(std::span<const std::byte> bytes,
                                              absl::string_view what, uint64_t offset);

// A streaming XXH3-64 state (XXH3_createState / XXH3_freeState), reset.
struct XxhStateFree {
  void operator()(XXH3_state_t* state) const;
};
using XxhStatePtr = std::unique_ptr<XXH3_state_t, XxhStateFree>;
XxhStatePtr NewXxhState();

// Little-endian helpers.
void PutU16(std::byte* p, uint16_t v);
void PutU32(std::byte* p, uint32_t v);
void PutU64(std::byte* p, uint64_t v);
uint16_t GetU16(const std::byte* p);
uint32_t GetU32(const std::byte* p);
uint64_t GetU64(const std::byte* p);

// 16 lowercase hex digits, and back (nullopt unless exactly that).
std::string HexU64(uint64_t v);
std::optional<uint64_t> ParseHexU64(absl::string_view s);

}  // namespace kvcache::checkpoint

#endif  // KVCACHE_SERVER_CHECKPOINT_CHECKPOINT_FORMAT_H_
