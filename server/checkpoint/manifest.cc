#include "server/checkpoint/manifest.h"

#include <algorithm>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "server/checkpoint/checkpoint_format.h"

namespace kvcache::checkpoint {
namespace {

// The file ends with kSuffixHead + 64 hex digits + kSuffixTail.
constexpr absl::string_view kSuffixHead = ",\n  \"manifest_hmac\": \"";
constexpr absl::string_view kSuffixTail = "\"\n}\n";
constexpr size_t kMacHexDigits = 64;
constexpr size_t kSuffixBytes = kSuffixHead.size() + kMacHexDigits + kSuffixTail.size();

bool GetUnsigned(const nlohmann::json& j, const char* key, uint64_t* out) {
  const auto it = j.find(key);
  if (it == j.end() || !it->is_number_unsigned()) return false;
  *out = it->get<uint64_t>();
  return true;
}

bool GetSigned(const nlohmann::json& j, const char* key, int64_t* out) {
  const auto it = j.find(key);
  if (it == j.end() || !it->is_number_integer()) return false;
  *out = it->get<int64_t>();
  return true;
}

}  // namespace

std::string EncodeManifest(const Manifest& m, const CheckpointKey& key) {
  nlohmann::json j = nlohmann::json::object();
  j["format_version"] = m.format_version;
  j["sequence"] = m.sequence;
  j["checkpoint_id"] = HexId(m.id);
  j["created_unix_ms"] = m.created_unix_ms;
  j["write_duration_ms"] = m.write_duration_ms;
  j["data_file"] = m.data_file;
  j["data_bytes"] = m.data_bytes;
  j["data_xxh3"] = HexU64(m.data_xxh3);
  j["record_count"] = m.record_count;
  j["summary"] = m.summary;
  j["references"] = m.references;
  std::string text =
      j.dump(2, ' ', false, nlohmann::json::error_handler_t::replace);  // "{\n ... \n}"
  text.resize(text.size() - 2);                                         // drop "\n}"
  absl::StrAppend(&text, kSuffixHead, ManifestMacHex(key, text), kSuffixTail);
  return text;
}

absl::StatusOr<Manifest> DecodeManifest(absl::string_view text, uint64_t expected_sequence,
                                        const CheckpointKey& key, absl::string_view what) {
  auto loss = [&](absl::string_view why) {
    return absl::DataLossError(absl::StrCat(what, ": ", why));
  };
  const nlohmann::json j =
      nlohmann::json::parse(text.begin(), text.end(), nullptr, /*allow_exceptions=*/false);
  Manifest m;
  // An older version carries no MAC to check: refused as corrupt, by name.
  if (j.is_object() && GetUnsigned(j, "format_version", &m.format_version) &&
      m.format_version != 0 && m.format_version < kFirstAuthenticatedVersion) {
    return UnauthenticatedVersionError(what, m.format_version);
  }
  if (text.size() < kSuffixBytes) return loss("truncated manifest");
  const absl::string_view body = text.substr(0, text.size() - kSuffixBytes);
  const absl::string_view suffix = text.substr(body.size());
  if (!absl::StartsWith(suffix, kSuffixHead) || !absl::EndsWith(suffix, kSuffixTail)) {
    return loss("manifest does not end with its manifest_hmac field");
  }
  if (!ManifestMacMatches(key, body, suffix.substr(kSuffixHead.size(), kMacHexDigits))) {
    return loss(
        "manifest MAC mismatch: not written under this daemon's secret, or changed since "
        "(security.secret_file)");
  }
  // Every version from 2 on ends with this MAC, so only a manifest this
  // daemon's secret wrote can claim a newer version (and stop the start-up);
  // a forged or damaged one is corrupt.
  if (j.is_object() && GetUnsigned(j, "format_version", &m.format_version) &&
      m.format_version > kFormatVersion) {
    return UnsupportedVersionError(what, m.format_version);
  }
  if (!j.is_object()) return loss("manifest is not a JSON object");
  std::string data_xxh3;
  if (!GetUnsigned(j, "format_version", &m.format_version) || m.format_version == 0) {
    return loss("manifest field format_version missing or invalid");
  }
  if (!GetUnsigned(j, "sequence", &m.sequence) ||
      !GetSigned(j, "created_unix_ms", &m.created_unix_ms) ||
      !GetSigned(j, "write_duration_ms", &m.write_duration_ms) ||
      !GetUnsigned(j, "data_bytes", &m.data_bytes) ||
      !GetUnsigned(j, "record_count", &m.record_count)) {
    return loss("a numeric manifest field is missing or of the wrong type");
  }
  const auto id = j.find("checkpoint_id");
  if (id == j.end() || !id->is_string() || !ParseHexId(id->get<std::string>(), &m.id)) {
    return loss("manifest field checkpoint_id is not 32 hex digits");
  }
  const auto data_file = j.find("data_file");
  const auto xxh = j.find("data_xxh3");
  const auto summary = j.find("summary");
  const auto refs = j.find("references");
  if (data_file == j.end() || !data_file->is_string() || xxh == j.end() || !xxh->is_string() ||
      summary == j.end() || !summary->is_object() || refs == j.end() || !refs->is_array()) {
    return loss("a manifest field is missing or of the wrong type");
  }
  m.data_file = data_file->get<std::string>();
  const std::optional<uint64_t> data_checksum = ParseHexU64(xxh->get<std::string>());
  if (!data_checksum) return loss("manifest field data_xxh3 is not 16 hex digits");
  m.data_xxh3 = *data_checksum;
  m.summary = *summary;
  for (const nlohmann::json& r : *refs) {
    if (!r.is_number_unsigned()) return loss("manifest references hold a non-sequence");
    m.references.push_back(r.get<uint64_t>());
  }
  if (m.sequence != expected_sequence) {
    return loss(
        absl::StrCat("manifest names sequence ", m.sequence, ", expected ", expected_sequence));
  }
  if (m.data_file != DataFileName(m.sequence)) {
    return loss(absl::StrCat("manifest names data file ", m.data_file));
  }
  if (!std::is_sorted(m.references.begin(), m.references.end()) ||
      std::find(m.references.begin(), m.references.end(), m.sequence) != m.references.end()) {
    return loss("manifest references are not ascending or include the checkpoint itself");
  }
  return m;
}

}  // namespace kvcache::checkpoint
