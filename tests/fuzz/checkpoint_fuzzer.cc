// Fuzz target: reading a checkpoint back (server/checkpoint/): the manifest,
// the data-file and frame headers, and CheckpointReader walking a data file,
// all over bytes a crash, a bad disk or another program may have left.
//
// Input: byte 0 picks a mode (mod 4), the rest is that mode's bytes:
//   0  a manifest's text as is (DecodeManifest);
//   1  a manifest's body, given its correct MAC suffix first (under the
//      all-zero test key), so the JSON checks behind the MAC are reached;
//   2  header bytes (DecodeDataHeader, DecodeFrameHeader) and a file name
//      (ParseFileName, ParseHexU64);
//   3  a data file's frames. Byte 1 holds flags: 1 = set each frame's
//      MAC tag right, 2 = number the frames 0, 1, 2..., 4 = let a frame
//      claim more than 1 MiB uncompressed (up to the format's 1 GiB, which
//      the reader allocates; slow); byte 2 sizes the
//      reader's buffer. The fuzzer prepends a valid data header and writes a
//      manifest that matches the file (size, XXH3, record count), all in an
//      in-memory file system, then reads every record with Next() and again
//      with ReadRecordAt().
// Properties: nothing is read outside the bytes (ASan); a damaged input gives
// DATA_LOSS, FAILED_PRECONDITION (a newer version) or INVALID_ARGUMENT, never
// a crash; a record read with Next() reads the same with ReadRecordAt().
#include <cstring>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "server/checkpoint/checkpoint_format.h"
#include "server/checkpoint/checkpoint_reader.h"
#include "server/checkpoint/manifest.h"
#include "tests/fuzz/fuzz_check.h"
#include "tests/fuzz/memory_file_system.h"
#include "xxhash.h"

namespace kvcache::checkpoint {
namespace {

constexpr char kDir[] = "ckpt";
constexpr uint64_t kSequence = 7;

bool Damaged(const absl::Status& s) {
  return s.code() == absl::StatusCode::kDataLoss ||
         s.code() == absl::StatusCode::kFailedPrecondition ||
         s.code() == absl::StatusCode::kInvalidArgument;
}

std::span<const std::byte> Span(const std::string& s) {
  return {reinterpret_cast<const std::byte*>(s.data()), s.size()};
}

void Manifests(std::string text, bool fix_checksum) {
  if (fix_checksum) {
    // EncodeManifest's suffix: ",\n  \"manifest_hmac\": \"<64 hex>\"\n}\n".
    text += ",\n  \"manifest_hmac\": \"" + ManifestMacHex(CheckpointKey{}, text) + "\"\n}\n";
  }
  absl::StatusOr<Manifest> m = DecodeManifest(text, kSequence, CheckpointKey{}, "fuzz");
  if (!m.ok()) {
    FUZZ_CHECK(Damaged(m.status()));
    return;
  }
  FUZZ_CHECK(m->sequence == kSequence);
  // What decodes encodes to a manifest that decodes to the same facts.
  absl::StatusOr<Manifest> again =
      DecodeManifest(EncodeManifest(*m, CheckpointKey{}), kSequence, CheckpointKey{}, "fuzz");
  FUZZ_CHECK(again.ok());
  FUZZ_CHECK(again->data_bytes == m->data_bytes && again->data_xxh3 == m->data_xxh3 &&
             again->record_count == m->record_count && again->references == m->references &&
             again->data_file == m->data_file && again->id == m->id);
}

void Headers(const std::string& bytes) {
  const std::span<const std::byte> b = Span(bytes);
  const uint64_t sequence = bytes.size() >= 16 ? GetU64(b.data() + 8) : 0;
  absl::StatusOr<DataHeader> data = DecodeDataHeader(b, sequence, "fuzz");
  if (data.ok()) {
    FUZZ_CHECK(data->sequence == sequence);
    const auto encoded = EncodeDataHeader(*data);
    FUZZ_CHECK(std::memcmp(encoded.data(), b.data(), 24) == 0);
  } else {
    FUZZ_CHECK(Damaged(data.status()));
  }
  absl::StatusOr<FrameHeader> frame = DecodeFrameHeader(b, "fuzz", 0);
  if (frame.ok()) {
    const auto encoded = EncodeFrameHeader(*frame);
    FUZZ_CHECK(b.size() >= kFrameHeaderBytes);
    FUZZ_CHECK(std::memcmp(encoded.data(), b.data(), kFrameHeaderBytes) == 0);
  } else {
    FUZZ_CHECK(Damaged(frame.status()));
  }
  if (std::optional<ParsedName> name = ParseFileName(bytes)) {
    const std::string again = name->kind == ParsedName::Kind::kData ? DataFileName(name->sequence)
                              : name->kind == ParsedName::Kind::kManifest
                                  ? ManifestFileName(name->sequence)
                                  : ManifestTempFileName(name->sequence);
    FUZZ_CHECK(again == bytes);
  }
  if (std::optional<uint64_t> v = ParseHexU64(bytes)) FUZZ_CHECK(HexU64(*v) == bytes);
}

void Reader(fuzz::InputReader in) {
  const uint8_t flags = in.Byte();
  ReaderOptions options;
  options.read_chunk_bytes = 1 + size_t{in.Byte()} * 16;
  // The data file: a valid header, then the input's frames (checksums and
  // indices set right where asked).
  std::string data(kDataHeaderBytes, '\0');
  const CheckpointId id{1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16};
  const FrameMac frame_mac(CheckpointKey{}, id, kSequence);
  const auto header = EncodeDataHeader({.sequence = kSequence, .created_unix_ms = 1, .id = id});
  std::memcpy(data.data(), header.data(), kDataHeaderBytes);
  const char* p = reinterpret_cast<const char*>(in.rest());
  size_t left = in.rest_size();
  uint64_t records = 0;
  for (uint32_t index = 0; left >= kFrameHeaderBytes; ++index) {
    const uint64_t offset = data.size();
    std::string frame(p, kFrameHeaderBytes);
    p += kFrameHeaderBytes;
    left -= kFrameHeaderBytes;
    std::byte* h = reinterpret_cast<std::byte*>(frame.data());
    if ((flags & 2) != 0) PutU32(h + 12, index);
    // Records may claim up to 1 GiB, which the reader allocates; most inputs
    // keep to 1 MiB so that fuzzing stays fast.
    if ((flags & 4) == 0 && GetU32(h + 4) > (1u << 20)) PutU32(h + 4, 1u << 20);
    const size_t stored = std::min<uint64_t>(GetU32(h), left);
    frame.append(p, stored);
    h = reinterpret_cast<std::byte*>(frame.data());  // append may have moved it
    p += stored;
    left -= stored;
    if ((flags & 1) != 0) {
      const FrameHeader fields{.stored_bytes = GetU32(h),
                               .uncompressed_bytes = GetU32(h + 4),
                               .type = static_cast<uint8_t>(frame[8]),
                               .flags = static_cast<uint8_t>(frame[9]),
                               .index = GetU32(h + 12)};
      PutU64(h + 16, frame_mac.Tag(fields, offset, Span(frame).subspan(kFrameHeaderBytes)));
    }
    if ((static_cast<uint8_t>(frame[9]) & kFlagEnd) == 0) ++records;
    data += frame;
  }
  data.append(p, left);

  Manifest m;
  m.format_version = kFormatVersion;
  m.sequence = kSequence;
  m.id = id;
  m.created_unix_ms = 1;
  m.data_file = DataFileName(kSequence);
  m.data_bytes = data.size();
  m.data_xxh3 = XXH3_64bits(data.data(), data.size());
  m.record_count = records;
  MemoryFileSystem fs;
  fs.files[JoinPath(kDir, DataFileName(kSequence))] = data;
  fs.files[JoinPath(kDir, ManifestFileName(kSequence))] = EncodeManifest(m, CheckpointKey{});

  absl::StatusOr<std::unique_ptr<CheckpointReader>> reader =
      CheckpointReader::Open(&fs, kDir, kSequence, options);
  if (!reader.ok()) {
    FUZZ_CHECK(Damaged(reader.status()));
    return;
  }
  uint64_t read = 0;
  Record record;
  Record again;
  while (true) {
    absl::StatusOr<bool> more = (*reader)->Next(&record);
    if (!more.ok()) {
      FUZZ_CHECK(Damaged(more.status()));
      // Errors are sticky.
      FUZZ_CHECK((*reader)->Next(&record).status() == more.status());
      break;
    }
    if (!*more) break;
    FUZZ_CHECK(++read <= records);
    // ReadRecordAt is independent of Next()'s position.
    FUZZ_CHECK((*reader)->ReadRecordAt(record.location, &again).ok());
    FUZZ_CHECK(again.type == record.type && again.bytes == record.bytes);
  }
}

}  // namespace
}  // namespace kvcache::checkpoint

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  kvcache::fuzz::InputReader in(data, size);
  const uint8_t mode = in.Byte() % 4;
  const std::string rest(reinterpret_cast<const char*>(in.rest()), in.rest_size());
  switch (mode) {
    case 0:
    case 1:
      kvcache::checkpoint::Manifests(rest, mode == 1);
      break;
    case 2:
      kvcache::checkpoint::Headers(rest);
      break;
    default:
      kvcache::checkpoint::Reader(in);
  }
  return 0;
}
