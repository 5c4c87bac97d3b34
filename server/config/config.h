// Server configuration: one validated kvcache.v1.ServerConfig value.
//
// Built once at start-up: the embedded defaults, overlaid by a JSON file
// (proto3 JSON mapping) if given, overlaid by command-line flags; then
// Validate()d and logged. Nothing else in the daemon reads files, flags or
// the environment for settings. docs/configuration.md describes every field.
#ifndef KVCACHE_SERVER_CONFIG_CONFIG_H_
#define KVCACHE_SERVER_CONFIG_CONFIG_H_

#include <string>
#include <string_view>

#include "absl/status/statusor.h"
#include "kvcache/v1/config.pb.h"

namespace kvcache {

// Listener value that switches a listener off.
inline constexpr std::string_view kDisabled = "none";

// Room limits.fetch_chunk_bytes must leave under limits.max_message_bytes
// for a fetch message's fields other than its data: the fixed fields (7
// tags and varints of at most 10 bytes, the data's tag and length: under 96
// bytes) and, on a pruned block's first chunk, kept_tokens (a tag and a
// length, under 16 bytes, then up to kMaxFetchKeptTokens varints of at most
// 5 bytes).
inline constexpr uint64_t kMaxFetchKeptTokens = 1024;  // the largest block_tokens
inline constexpr uint64_t kFetchHeaderRoom = 96 + 16 + 5 * kMaxFetchKeptTokens;

// Longest lease a worker may ask for (limits.max_lease_ttl_ms): 24 hours.
inline constexpr uint64_t kMaxLeaseTtlMs = uint64_t{24} * 3600 * 1000;

// Calibration samples the daemon keeps per model (a fixed reservoir);
// importance.calibration_min_samples may not ask for more.
inline constexpr uint32_t kCalibrationSamples = 8192;

// The embedded default configuration: every field set to its default.
v1::ServerConfig DefaultConfig();

// Fills every unset (zero or empty) field of `config` with its default.
void ApplyDefaults(v1::ServerConfig* config);

// Parses JSON text into a config (unknown fields are errors), then applies
// defaults. INVALID_ARGUMENT naming the problem.
absl::StatusOr<v1::ServerConfig> ParseConfigJson(std::string_view json);

// Reads and parses a JSON file. NOT_FOUND / INVALID_ARGUMENT with the path.
absl::StatusOr<v1::ServerConfig> LoadConfigFile(const std::string& path);

// INVALID_ARGUMENT naming the field, its value and the allowed range.
// REQUIRES: defaults applied.
absl::Status ValidateConfig(const v1::ServerConfig& config);

// Whether HOST:PORT (or [HOST]:PORT) names this host only: localhost,
// 127.0.0.0/8 or ::1. Anything else, 0.0.0.0 and host names included, can be
// reachable from other hosts.
bool IsLoopbackAddress(std::string_view address);

// Where the daemon's secret lives (security.secret_file, else
// "<checkpoint.dir>.secret" with trailing slashes dropped), or empty for a
// secret random per process (no checkpoints, no file).
std::string SecretFilePath(const v1::ServerConfig& config);

// security.tenant_limits.max_share as it applies: the value when set, else
// 0.5 with a principals file (which a flag may set after the defaults) and 1
// (no share) without one.
double TenantShare(const v1::SecurityConfig& security);

// Multi-line JSON with every field, for logs and --print-default-config.
std::string ConfigToJson(const v1::ServerConfig& config);

}  // namespace kvcache

#endif  // KVCACHE_SERVER_CONFIG_CONFIG_H_
