#include "server/config/config.h"

#include <bit>
#include <fstream>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "google/protobuf/util/json_util.h"

namespace kvcache {
namespace {

absl::Status CheckRange(std::string_view field, uint64_t value, uint64_t lo, uint64_t hi) {
  if (value < lo || value > hi) {
    return absl::InvalidArgumentError(
        absl::StrCat(std::string(field), " is ", value, "; it must be in ", lo, "..", hi));
  }
  return absl::OkStatus();
}

}  // namespace

void ApplyDefaults(v1::ServerConfig* c) {
  v1::ListenConfig* listen = c->mutable_listen();
  if (listen->tcp_address().empty()) listen->set_tcp_address("0.0.0.0:50051");
  if (listen->unix_socket().empty()) listen->set_unix_socket("/tmp/kvcached.sock");
  if (listen->metrics_address().empty()) listen->set_metrics_address("0.0.0.0:9464");

  v1::LimitsConfig* limits = c->mutable_limits();
  if (limits->max_message_bytes() == 0) limits->set_max_message_bytes(uint64_t{64} << 20);
  if (limits->max_tokens_per_request() == 0) limits->set_max_tokens_per_request(1 << 20);
  if (limits->max_concurrent_streams() == 0) limits->set_max_concurrent_streams(256);
  if (limits->fetch_chunk_bytes() == 0) limits->set_fetch_chunk_bytes(1 << 20);
  if (limits->default_lease_ttl_ms() == 0) limits->set_default_lease_ttl_ms(30000);
  if (limits->max_lease_ttl_ms() == 0) limits->set_max_lease_ttl_ms(600000);
  if (limits->max_models() == 0) limits->set_max_models(1024);

  v1::HostTierConfig* host = c->mutable_host_tier();
  if (host->capacity_bytes() == 0) host->set_capacity_bytes(uint64_t{1} << 30);
  if (host->slab_bytes() == 0) host->set_slab_bytes(uint64_t{4} << 20);

  if (c->logging().level().empty()) c->mutable_logging()->set_level("info");
  if (c->drain_timeout_seconds() == 0) c->set_drain_timeout_seconds(10);
}

v1::ServerConfig DefaultConfig() {
  v1::ServerConfig config;
  ApplyDefaults(&config);
  return config;
}

absl::StatusOr<v1::ServerConfig> ParseConfigJson(std::string_view json) {
  v1::ServerConfig config;
  google::protobuf::util::JsonParseOptions options;
  options.ignore_unknown_fields = false;
  auto status = google::protobuf::util::JsonStringToMessage(
      google::protobuf::StringPiece(json.data(), json.size()), &config, options);
  if (!status.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("config: ", status.message().as_string()));
  }
  ApplyDefaults(&config);
  return config;
}

absl::StatusOr<v1::ServerConfig> LoadConfigFile(const std::string& path) {
  std::ifstream in(path);
  if (!in) return absl::NotFoundError(absl::StrCat("config file ", path, " cannot be read"));
  std::stringstream text;
  text << in.rdbuf();
  auto config = ParseConfigJson(text.str());
  if (!config.ok()) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": ", config.status().message()));
  }
  return config;
}

absl::Status ValidateConfig(const v1::ServerConfig& c) {
  const v1::LimitsConfig& l = c.limits();
  if (auto s =
          CheckRange("limits.max_message_bytes", l.max_message_bytes(), 1 << 16, uint64_t{1} << 30);
      !s.ok()) {
    return s;
  }
  if (auto s = CheckRange("limits.max_tokens_per_request", l.max_tokens_per_request(), 16,
                          uint64_t{1} << 24);
      !s.ok()) {
    return s;
  }
  if (auto s = CheckRange("limits.max_concurrent_streams", l.max_concurrent_streams(), 1, 100000);
      !s.ok()) {
    return s;
  }
  // A fetch chunk plus its header must fit one message.
  if (auto s = CheckRange("limits.fetch_chunk_bytes", l.fetch_chunk_bytes(), 4096,
                          l.max_message_bytes() - 1024);
      !s.ok()) {
    return s;
  }
  if (auto s = CheckRange("limits.default_lease_ttl_ms", l.default_lease_ttl_ms(), 1,
                          l.max_lease_ttl_ms());
      !s.ok()) {
    return s;
  }
  if (auto s = CheckRange("limits.max_models", l.max_models(), 1, 1 << 20); !s.ok()) return s;

  const v1::HostTierConfig& h = c.host_tier();
  if (auto s = CheckRange("host_tier.slab_bytes", h.slab_bytes(), 64 << 10, uint64_t{1} << 30);
      !s.ok()) {
    return s;
  }
  if (!std::has_single_bit(h.slab_bytes())) {
    return absl::InvalidArgumentError(
        absl::StrCat("host_tier.slab_bytes is ", h.slab_bytes(), "; it must be a power of two"));
  }
  if (auto s = CheckRange("host_tier.capacity_bytes", h.capacity_bytes(), h.slab_bytes(),
                          uint64_t{1} << 50);
      !s.ok()) {
    return s;
  }
  const std::string& level = c.logging().level();
  if (level != "trace" && level != "debug" && level != "info" && level != "warn" &&
      level != "error") {
    return absl::InvalidArgumentError(absl::StrCat(
        "logging.level is \"", level, "\"; it must be trace, debug, info, warn or error"));
  }
  const v1::ListenConfig& listen = c.listen();
  if (listen.tcp_address() == kDisabled && listen.unix_socket() == kDisabled) {
    return absl::InvalidArgumentError(
        "listen.tcp_address and listen.unix_socket are both \"none\"; enable at least one");
  }
  if (auto s = CheckRange("drain_timeout_seconds", c.drain_timeout_seconds(), 1, 3600); !s.ok()) {
    return s;
  }
  return absl::OkStatus();
}

std::string ConfigToJson(const v1::ServerConfig& config) {
  std::string out;
  google::protobuf::util::JsonPrintOptions options;
  options.add_whitespace = true;
  options.always_print_primitive_fields = true;
  options.preserve_proto_field_names = true;
  (void)google::protobuf::util::MessageToJsonString(config, &out, options);
  return out;
}

}  // namespace kvcache
