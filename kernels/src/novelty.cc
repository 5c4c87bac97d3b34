#include "kvcache/kernels/novelty.h"

#include <algorithm>
#include <utility>
#include <vector>

#include "cpu_kernels.h"
#include "cpu_math.h"
#include "validate.h"

namespace kvcache::kernels {

KernelStatus KeyNoveltyCpu(const void* keys, DType dtype, int64_t num_heads, int64_t num_tokens,
                           int64_t head_dim, float* novelty) {
  const KernelStatus status =
      internal::CheckNovelty(keys, dtype, num_heads, num_tokens, head_dim, novelty);
  if (status != KernelStatus::kOk) return status;
  if (num_heads == 0 || num_tokens == 0 || head_dim == 0) return KernelStatus::kOk;

  const internal::CpuKernels& k = internal::ActiveCpuKernels();
  const size_t row_bytes = static_cast<size_t>(head_dim) * DTypeSize(dtype);
  const char* base = static_cast<const char*>(keys);
  std::vector<float> rows(2 * static_cast<size_t>(head_dim));
  float* prev = rows.data();
  float* cur = prev + head_dim;

  std::fill(novelty, novelty + num_tokens, 0.0f);
  for (int64_t h = 0; h < num_heads; ++h) {
    const char* head = base + static_cast<size_t>(h * num_tokens) * row_bytes;
    k.convert(head, dtype, head_dim, DType::kFloat32, prev);
    float prev_norm2 = internal::Dot(prev, prev, head_dim);
    for (int64_t t = 1; t < num_tokens; ++t) {
      k.convert(head + static_cast<size_t>(t) * row_bytes, dtype, head_dim, DType::kFloat32, cur);
      const float cur_norm2 = internal::Dot(cur, cur, head_dim);
      const float dot = internal::Dot(prev, cur, head_dim);
      novelty[t] += internal::OneMinusCosine(dot, prev_norm2, cur_norm2);
      std::swap(prev, cur);
      prev_norm2 = cur_norm2;
    }
  }
  novelty[0] = 1.0f;
  const float heads = static_cast<float>(num_heads);
  for (int64_t t = 1; t < num_tokens; ++t) novelty[t] /= heads;
  return KernelStatus::kOk;
}

}  // namespace kvcache::kernels
