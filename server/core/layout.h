// ModelLayout: the shape of one model's KV cache and the byte layout of a block.
//
// One block holds `block_tokens` consecutive tokens of every layer, laid out as
//   [layer][kv (K=0, V=1)][kv_head][token][head_dim]
// of densely packed little-endian `dtype` elements (docs/api.md). A layout is a
// plain value; Validate() says which field is out of range.
#ifndef KVCACHE_SERVER_CORE_LAYOUT_H_
#define KVCACHE_SERVER_CORE_LAYOUT_H_

#include <cstdint>
#include <string>
#include <string_view>

#include "absl/status/status.h"

namespace kvcache {

using Token = uint32_t;

enum class DType : uint8_t { kFp16 = 1, kBf16 = 2, kFp32 = 3 };

// Bytes of one element of `dtype`.
size_t DTypeBytes(DType dtype);
std::string_view DTypeName(DType dtype);

inline constexpr uint32_t kDefaultBlockTokens = 64;
inline constexpr uint32_t kMinBlockTokens = 16;
inline constexpr uint32_t kMaxBlockTokens = 1024;

struct ModelLayout {
  uint32_t num_layers = 0;
  uint32_t num_kv_heads = 0;
  uint32_t head_dim = 0;
  DType dtype = DType::kFp16;
  uint32_t block_tokens = kDefaultBlockTokens;

  // OK when every field is in range (see kvcache.proto); otherwise
  // INVALID_ARGUMENT naming the field, its value and the allowed range.
  absl::Status Validate() const;

  // Bytes of KV of one token across all layers (K and V). REQUIRES: Validate().
  uint64_t TokenBytes() const;
  // Bytes of one block. REQUIRES: Validate().
  uint64_t BlockBytes() const { return TokenBytes() * block_tokens; }

  std::string ToString() const;
  friend bool operator==(const ModelLayout&, const ModelLayout&) = default;
};

// Where a model lives: tenants get their own namespace, so equal model ids in
// different namespaces never share blocks.
struct ModelKey {
  std::string ns;
  std::string model_id;

  std::string ToString() const { return ns + "/" + model_id; }
  friend bool operator==(const ModelKey&, const ModelKey&) = default;
  friend auto operator<=>(const ModelKey&, const ModelKey&) = default;
  template <typename H>
  friend H AbslHashValue(H h, const ModelKey& k) {
    return H::combine(std::move(h), k.ns, k.model_id);
  }
};

inline constexpr std::string_view kDefaultNamespace = "default";

// OK when `id` is 1..128 chars of [A-Za-z0-9._:/-]; `field` names it in the error.
absl::Status ValidateIdentifier(std::string_view field, std::string_view id);

}  // namespace kvcache

#endif  // KVCACHE_SERVER_CORE_LAYOUT_H_
