// Manifest: a checkpoint's commit record, a JSON object that ends with its own
// checksum (docs/checkpoint-format.md, "Manifest"). Encode and decode only; the
// writer and the directory do the I/O. Pure functions, thread-safe.
#ifndef KVCACHE_SERVER_CHECKPOINT_MANIFEST_H_
#define KVCACHE_SERVER_CHECKPOINT_MANIFEST_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "nlohmann/json.hpp"

namespace kvcache::checkpoint {

struct Manifest {
  uint64_t format_version = 0;
  uint64_t sequence = 0;
  int64_t created_unix_ms = 0;
  int64_t write_duration_ms = 0;
  std::string data_file;
  uint64_t data_bytes = 0;
  uint64_t data_xxh3 = 0;
  uint64_t record_count = 0;
  nlohmann::json summary = nlohmann::json::object();
  std::vector<uint64_t> references;  // ascending, without `sequence`
};

// The manifest file's text, checksum included. REQUIRES: summary is an object.
std::string EncodeManifest(const Manifest& manifest);

// Parses and checks a manifest file's text. FAILED_PRECONDITION when it names
// a format version newer than kFormatVersion (checked first, so a newer
// manifest is refused rather than called corrupt); DATA_LOSS, prefixed with
// `what`, when the checksum fails, the JSON does not parse, a field is missing
// or of the wrong type, or the sequence is not `expected_sequence`.
absl::StatusOr<Manifest> DecodeManifest(absl::string_view text, uint64_t expected_sequence,
                                        absl::string_view what);

}  // namespace kvcache::checkpoint

#endif  // KVCACHE_SERVER_CHECKPOINT_MANIFEST_H_
