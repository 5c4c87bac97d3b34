#include "server/frontdoor/proto_convert.h"

#include <string>

#include "absl/strings/str_cat.h"
#include "server/common/status_macros.h"

namespace kvcache {

absl::StatusOr<ModelLayout> FromProto(const v1::ModelLayout& layout) {
  ModelLayout out;
  out.num_layers = layout.num_layers();
  out.num_kv_heads = layout.num_kv_heads();
  out.head_dim = layout.head_dim();
  out.block_tokens = layout.block_tokens();
  switch (layout.dtype()) {
    case v1::DTYPE_FP16:
      out.dtype = DType::kFp16;
      break;
    case v1::DTYPE_BF16:
      out.dtype = DType::kBf16;
      break;
    case v1::DTYPE_FP32:
      out.dtype = DType::kFp32;
      break;
    default:
      return absl::InvalidArgumentError(absl::StrCat(
          "layout.dtype is ", v1::DType_Name(layout.dtype()), " (",
          static_cast<int>(layout.dtype()), "); it must be DTYPE_FP16, DTYPE_BF16 or DTYPE_FP32"));
  }
  return out;
}

v1::ModelLayout ToProto(const ModelLayout& layout) {
  v1::ModelLayout out;
  out.set_num_layers(layout.num_layers);
  out.set_num_kv_heads(layout.num_kv_heads);
  out.set_head_dim(layout.head_dim);
  out.set_block_tokens(layout.block_tokens);
  switch (layout.dtype) {
    case DType::kFp16:
      out.set_dtype(v1::DTYPE_FP16);
      break;
    case DType::kBf16:
      out.set_dtype(v1::DTYPE_BF16);
      break;
    case DType::kFp32:
      out.set_dtype(v1::DTYPE_FP32);
      break;
  }
  return out;
}

absl::StatusOr<ModelKey> ToModelKey(std::string_view ns, std::string_view model_id) {
  ModelKey key{.ns = ns.empty() ? std::string(kDefaultNamespace) : std::string(ns),
               .model_id = std::string(model_id)};
  KVCACHE_RETURN_IF_ERROR(ValidateIdentifier("namespace", key.ns));
  KVCACHE_RETURN_IF_ERROR(ValidateIdentifier("model_id", key.model_id));
  return key;
}

AppendHints FromProto(const v1::AppendHints& hints) {
  AppendHints out;
  switch (hints.workload()) {
    case v1::WORKLOAD_KIND_CHAT:
      out.workload = WorkloadKind::kChat;
      break;
    case v1::WORKLOAD_KIND_CODE:
      out.workload = WorkloadKind::kCode;
      break;
    case v1::WORKLOAD_KIND_DOCUMENT:
      out.workload = WorkloadKind::kDocument;
      break;
    default:
      out.workload = WorkloadKind::kUnspecified;
  }
  out.priority = hints.priority();
  out.ttl = absl::Seconds(hints.ttl_seconds());
  for (const v1::TokenRange& r : hints.protected_ranges()) {
    out.protected_ranges.push_back({.begin = r.begin(), .end = r.end()});
  }
  return out;
}

v1::CompressionMode ToProto(CompressionMode mode) {
  switch (mode) {
    case CompressionMode::kOff:
      return v1::COMPRESSION_MODE_OFF;
    case CompressionMode::kQuantize:
      return v1::COMPRESSION_MODE_QUANTIZE;
    case CompressionMode::kPrune:
      return v1::COMPRESSION_MODE_PRUNE;
    case CompressionMode::kBudget:
      return v1::COMPRESSION_MODE_BUDGET;
  }
  return v1::COMPRESSION_MODE_UNSPECIFIED;
}

absl::StatusOr<std::optional<CompressionMode>> FromProto(v1::CompressionMode mode) {
  switch (mode) {
    case v1::COMPRESSION_MODE_UNSPECIFIED:
      return std::optional<CompressionMode>();
    case v1::COMPRESSION_MODE_OFF:
      return CompressionMode::kOff;
    case v1::COMPRESSION_MODE_QUANTIZE:
      return CompressionMode::kQuantize;
    case v1::COMPRESSION_MODE_PRUNE:
      return CompressionMode::kPrune;
    case v1::COMPRESSION_MODE_BUDGET:
      return CompressionMode::kBudget;
    default:
      return absl::InvalidArgumentError(
          absl::StrCat("mode ", static_cast<int>(mode), " is not a CompressionMode"));
  }
}

v1::ModelPolicy ToProto(const ImportancePolicy& policy) {
  v1::ModelPolicy out;
  out.set_mode(ToProto(policy.mode));
  out.mutable_weights()->set_alpha(policy.params.alpha);
  out.mutable_weights()->set_beta(policy.params.beta);
  out.mutable_weights()->set_gamma(policy.params.gamma);
  out.set_target_mass(policy.target_mass);
  out.set_target_bytes(policy.target_bytes);
  out.set_sink_tokens(static_cast<uint32_t>(policy.params.sink_tokens));
  out.set_recent_window(static_cast<uint32_t>(policy.params.recent_window));
  return out;
}

}  // namespace kvcache
