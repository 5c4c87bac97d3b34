#include "server/core/importance_policy.h"

#include <cmath>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "kvcache/kernels/novelty.h"

namespace kvcache {

std::string_view CompressionModeName(CompressionMode mode) {
  switch (mode) {
    case CompressionMode::kOff:
      return "off";
    case CompressionMode::kQuantize:
      return "quantize";
    case CompressionMode::kPrune:
      return "prune";
    case CompressionMode::kBudget:
      return "budget";
  }
  return "unknown";
}

std::optional<CompressionMode> ParseCompressionMode(std::string_view name) {
  for (CompressionMode m : {CompressionMode::kOff, CompressionMode::kQuantize,
                            CompressionMode::kPrune, CompressionMode::kBudget}) {
    if (name == CompressionModeName(m)) return m;
  }
  return std::nullopt;
}

absl::Status ImportancePolicy::Validate() const {
  // Each weight is a share of the score (docs/api.md): in [0, 1].
  for (auto [field, w] : {std::pair<std::string_view, float>{"weights.alpha", params.alpha},
                          {"weights.beta", params.beta},
                          {"weights.gamma", params.gamma}}) {
    if (!std::isfinite(w) || w < 0 || w > 1) {
      return absl::InvalidArgumentError(
          absl::StrCat(std::string(field), " is ", w, "; it must be in [0, 1]"));
    }
  }
  if (!params.Valid()) {
    return absl::InvalidArgumentError(
        "importance weights must be finite and >= 0, sink_tokens and recent_window >= 0, "
        "decay_tau > 0");
  }
  if (params.alpha + params.beta + params.gamma <= 0) {
    return absl::InvalidArgumentError("importance weights alpha, beta, gamma are all 0");
  }
  if (!(target_mass > 0 && target_mass <= 1)) {
    return absl::InvalidArgumentError(
        absl::StrCat("target_mass ", target_mass, " is outside (0, 1]"));
  }
  if (!(target_bytes > 0 && target_bytes <= 1)) {
    return absl::InvalidArgumentError(
        absl::StrCat("target_bytes ", target_bytes, " is outside (0, 1]"));
  }
  return absl::OkStatus();
}

kernels::DType ToKernelDType(DType dtype) {
  switch (dtype) {
    case DType::kFp16:
      return kernels::DType::kFloat16;
    case DType::kBf16:
      return kernels::DType::kBFloat16;
    case DType::kFp32:
      return kernels::DType::kFloat32;
  }
  return kernels::DType::kFloat32;
}

importance::BlockShape ToBlockShape(const ModelLayout& layout) {
  return {.num_layers = layout.num_layers,
          .num_kv_heads = layout.num_kv_heads,
          .head_dim = layout.head_dim,
          .block_tokens = layout.block_tokens,
          .dtype = static_cast<uint32_t>(layout.dtype)};
}

std::vector<float> BlockKeyNovelty(const ModelLayout& layout, std::span<const std::byte> raw,
                                   const std::vector<uint32_t>& layers) {
  const uint32_t bt = layout.block_tokens;
  if (layers.empty() || raw.size() != layout.BlockBytes()) return {};
  const uint64_t slice_bytes =
      uint64_t{layout.num_kv_heads} * bt * layout.head_dim * DTypeBytes(layout.dtype);
  std::vector<float> sum(bt, 0.0f);
  std::vector<float> one(bt);
  for (uint32_t layer : layers) {
    if (layer >= layout.num_layers) return {};
    const std::byte* keys = raw.data() + uint64_t{layer} * 2 * slice_bytes;  // K of `layer`
    if (kernels::KeyNoveltyCpu(keys, ToKernelDType(layout.dtype), layout.num_kv_heads, bt,
                               layout.head_dim, one.data()) != kernels::KernelStatus::kOk) {
      return {};
    }
    for (uint32_t t = 0; t < bt; ++t) sum[t] += one[t];
  }
  for (float& v : sum) v /= static_cast<float>(layers.size());
  return sum;
}

std::vector<uint32_t> NoveltyLayers(const std::vector<uint32_t>& configured, uint32_t num_layers) {
  std::vector<uint32_t> layers;
  for (uint32_t l : configured) {
    if (l < num_layers) layers.push_back(l);
  }
  if (!layers.empty()) return layers;
  if (num_layers <= 4) {
    for (uint32_t l = 0; l < num_layers; ++l) layers.push_back(l);
  } else {
    for (uint32_t i = 0; i < 4; ++i) layers.push_back((2 * i + 1) * num_layers / 8);
  }
  return layers;
}

}  // namespace kvcache
