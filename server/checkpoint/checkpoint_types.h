// Values shared by the checkpoint writer, reader and directory
// (docs/checkpoint-format.md). Plain data, no behaviour.
#ifndef KVCACHE_SERVER_CHECKPOINT_CHECKPOINT_TYPES_H_
#define KVCACHE_SERVER_CHECKPOINT_CHECKPOINT_TYPES_H_

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/strings/string_view.h"
#include "nlohmann/json.hpp"

namespace kvcache::checkpoint {

// Where a record's frame is: the data file of checkpoint `sequence`, at byte
// `offset` (its frame header). What a reference record stores.
struct RecordLocation {
  uint64_t sequence = 0;
  uint64_t offset = 0;
  friend bool operator==(const RecordLocation&, const RecordLocation&) = default;
};

// One record read back: the caller's type, the decompressed bytes, and where
// its frame is.
struct Record {
  uint8_t type = 0;
  std::vector<std::byte> bytes;
  RecordLocation location;
};

enum class CheckpointState : uint8_t {
  kComplete,     // manifest, data size and header check out, and so do its references
  kIncomplete,   // a data file or manifest.tmp without a manifest: a writer stopped
  kCorrupt,      // a checksum, size or field is wrong (the reason says which)
  kUnsupported,  // written by a newer format version; never read, never pruned
};
absl::string_view CheckpointStateName(CheckpointState state);

struct CheckpointInfo {
  uint64_t sequence = 0;
  CheckpointState state = CheckpointState::kComplete;
  std::string reason;  // why it is not complete; empty when complete
  // From the manifest (zero / empty when there is none or it is unreadable):
  int64_t created_unix_ms = 0;
  int64_t write_duration_ms = 0;
  uint64_t data_bytes = 0;
  uint64_t record_count = 0;
  nlohmann::json summary = nlohmann::json::object();
  std::vector<uint64_t> references;
};

}  // namespace kvcache::checkpoint

#endif  // KVCACHE_SERVER_CHECKPOINT_CHECKPOINT_TYPES_H_
