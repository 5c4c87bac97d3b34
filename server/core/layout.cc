#include "server/core/layout.h"

#include <bit>

#include "absl/strings/str_cat.h"
#include "server/common/status_macros.h"

namespace kvcache {

size_t DTypeBytes(DType dtype) {
  switch (dtype) {
    case DType::kFp16:
    case DType::kBf16:
      return 2;
    case DType::kFp32:
      return 4;
  }
  return 0;
}

std::string_view DTypeName(DType dtype) {
  switch (dtype) {
    case DType::kFp16:
      return "fp16";
    case DType::kBf16:
      return "bf16";
    case DType::kFp32:
      return "fp32";
  }
  return "unknown";
}

namespace {

absl::Status CheckRange(std::string_view field, uint64_t value, uint64_t lo, uint64_t hi) {
  if (value < lo || value > hi) {
    return absl::InvalidArgumentError(absl::StrCat("layout.", std::string(field), " is ", value,
                                                   "; it must be in ", lo, "..", hi));
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status ModelLayout::Validate() const {
  KVCACHE_RETURN_IF_ERROR(CheckRange("num_layers", num_layers, 1, 1024));
  KVCACHE_RETURN_IF_ERROR(CheckRange("num_kv_heads", num_kv_heads, 1, 1024));
  KVCACHE_RETURN_IF_ERROR(CheckRange("head_dim", head_dim, 1, 4096));
  if (DTypeBytes(dtype) == 0) {
    return absl::InvalidArgumentError("layout.dtype must be fp16, bf16 or fp32");
  }
  if (auto s = CheckRange("block_tokens", block_tokens, kMinBlockTokens, kMaxBlockTokens);
      !s.ok()) {
    return s;
  }
  if (!std::has_single_bit(block_tokens)) {
    return absl::InvalidArgumentError(
        absl::StrCat("layout.block_tokens is ", block_tokens, "; it must be a power of two"));
  }
  return absl::OkStatus();
}

uint64_t ModelLayout::TokenBytes() const {
  return uint64_t{num_layers} * 2 * num_kv_heads * head_dim * DTypeBytes(dtype);
}

std::string ModelLayout::ToString() const {
  return absl::StrCat("layers=", num_layers, " kv_heads=", num_kv_heads, " head_dim=", head_dim,
                      " dtype=", std::string(DTypeName(dtype)), " block_tokens=", block_tokens);
}

absl::Status ValidateIdentifier(std::string_view field, std::string_view id) {
  if (id.empty() || id.size() > 128) {
    return absl::InvalidArgumentError(
        absl::StrCat(std::string(field), " must be 1..128 characters; got ", id.size()));
  }
  for (char c : id) {
    bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
              c == '.' || c == '_' || c == ':' || c == '/' || c == '-';
    if (!ok) {
      return absl::InvalidArgumentError(absl::StrCat(
          std::string(field), " may only contain [A-Za-z0-9._:/-]; got \"", std::string(id), "\""));
    }
  }
  return absl::OkStatus();
}

}  // namespace kvcache
