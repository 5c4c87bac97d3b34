#include "server/checkpoint/checkpoint_files.h"

#include <zstd.h>

#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"

namespace kvcache::checkpoint {

void ZstdDCtxFree::operator()(ZSTD_DCtx_s* ctx) const { ZSTD_freeDCtx(ctx); }
ZstdDCtxPtr NewZstdDCtx() { return ZstdDCtxPtr(ZSTD_createDCtx()); }

namespace {

constexpr uint64_t kMaxManifestBytes = uint64_t{64} << 20;

absl::StatusOr<std::string> ReadSmallFile(FileSystem* fs, const std::string& path) {
  absl::StatusOr<std::unique_ptr<ReadableFile>> file = fs->NewReadableFile(path);
  if (!file.ok()) return file.status();
  absl::StatusOr<uint64_t> size = (*file)->Size();
  if (!size.ok()) return size.status();
  if (*size > kMaxManifestBytes) {
    return absl::DataLossError(absl::StrCat(path, ": manifest of ", *size, " bytes is too large"));
  }
  std::string text(*size, '\0');
  absl::StatusOr<size_t> n = (*file)->Read(0, std::as_writable_bytes(std::span(text)));
  if (!n.ok()) return n.status();
  text.resize(*n);
  return text;
}

}  // namespace

absl::StatusOr<OpenedCheckpoint> OpenCheckpointFiles(FileSystem* fs, const std::string& dir,
                                                     uint64_t sequence, const CheckpointKey& key) {
  const std::string manifest_path = JoinPath(dir, ManifestFileName(sequence));
  absl::StatusOr<std::string> text = ReadSmallFile(fs, manifest_path);
  if (!text.ok()) return text.status();
  absl::StatusOr<Manifest> manifest = DecodeManifest(*text, sequence, key, manifest_path);
  if (!manifest.ok()) return manifest.status();
  OpenedCheckpoint opened;
  opened.what = JoinPath(dir, manifest->data_file);
  opened.manifest = *std::move(manifest);
  absl::StatusOr<std::unique_ptr<ReadableFile>> data = fs->NewReadableFile(opened.what);
  if (!data.ok()) {
    if (absl::IsNotFound(data.status())) {
      return absl::DataLossError(absl::StrCat(opened.what, ": data file missing"));
    }
    return data.status();
  }
  opened.data = *std::move(data);
  absl::StatusOr<uint64_t> size = opened.data->Size();
  if (!size.ok()) return size.status();
  absl::StatusOr<size_t> n = opened.data->Read(0, opened.header_bytes);
  if (!n.ok()) return n.status();
  absl::StatusOr<DataHeader> decoded = DecodeDataHeader(
      std::span<const std::byte>(opened.header_bytes).first(*n), sequence, opened.what);
  if (!decoded.ok()) {
    // The manifest, authenticated, names a version this kvcached reads: a
    // header that claims a newer one is damaged or forged, not newer.
    if (absl::IsFailedPrecondition(decoded.status())) {
      return absl::DataLossError(absl::StrCat(
          decoded.status().message(), ", but its manifest says ", opened.manifest.format_version));
    }
    return decoded.status();
  }
  opened.header = *decoded;
  if (*size != opened.manifest.data_bytes) {
    return absl::DataLossError(absl::StrCat(opened.what, ": data file is ", *size,
                                            " bytes, the manifest says ",
                                            opened.manifest.data_bytes));
  }
  if (opened.header.created_unix_ms != opened.manifest.created_unix_ms) {
    return absl::DataLossError(
        absl::StrCat(opened.what, ": header and manifest disagree on the creation time"));
  }
  if (opened.header.id != opened.manifest.id) {
    return absl::DataLossError(
        absl::StrCat(opened.what, ": header and manifest disagree on the checkpoint id"));
  }
  opened.frames = std::make_unique<const FrameMac>(key, opened.manifest.id, sequence);
  return opened;
}

absl::Status DecodeStored(const FrameHeader& header, std::span<const std::byte> stored,
                          ZSTD_DCtx_s* zstd, absl::string_view what, uint64_t offset,
                          std::vector<std::byte>* out) {
  out->resize(header.uncompressed_bytes);
  if ((header.flags & kFlagZstd) == 0) {
    if (!stored.empty()) std::memcpy(out->data(), stored.data(), stored.size());
    return absl::OkStatus();
  }
  const size_t n =
      ZSTD_decompressDCtx(zstd, out->data(), out->size(), stored.data(), stored.size());
  if (ZSTD_isError(n) || n != header.uncompressed_bytes) {
    return absl::DataLossError(
        absl::StrCat(what, ": frame at offset ", offset, ": zstd ",
                     ZSTD_isError(n) ? ZSTD_getErrorName(n) : absl::StrCat("gave ", n, " bytes"),
                     ", expected ", header.uncompressed_bytes));
  }
  return absl::OkStatus();
}

absl::Status ReadFrameAt(const OpenedCheckpoint& checkpoint, uint64_t offset, ZSTD_DCtx_s* zstd,
                         std::vector<std::byte>* scratch, Record* record) {
  const uint64_t size = checkpoint.manifest.data_bytes;
  const std::string& what = checkpoint.what;
  if (offset < kDataHeaderBytes || offset > size || size - offset < kFrameHeaderBytes) {
    return absl::DataLossError(
        absl::StrCat(what, ": no record frame at offset ", offset, " (file of ", size, " bytes)"));
  }
  std::byte raw[kFrameHeaderBytes];
  absl::StatusOr<size_t> n = checkpoint.data->Read(offset, raw);
  if (!n.ok()) return n.status();
  absl::StatusOr<FrameHeader> header =
      DecodeFrameHeader(std::span<const std::byte>(raw, *n), what, offset);
  if (!header.ok()) return header.status();
  const uint64_t body = offset + kFrameHeaderBytes;
  if (header->stored_bytes > size - body) {
    return absl::DataLossError(absl::StrCat(what, ": frame at offset ", offset, " of ",
                                            header->stored_bytes, " bytes runs past the end"));
  }
  scratch->resize(header->stored_bytes);
  n = checkpoint.data->Read(body, *scratch);
  if (!n.ok()) return n.status();
  if (*n != scratch->size() || checkpoint.frames->Tag(*header, offset, *scratch) != header->tag) {
    return absl::DataLossError(absl::StrCat(what, ": frame at offset ", offset, ": MAC mismatch"));
  }
  if ((header->flags & kFlagEnd) != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, ": offset ", offset, " is the end record, not a record"));
  }
  record->type = header->type;
  record->location = RecordLocation{checkpoint.manifest.sequence, offset};
  return DecodeStored(*header, *scratch, zstd, what, offset, &record->bytes);
}

}  // namespace kvcache::checkpoint
