// XXH3_state_t on the stack (its layout is that of the packaged libxxhash).
#define XXH_STATIC_LINKING_ONLY
#include "server/checkpoint/checkpoint_format.h"

#include <cstring>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "xxhash.h"

namespace kvcache::checkpoint {
namespace {

constexpr absl::string_view kPrefix = "ckpt-";
constexpr size_t kSequenceDigits = 20;

std::string Name(uint64_t sequence, absl::string_view suffix) {
  return absl::StrFormat("%s%020u%s", kPrefix, sequence, suffix);
}

}  // namespace

std::string DataFileName(uint64_t sequence) { return Name(sequence, ".data"); }
std::string ManifestFileName(uint64_t sequence) { return Name(sequence, ".manifest"); }
std::string ManifestTempFileName(uint64_t sequence) { return Name(sequence, ".manifest.tmp"); }

std::optional<ParsedName> ParseFileName(absl::string_view name) {
  if (!absl::StartsWith(name, kPrefix) || name.size() < kPrefix.size() + kSequenceDigits) {
    return std::nullopt;
  }
  const absl::string_view digits = name.substr(kPrefix.size(), kSequenceDigits);
  const absl::string_view suffix = name.substr(kPrefix.size() + kSequenceDigits);
  ParsedName parsed;
  for (char c : digits) {
    if (c < '0' || c > '9') return std::nullopt;
  }
  if (!absl::SimpleAtoi(digits, &parsed.sequence)) return std::nullopt;
  if (suffix == ".data") {
    parsed.kind = ParsedName::Kind::kData;
  } else if (suffix == ".manifest") {
    parsed.kind = ParsedName::Kind::kManifest;
  } else if (suffix == ".manifest.tmp") {
    parsed.kind = ParsedName::Kind::kManifestTemp;
  } else {
    return std::nullopt;
  }
  return parsed;
}

absl::Status UnsupportedVersionError(absl::string_view what, uint64_t version) {
  return absl::FailedPreconditionError(absl::StrCat(what, ": checkpoint format version ", version,
                                                    ", this kvcached reads up to ",
                                                    kFormatVersion));
}

absl::Status UnauthenticatedVersionError(absl::string_view what, uint64_t version) {
  return absl::DataLossError(absl::StrCat(
      what, ": checkpoint format version ", version,
      " is not authenticated (no MAC); this kvcached restores only checkpoints of version ",
      kFirstAuthenticatedVersion, " and later, written under its own secret"));
}

void PutU16(std::byte* p, uint16_t v) {
  for (int i = 0; i < 2; ++i) p[i] = std::byte(v >> (8 * i));
}
void PutU32(std::byte* p, uint32_t v) {
  for (int i = 0; i < 4; ++i) p[i] = std::byte(v >> (8 * i));
}
void PutU64(std::byte* p, uint64_t v) {
  for (int i = 0; i < 8; ++i) p[i] = std::byte(v >> (8 * i));
}
uint16_t GetU16(const std::byte* p) {
  return static_cast<uint16_t>(uint16_t(p[0]) | uint16_t(p[1]) << 8);
}
uint32_t GetU32(const std::byte* p) {
  uint32_t v = 0;
  for (int i = 3; i >= 0; --i) v = (v << 8) | uint32_t(p[i]);
  return v;
}
uint64_t GetU64(const std::byte* p) {
  uint64_t v = 0;
  for (int i = 7; i >= 0; --i) v = (v << 8) | uint64_t(p[i]);
  return v;
}

void XxhStateFree::operator()(XXH3_state_t* state) const { XXH3_freeState(state); }

XxhStatePtr NewXxhState() {
  XxhStatePtr state(XXH3_createState());
  XXH3_64bits_reset(state.get());
  return state;
}

std::string HexU64(uint64_t v) { return absl::StrFormat("%016x", v); }

std::optional<uint64_t> ParseHexU64(absl::string_view s) {
  if (s.size() != 16) return std::nullopt;
  uint64_t v = 0;
  for (char c : s) {
    int d;
    if (c >= '0' && c <= '9') {
      d = c - '0';
    } else if (c >= 'a' && c <= 'f') {
      d = c - 'a' + 10;
    } else {
      return std::nullopt;
    }
    v = (v << 4) | uint64_t(d);
  }
  return v;
}

std::array<std::byte, kDataHeaderBytes> EncodeDataHeader(const DataHeader& header) {
  std::array<std::byte, kDataHeaderBytes> b{};
  PutU32(&b[0], kDataMagic);
  PutU16(&b[4], kFormatVersion);
  PutU16(&b[6], kDataHeaderBytes);
  PutU64(&b[8], header.sequence);
  PutU64(&b[16], static_cast<uint64_t>(header.created_unix_ms));
  std::memcpy(&b[24], header.id.data(), header.id.size());
  PutU64(&b[56], XXH3_64bits(b.data(), 56));
  return b;
}

absl::StatusOr<DataHeader> DecodeDataHeader(std::span<const std::byte> b,
                                            uint64_t expected_sequence, absl::string_view what) {
  if (b.size() < kDataHeaderBytes) {
    return absl::DataLossError(
        absl::StrCat(what, ": truncated header (", b.size(), " of ", kDataHeaderBytes, " bytes)"));
  }
  if (GetU32(&b[0]) != kDataMagic) {
    return absl::DataLossError(absl::StrCat(what, ": bad magic 0x", absl::Hex(GetU32(&b[0]))));
  }
  const uint16_t version = GetU16(&b[4]);
  if (version > kFormatVersion) return UnsupportedVersionError(what, version);
  if (version == 0) return absl::DataLossError(absl::StrCat(what, ": format version 0"));
  if (version < kFirstAuthenticatedVersion) return UnauthenticatedVersionError(what, version);
  if (GetU16(&b[6]) != kDataHeaderBytes) {
    return absl::DataLossError(absl::StrCat(what, ": header size ", GetU16(&b[6])));
  }
  if (GetU64(&b[56]) != XXH3_64bits(b.data(), 56)) {
    return absl::DataLossError(absl::StrCat(what, ": header checksum mismatch"));
  }
  DataHeader header{GetU64(&b[8]), static_cast<int64_t>(GetU64(&b[16]))};
  std::memcpy(header.id.data(), &b[24], header.id.size());
  for (size_t i = 24 + kCheckpointIdBytes; i < 56; ++i) {
    if (b[i] != std::byte{0})
      return absl::DataLossError(absl::StrCat(what, ": reserved header bytes are not zero"));
  }
  if (header.sequence != expected_sequence) {
    return absl::DataLossError(absl::StrCat(what, ": header names sequence ", header.sequence,
                                            ", expected ", expected_sequence));
  }
  return header;
}

namespace {
void EncodeFrameFields(const FrameHeader& h, std::byte* b) {
  PutU32(b + 0, h.stored_bytes);
  PutU32(b + 4, h.uncompressed_bytes);
  b[8] = std::byte{h.type};
  b[9] = std::byte{h.flags};
  PutU16(b + 10, 0);
  PutU32(b + 12, h.index);
}
}  // namespace

std::array<std::byte, kFrameHeaderBytes> EncodeFrameHeader(const FrameHeader& header) {
  std::array<std::byte, kFrameHeaderBytes> b{};
  EncodeFrameFields(header, b.data());
  PutU64(&b[16], header.tag);
  return b;
}

absl::StatusOr<FrameHeader> DecodeFrameHeader(std::span<const std::byte> b, absl::string_view what,
                                              uint64_t offset) {
  auto loss = [&](absl::string_view why) {
    return absl::DataLossError(absl::StrCat(what, ": frame at offset ", offset, ": ", why));
  };
  if (b.size() < kFrameHeaderBytes) return loss("truncated frame header");
  FrameHeader h;
  h.stored_bytes = GetU32(&b[0]);
  h.uncompressed_bytes = GetU32(&b[4]);
  h.type = static_cast<uint8_t>(b[8]);
  h.flags = static_cast<uint8_t>(b[9]);
  h.index = GetU32(&b[12]);
  h.tag = GetU64(&b[16]);
  if ((h.flags & ~(kFlagZstd | kFlagEnd)) != 0 || h.flags == (kFlagZstd | kFlagEnd)) {
    return loss(absl::StrCat("unknown flags 0x", absl::Hex(h.flags)));
  }
  if (GetU16(&b[10]) != 0) return loss("reserved bytes are not zero");
  if (h.uncompressed_bytes > kMaxRecordBytes) {
    return loss(absl::StrCat("uncompressed length ", h.uncompressed_bytes, " over the limit"));
  }
  if ((h.flags & kFlagZstd) == 0 && h.stored_bytes != h.uncompressed_bytes) {
    return loss(
        absl::StrCat("raw frame stores ", h.stored_bytes, " bytes of ", h.uncompressed_bytes));
  }
  if ((h.flags & kFlagZstd) != 0 && h.stored_bytes >= h.uncompressed_bytes) {
    return loss(
        absl::StrCat("zstd frame stores ", h.stored_bytes, " bytes for ", h.uncompressed_bytes));
  }
  return h;
}

}  // namespace kvcache::checkpoint
