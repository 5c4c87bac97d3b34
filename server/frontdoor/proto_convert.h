// Translation between kvcache.v1 messages and core types. No cache logic.
#ifndef KVCACHE_SERVER_FRONTDOOR_PROTO_CONVERT_H_
#define KVCACHE_SERVER_FRONTDOOR_PROTO_CONVERT_H_

#include <optional>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "google/protobuf/repeated_field.h"
#include "kvcache/v1/admin.pb.h"
#include "kvcache/v1/kvcache.pb.h"
#include "server/core/cache.h"
#include "server/core/importance_policy.h"
#include "server/core/layout.h"

namespace kvcache {

// INVALID_ARGUMENT for an unspecified or unknown dtype; ranges are checked by
// ModelLayout::Validate().
absl::StatusOr<ModelLayout> FromProto(const v1::ModelLayout& layout);
v1::ModelLayout ToProto(const ModelLayout& layout);

// Validates the namespace (empty: "default") and model id.
absl::StatusOr<ModelKey> ToModelKey(std::string_view ns, std::string_view model_id);

AppendHints FromProto(const v1::AppendHints& hints);

v1::CompressionMode ToProto(CompressionMode mode);
// nullopt for UNSPECIFIED; INVALID_ARGUMENT for an unknown value.
absl::StatusOr<std::optional<CompressionMode>> FromProto(v1::CompressionMode mode);
v1::ModelPolicy ToProto(const ImportancePolicy& policy);

inline std::span<const Token> TokensOf(const google::protobuf::RepeatedField<uint32_t>& tokens) {
  return {tokens.data(), static_cast<size_t>(tokens.size())};
}

}  // namespace kvcache

#endif  // KVCACHE_SERVER_FRONTDOOR_PROTO_CONVERT_H_
