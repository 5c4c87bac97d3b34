#include "server/checkpoint/checkpoint_writer.h"

#include <zstd.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <limits>
#include <utility>

#include "absl/strings/str_cat.h"
#include "server/checkpoint/checkpoint_format.h"
#include "server/checkpoint/manifest.h"
#include "server/common/status_macros.h"

namespace kvcache::checkpoint {

absl::Status WriterOptions::Validate() const {
  if (zstd_level < -7 || zstd_level > 19) {
    return absl::InvalidArgumentError(
        absl::StrCat("WriterOptions.zstd_level ", zstd_level, " is outside -7 .. 19"));
  }
  if (buffer_bytes < (size_t{4} << 10) || buffer_bytes > (size_t{256} << 20)) {
    return absl::InvalidArgumentError(
        absl::StrCat("WriterOptions.buffer_bytes ", buffer_bytes, " is outside 4 KiB .. 256 MiB"));
  }
  return absl::OkStatus();
}

void CheckpointWriter::ZstdFree::operator()(ZSTD_CCtx_s* ctx) const { ZSTD_freeCCtx(ctx); }

absl::StatusOr<std::unique_ptr<CheckpointWriter>> CheckpointWriter::Create(FileSystem* fs,
                                                                           std::string dir,
                                                                           uint64_t sequence,
                                                                           WriterOptions options) {
  KVCACHE_RETURN_IF_ERROR(options.Validate());
  KVCACHE_RETURN_IF_ERROR(fs->CreateDir(dir));
  if (fs->Exists(JoinPath(dir, ManifestFileName(sequence)))) {
    return absl::AlreadyExistsError(
        absl::StrCat("checkpoint ", sequence, " already exists in ", dir));
  }
  std::unique_ptr<CheckpointWriter> writer(
      new CheckpointWriter(fs, std::move(dir), sequence, std::move(options)));
  absl::StatusOr<std::unique_ptr<WritableFile>> file = fs->NewWritableFile(writer->data_path_);
  if (!file.ok()) return file.status();
  writer->file_ = *std::move(file);
  writer->created_unix_ms_ = writer->Now();
  const auto header = EncodeDataHeader(DataHeader{sequence, writer->created_unix_ms_, writer->id_});
  KVCACHE_RETURN_IF_ERROR(writer->Emit(header));
  return writer;
}

CheckpointWriter::CheckpointWriter(FileSystem* fs, std::string dir, uint64_t sequence,
                                   WriterOptions options)
    : fs_(fs),
      dir_(std::move(dir)),
      sequence_(sequence),
      options_(std::move(options)),
      data_path_(JoinPath(dir_, DataFileName(sequence))),
      id_(NewCheckpointId()),
      frame_mac_(options_.mac_key, id_, sequence) {
  buffer_.reserve(options_.buffer_bytes);
  file_hash_ = NewXxhState();
  if (options_.zstd_level != 0) {
    zstd_.reset(ZSTD_createCCtx());
    ZSTD_CCtx_setParameter(zstd_.get(), ZSTD_c_compressionLevel, options_.zstd_level);
  }
}

CheckpointWriter::~CheckpointWriter() { Abort(); }

uint64_t CheckpointWriter::MemoryBytes() const {
  return buffer_.capacity() + scratch_.capacity() +
         (zstd_ != nullptr ? ZSTD_sizeof_CCtx(zstd_.get()) : 0);
}

int64_t CheckpointWriter::Now() const {
  if (options_.now_unix_ms) return options_.now_unix_ms();
  return std::chrono::duration_cast<std::chrono::milliseconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

absl::Status CheckpointWriter::Fail(absl::Status status) {
  if (error_.ok()) error_ = status;
  return status;
}

absl::Status CheckpointWriter::Flush() {
  if (buffer_.empty()) return absl::OkStatus();
  absl::Status s = file_->Append(buffer_);
  buffer_.clear();
  return s.ok() ? s : Fail(std::move(s));
}

absl::Status CheckpointWriter::Emit(std::span<const std::byte> bytes) {
  XXH3_64bits_update(file_hash_.get(), bytes.data(), bytes.size());
  offset_ += bytes.size();
  if (buffer_.size() + bytes.size() > options_.buffer_bytes) {
    KVCACHE_RETURN_IF_ERROR(Flush());
    if (bytes.size() >= options_.buffer_bytes) {
      absl::Status s = file_->Append(bytes);
      return s.ok() ? s : Fail(std::move(s));
    }
  }
  buffer_.insert(buffer_.end(), bytes.begin(), bytes.end());
  return absl::OkStatus();
}

absl::Status CheckpointWriter::WriteFrame(uint8_t type, uint8_t flags, uint32_t uncompressed,
                                          std::span<const std::byte> stored) {
  FrameHeader header{
      static_cast<uint32_t>(stored.size()), uncompressed, type, flags, record_count_, 0};
  header.tag = frame_mac_.Tag(header, offset_, stored);
  KVCACHE_RETURN_IF_ERROR(Emit(EncodeFrameHeader(header)));
  return Emit(stored);
}

absl::StatusOr<RecordLocation> CheckpointWriter::Append(uint8_t type,
                                                        std::span<const std::byte> bytes,
                                                        bool compress) {
  if (finished_) {
    return absl::FailedPreconditionError(
        absl::StrCat("checkpoint ", sequence_, ": Append after Commit or Abort"));
  }
  if (!error_.ok()) return error_;
  if (bytes.size() > kMaxRecordBytes) {
    return absl::InvalidArgumentError(absl::StrCat(
        "checkpoint record of ", bytes.size(), " bytes is over the limit of ", kMaxRecordBytes));
  }
  if (record_count_ == std::numeric_limits<uint32_t>::max()) {
    return Fail(absl::ResourceExhaustedError(
        absl::StrCat("checkpoint ", sequence_, " holds the most records a data file can")));
  }
  std::span<const std::byte> stored = bytes;
  uint8_t flags = 0;
  if (compress && zstd_ != nullptr && !bytes.empty()) {
    scratch_.resize(ZSTD_compressBound(bytes.size()));
    const size_t n =
        ZSTD_compress2(zstd_.get(), scratch_.data(), scratch_.size(), bytes.data(), bytes.size());
    if (!ZSTD_isError(n) && n < bytes.size()) {
      stored = std::span<const std::byte>(scratch_).first(n);
      flags = kFlagZstd;
    }
  }
  const RecordLocation location{sequence_, offset_};
  if (absl::Status s = WriteFrame(type, flags, static_cast<uint32_t>(bytes.size()), stored);
      !s.ok()) {
    return s;
  }
  ++record_count_;
  return location;
}

absl::Status CheckpointWriter::SealDataFile() {
  std::byte count[8];
  PutU64(count, record_count_);
  KVCACHE_RETURN_IF_ERROR(WriteFrame(0, kFlagEnd, sizeof(count), count));
  KVCACHE_RETURN_IF_ERROR(Flush());
  if (absl::Status s = file_->Sync(); !s.ok()) return Fail(std::move(s));
  absl::Status s = file_->Close();
  file_.reset();
  return s.ok() ? s : Fail(std::move(s));
}

absl::Status CheckpointWriter::WriteManifest(const nlohmann::json& summary,
                                             const std::vector<uint64_t>& refs,
                                             CheckpointInfo* info) {
  Manifest m;
  m.format_version = kFormatVersion;
  m.sequence = sequence_;
  m.id = id_;
  m.created_unix_ms = created_unix_ms_;
  m.write_duration_ms = std::max<int64_t>(0, Now() - created_unix_ms_);
  m.data_file = DataFileName(sequence_);
  m.data_bytes = offset_;
  m.data_xxh3 = XXH3_64bits_digest(file_hash_.get());
  m.record_count = record_count_;
  m.summary = summary;
  m.references = refs;
  const std::string text = EncodeManifest(m, options_.mac_key);
  const std::string tmp = JoinPath(dir_, ManifestTempFileName(sequence_));
  absl::StatusOr<std::unique_ptr<WritableFile>> file = fs_->NewWritableFile(tmp);
  if (!file.ok()) return file.status();
  KVCACHE_RETURN_IF_ERROR((*file)->Append(std::as_bytes(std::span(text))));
  KVCACHE_RETURN_IF_ERROR((*file)->Sync());
  KVCACHE_RETURN_IF_ERROR((*file)->Close());
  if (absl::Status s = fs_->Rename(tmp, JoinPath(dir_, ManifestFileName(sequence_))); !s.ok()) {
    return s;
  }
  manifest_renamed_ = true;
  KVCACHE_RETURN_IF_ERROR(fs_->SyncDir(dir_));
  *info = CheckpointInfo{sequence_,
                         CheckpointState::kComplete,
                         "",
                         m.created_unix_ms,
                         m.write_duration_ms,
                         m.data_bytes,
                         m.record_count,
                         m.summary,
                         m.references};
  return absl::OkStatus();
}

absl::StatusOr<CheckpointInfo> CheckpointWriter::Commit(const nlohmann::json& summary,
                                                        std::vector<uint64_t> references) {
  if (finished_) {
    return absl::FailedPreconditionError(
        absl::StrCat("checkpoint ", sequence_, ": Commit after Commit or Abort"));
  }
  absl::Status status = error_;
  std::sort(references.begin(), references.end());
  references.erase(std::unique(references.begin(), references.end()), references.end());
  if (status.ok() && !summary.is_object()) {
    status = absl::InvalidArgumentError("checkpoint summary must be a JSON object");
  }
  for (uint64_t r : references) {
    if (!status.ok()) break;
    if (r == sequence_) {
      status = absl::InvalidArgumentError(
          absl::StrCat("checkpoint ", sequence_, " lists itself in its references"));
    } else if (!fs_->Exists(JoinPath(dir_, ManifestFileName(r)))) {
      status = absl::FailedPreconditionError(absl::StrCat(
          "checkpoint ", sequence_, " references checkpoint ", r, " which has no manifest"));
    }
  }
  if (status.ok()) status = SealDataFile();
  CheckpointInfo info;
  if (status.ok()) status = WriteManifest(summary, references, &info);
  if (!status.ok()) {
    Abort();
    return status;
  }
  finished_ = true;
  return info;
}

void CheckpointWriter::Abort() {
  if (finished_) return;
  finished_ = true;
  if (file_ != nullptr) {
    (void)file_->Close();
    file_.reset();
  }
  buffer_.clear();
  if (manifest_renamed_) (void)fs_->Delete(JoinPath(dir_, ManifestFileName(sequence_)));
  (void)fs_->Delete(JoinPath(dir_, ManifestTempFileName(sequence_)));
  (void)fs_->Delete(data_path_);
  (void)fs_->SyncDir(dir_);
}

}  // namespace kvcache::checkpoint
