#include "validate.h"

#include <cmath>

namespace kvcache::kernels::internal {
namespace {

constexpr KernelStatus kInvalid = KernelStatus::kInvalidArgument;

bool ValidDim(int64_t n) { return n >= 0 && n <= kMaxDimension; }

// Product of non-negative factors, or -1 if it exceeds 2^60 (so that bytes of any dtype and
// sums of a few such counts cannot overflow int64).
int64_t BoundedProduct(int64_t a, int64_t b) {
  constexpr int64_t kLimit = int64_t{1} << 60;
  if (a < 0 || b < 0) return -1;
  if (a != 0 && b > kLimit / a) return -1;
  return a * b;
}

}  // namespace

bool IsFloatDType(DType dtype) {
  return dtype == DType::kFloat32 || dtype == DType::kFloat16 || dtype == DType::kBFloat16;
}

KernelStatus CheckSlice(int64_t num_heads, int64_t num_tokens, int64_t head_dim,
                        int64_t* elements) {
  if (!ValidDim(num_heads) || !ValidDim(num_tokens) || !ValidDim(head_dim)) return kInvalid;
  const int64_t n = BoundedProduct(BoundedProduct(num_heads, num_tokens), head_dim);
  if (n < 0) return kInvalid;
  *elements = n;
  return KernelStatus::kOk;
}

KernelStatus CheckQuantize(const void* data, DType dtype, int64_t num_heads, int64_t num_tokens,
                           int64_t head_dim, QuantAxis axis, const void* codes, const void* scales,
                           int64_t* elements) {
  if (!IsFloatDType(dtype)) return kInvalid;
  if (axis != QuantAxis::kPerChannel && axis != QuantAxis::kPerToken) return kInvalid;
  const KernelStatus s = CheckSlice(num_heads, num_tokens, head_dim, elements);
  if (s != KernelStatus::kOk) return s;
  if (*elements > 0 && (data == nullptr || codes == nullptr || scales == nullptr)) {
    return kInvalid;
  }
  return KernelStatus::kOk;
}

KernelStatus CheckNovelty(const void* keys, DType dtype, int64_t num_heads, int64_t num_tokens,
                          int64_t head_dim, const float* novelty) {
  if (!IsFloatDType(dtype)) return kInvalid;
  int64_t elements = 0;
  const KernelStatus s = CheckSlice(num_heads, num_tokens, head_dim, &elements);
  if (s != KernelStatus::kOk) return s;
  if (elements > 0 && (keys == nullptr || novelty == nullptr)) return kInvalid;
  return KernelStatus::kOk;
}

KernelStatus CheckImportance(int64_t num_tokens, const ImportanceParams& params,
                             const float* scores) {
  if (!ValidDim(num_tokens) || !params.Valid()) return kInvalid;
  if (num_tokens > 0 && scores == nullptr) return kInvalid;
  return KernelStatus::kOk;
}

KernelStatus CheckGather(const void* src, DType dtype, int64_t num_heads, int64_t num_tokens,
                         int64_t head_dim, const int32_t* kept, int64_t num_kept, const void* dst) {
  if (DTypeSize(dtype) == 0) return kInvalid;
  int64_t elements = 0;
  KernelStatus s = CheckSlice(num_heads, num_tokens, head_dim, &elements);
  if (s != KernelStatus::kOk) return s;
  if (num_kept < 0 || num_kept > num_tokens) return kInvalid;
  int64_t out_elements = 0;
  s = CheckSlice(num_heads, num_kept, head_dim, &out_elements);
  if (s != KernelStatus::kOk) return s;
  if (num_kept > 0 && kept == nullptr) return kInvalid;
  if (out_elements > 0 && (src == nullptr || dst == nullptr)) return kInvalid;
  return KernelStatus::kOk;
}

KernelStatus CheckAttention(const float* q, const float* k, const float* v, int64_t num_queries,
                            int64_t num_keys, int64_t head_dim, const float* out) {
  if (!ValidDim(num_queries) || !ValidDim(num_keys) || !ValidDim(head_dim)) return kInvalid;
  if (num_queries == 0) return KernelStatus::kOk;
  if (num_keys == 0 || head_dim == 0) return kInvalid;
  if (BoundedProduct(num_queries, num_keys) < 0 || BoundedProduct(num_queries, head_dim) < 0 ||
      BoundedProduct(num_keys, head_dim) < 0) {
    return kInvalid;
  }
  if (q == nullptr || k == nullptr || v == nullptr || out == nullptr) return kInvalid;
  return KernelStatus::kOk;
}

}  // namespace kvcache::kernels::internal
