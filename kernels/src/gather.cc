#include "kvcache/kernels/gather.h"

#include <cstring>

#include "validate.h"

namespace kvcache::kernels {

KernelStatus GatherTokensCpu(const void* src, DType dtype, int64_t num_heads, int64_t num_tokens,
                             int64_t head_dim, const int32_t* kept, int64_t num_kept, void* dst) {
  const KernelStatus status =
      internal::CheckGather(src, dtype, num_heads, num_tokens, head_dim, kept, num_kept, dst);
  if (status != KernelStatus::kOk) return status;
  for (int64_t i = 0; i < num_kept; ++i) {
    if (kept[i] < 0 || kept[i] >= num_tokens || (i > 0 && kept[i] <= kept[i - 1])) {
      return KernelStatus::kInvalidArgument;
    }
  }
  if (num_heads == 0 || num_kept == 0 || head_dim == 0) return KernelStatus::kOk;

  const size_t row_bytes = static_cast<size_t>(head_dim) * DTypeSize(dtype);
  const char* s = static_cast<const char*>(src);
  char* d = static_cast<char*>(dst);
  for (int64_t h = 0; h < num_heads; ++h) {
    const char* head_src = s + static_cast<size_t>(h * num_tokens) * row_bytes;
    char* head_dst = d + static_cast<size_t>(h * num_kept) * row_bytes;
    // Copy each run of consecutive kept indices with one memcpy.
    int64_t i = 0;
    while (i < num_kept) {
      int64_t j = i + 1;
      while (j < num_kept && kept[j] == kept[j - 1] + 1) ++j;
      std::memcpy(head_dst + static_cast<size_t>(i) * row_bytes,
                  head_src + static_cast<size_t>(kept[i]) * row_bytes,
                  static_cast<size_t>(j - i) * row_bytes);
      i = j;
    }
  }
  return KernelStatus::kOk;
}

}  // namespace kvcache::kernels
