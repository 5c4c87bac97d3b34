#include "server/checkpoint/checkpoint_reader.h"

#include <algorithm>
#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"
#include "server/common/status_macros.h"

namespace kvcache::checkpoint {

absl::StatusOr<std::unique_ptr<CheckpointReader>> CheckpointReader::Open(FileSystem* fs,
                                                                         std::string dir,
                                                                         uint64_t sequence,
                                                                         ReaderOptions options) {
  absl::StatusOr<OpenedCheckpoint> opened = OpenCheckpointFiles(fs, dir, sequence, options.mac_key);
  if (!opened.ok()) return opened.status();
  options.read_chunk_bytes = std::max<size_t>(options.read_chunk_bytes, 4096);
  return std::unique_ptr<CheckpointReader>(
      new CheckpointReader(fs, std::move(dir), *std::move(opened), options));
}

CheckpointReader::CheckpointReader(FileSystem* fs, std::string dir, OpenedCheckpoint opened,
                                   ReaderOptions options)
    : fs_(fs),
      dir_(std::move(dir)),
      self_(std::move(opened)),
      options_(options),
      zstd_(NewZstdDCtx()) {
  const Manifest& m = self_.manifest;
  info_ = CheckpointInfo{m.sequence,
                         CheckpointState::kComplete,
                         "",
                         m.created_unix_ms,
                         m.write_duration_ms,
                         m.data_bytes,
                         m.record_count,
                         m.summary,
                         m.references};
  file_hash_ = NewXxhState();
  // Start after the header (checked by Open) but hash it.
  XXH3_64bits_update(file_hash_.get(), self_.header_bytes.data(), self_.header_bytes.size());
  offset_ = file_read_ = kDataHeaderBytes;
}

absl::StatusOr<size_t> CheckpointReader::Fill(size_t n) {
  const size_t have = buffer_.size() - pos_;
  if (have >= n) return n;
  const uint64_t file_size = self_.manifest.data_bytes;
  const uint64_t left_in_file = file_size - file_read_;
  if (left_in_file == 0) return have;
  // Move the unread tail to the front, then read at least a chunk.
  if (pos_ > 0) {
    std::memmove(buffer_.data(), buffer_.data() + pos_, have);
    pos_ = 0;
  }
  const size_t want =
      std::min<uint64_t>(std::max(n - have, options_.read_chunk_bytes), left_in_file);
  buffer_.resize(have + want);
  absl::StatusOr<size_t> got = self_.data->Read(file_read_, std::span(buffer_).subspan(have));
  if (!got.ok()) return got.status();
  buffer_.resize(have + *got);
  file_read_ += *got;
  return std::min(n, buffer_.size());
}

absl::StatusOr<bool> CheckpointReader::Next(Record* record) {
  if (!error_.ok()) return error_;
  if (done_) return false;
  absl::StatusOr<bool> result = ReadNext(record);
  if (!result.ok()) error_ = result.status();
  return result;
}

absl::StatusOr<bool> CheckpointReader::ReadNext(Record* record) {
  const std::string& what = self_.what;
  const uint64_t offset = offset_;
  absl::StatusOr<size_t> got = Fill(kFrameHeaderBytes);
  if (!got.ok()) return got.status();
  if (*got < kFrameHeaderBytes) {
    return absl::DataLossError(absl::StrCat(what, ": truncated: the file ends at offset ",
                                            offset + *got, " before the end record"));
  }
  const std::span<const std::byte> raw(buffer_.data() + pos_, kFrameHeaderBytes);
  absl::StatusOr<FrameHeader> header = DecodeFrameHeader(raw, what, offset);
  if (!header.ok()) return header.status();
  if (header->index != next_index_) {
    return absl::DataLossError(absl::StrCat(what, ": frame at offset ", offset, " has index ",
                                            header->index, ", expected ", next_index_));
  }
  const size_t frame_bytes = kFrameHeaderBytes + size_t{header->stored_bytes};
  got = Fill(frame_bytes);
  if (!got.ok()) return got.status();
  if (*got < frame_bytes) {
    return absl::DataLossError(absl::StrCat(what, ": truncated: the frame at offset ", offset,
                                            " needs ", frame_bytes, " bytes, the file has ", *got));
  }
  const std::span<const std::byte> frame(buffer_.data() + pos_, frame_bytes);
  const std::span<const std::byte> stored = frame.subspan(kFrameHeaderBytes);
  if (self_.frames->Tag(*header, offset, stored) != header->tag) {
    return absl::DataLossError(absl::StrCat(what, ": frame at offset ", offset, ": MAC mismatch"));
  }
  XXH3_64bits_update(file_hash_.get(), frame.data(), frame.size());
  pos_ += frame_bytes;
  offset_ += frame_bytes;
  if ((header->flags & kFlagEnd) != 0) {
    KVCACHE_RETURN_IF_ERROR(CheckEnd(*header, stored, offset));
    done_ = true;
    return false;
  }
  ++next_index_;
  record->type = header->type;
  record->location = RecordLocation{self_.manifest.sequence, offset};
  if (absl::Status s = DecodeStored(*header, stored, zstd_.get(), what, offset, &record->bytes);
      !s.ok()) {
    return s;
  }
  return true;
}

absl::Status CheckpointReader::CheckEnd(const FrameHeader& header,
                                        std::span<const std::byte> stored, uint64_t offset) {
  const std::string& what = self_.what;
  if (stored.size() != 8 || GetU64(stored.data()) != header.index ||
      header.index != self_.manifest.record_count) {
    return absl::DataLossError(absl::StrCat(what, ": end record at offset ", offset,
                                            " disagrees with the record count ",
                                            self_.manifest.record_count));
  }
  if (offset_ != self_.manifest.data_bytes) {
    return absl::DataLossError(absl::StrCat(what, ": ", self_.manifest.data_bytes - offset_,
                                            " bytes follow the end record at offset ", offset));
  }
  if (XXH3_64bits_digest(file_hash_.get()) != self_.manifest.data_xxh3) {
    return absl::DataLossError(
        absl::StrCat(what, ": the data file's XXH3-64 differs from the manifest's"));
  }
  return absl::OkStatus();
}

absl::Status CheckpointReader::ReadRecordAt(const RecordLocation& location, Record* record) {
  const OpenedCheckpoint* target = &self_;
  if (location.sequence != self_.manifest.sequence) {
    const std::vector<uint64_t>& refs = self_.manifest.references;
    if (!std::binary_search(refs.begin(), refs.end(), location.sequence)) {
      return absl::InvalidArgumentError(absl::StrCat("checkpoint ", self_.manifest.sequence,
                                                     " does not reference checkpoint ",
                                                     location.sequence));
    }
    auto& slot = referenced_[location.sequence];
    if (slot == nullptr) {
      absl::StatusOr<OpenedCheckpoint> opened =
          OpenCheckpointFiles(fs_, dir_, location.sequence, options_.mac_key);
      if (!opened.ok()) {
        referenced_.erase(location.sequence);
        if (absl::IsNotFound(opened.status())) {
          return absl::DataLossError(absl::StrCat("checkpoint ", self_.manifest.sequence,
                                                  " references checkpoint ", location.sequence,
                                                  ", which is gone: ", opened.status().message()));
        }
        return opened.status();
      }
      slot = std::make_unique<OpenedCheckpoint>(*std::move(opened));
    }
    target = slot.get();
  }
  return ReadFrameAt(*target, location.offset, zstd_.get(), &scratch_, record);
}

}  // namespace kvcache::checkpoint
