// Manifest: a checkpoint's commit record, a JSON object that ends with its own
// MAC, an HMAC-SHA256 under a key derived from the checkpoint key
// (docs/checkpoint-format.md, "Manifest"). Encode and decode only; the writer
// and the directory do the I/O. Pure functions, thread-safe.
#ifndef KVCACHE_SERVER_CHECKPOINT_MANIFEST_H_
#define KVCACHE_SERVER_CHECKPOINT_MANIFEST_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "nlohmann/json.hpp"
#include "server/checkpoint/checkpoint_mac.h"

namespace kvcache::checkpoint {

struct Manifest {
  uint64_t format_version = 0;
  uint64_t sequence = 0;
  CheckpointId id{};  // checkpoint_id; equals the data header's
  int64_t created_unix_ms = 0;
  int64_t write_duration_ms = 0;
  std::string data_file;
  uint64_t data_bytes = 0;
  uint64_t data_xxh3 = 0;
  uint64_t record_count = 0;
  nlohmann::json summary = nlohmann::json::object();
  std::vector<uint64_t> references;  // ascending, without `sequence`
};

// The manifest file's text, MAC under `key` included. REQUIRES: summary is an
// object.
std::string EncodeManifest(const Manifest& manifest, const CheckpointKey& key);

// Parses and checks a manifest file's text. DATA_LOSS, prefixed with `what`,
// when it names a version older than kFirstAuthenticatedVersion (no MAC) or
// its MAC under `key` fails (another secret, or edited); then
// FAILED_PRECONDITION when it names a format version newer than
// kFormatVersion (so only a manifest written under the key can claim one, and
// it is refused rather than called corrupt); DATA_LOSS when the JSON does not
// parse, a field is missing or of the wrong type, or the sequence is not
// `expected_sequence`.
absl::StatusOr<Manifest> DecodeManifest(absl::string_view text, uint64_t expected_sequence,
                                        const CheckpointKey& key, absl::string_view what);

}  // namespace kvcache::checkpoint

#endif  // KVCACHE_SERVER_CHECKPOINT_MANIFEST_H_
