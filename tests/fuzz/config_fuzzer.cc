// Fuzz target: the daemon's configuration file (server/config/config.h),
// JSON in the proto3 mapping of kvcache.v1.ServerConfig.
//
// Input: the file's text. Properties: ParseConfigJson never crashes and
// fails only with INVALID_ARGUMENT; a config it accepts can be validated, and
// ConfigToJson (what --print-default-config and the start-up log print) reads
// back to the same config.
#include <string>
#include <string_view>

#include "google/protobuf/io/coded_stream.h"
#include "google/protobuf/io/zero_copy_stream_impl_lite.h"
#include "server/config/config.h"
#include "tests/fuzz/fuzz_check.h"

namespace {

// Deterministic bytes (map entries in key order), compared bit for bit so
// that a NaN equals itself.
std::string Bytes(const google::protobuf::Message& m) {
  std::string out;
  google::protobuf::io::StringOutputStream stream(&out);
  google::protobuf::io::CodedOutputStream coded(&stream);
  coded.SetSerializationDeterministic(true);
  m.SerializeToCodedStream(&coded);
  coded.Trim();
  return out;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  absl::StatusOr<kvcache::v1::ServerConfig> config = kvcache::ParseConfigJson(text);
  kvcache::IsLoopbackAddress(text);
  if (!config.ok()) {
    FUZZ_CHECK(config.status().code() == absl::StatusCode::kInvalidArgument);
    return 0;
  }
  const absl::Status valid = kvcache::ValidateConfig(*config);
  FUZZ_CHECK(valid.ok() || valid.code() == absl::StatusCode::kInvalidArgument);
  kvcache::IsLoopbackAddress(config->listen().tcp_address());
  const std::string json = kvcache::ConfigToJson(*config);
  absl::StatusOr<kvcache::v1::ServerConfig> again = kvcache::ParseConfigJson(json);
  if (!again.ok())
    std::fprintf(stderr, "%s\n%s\n", json.c_str(), again.status().ToString().c_str());
  FUZZ_CHECK(again.ok());
  FUZZ_CHECK(Bytes(*again) == Bytes(*config));
  return 0;
}
