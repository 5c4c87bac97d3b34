#include "kvcache/kernels/quantize.h"

#include "cpu_kernels.h"
#include "validate.h"

namespace kvcache::kernels {

int64_t Int8ScaleCount(QuantAxis axis, int64_t num_heads, int64_t num_tokens, int64_t head_dim) {
  int64_t elements = 0;
  if (internal::CheckSlice(num_heads, num_tokens, head_dim, &elements) != KernelStatus::kOk) {
    return -1;
  }
  switch (axis) {
    case QuantAxis::kPerChannel:
      return num_heads * head_dim;
    case QuantAxis::kPerToken:
      return num_heads * num_tokens;
  }
  return -1;
}

KernelStatus QuantizeInt8Cpu(const void* src, DType src_dtype, int64_t num_heads,
                             int64_t num_tokens, int64_t head_dim, QuantAxis axis, int8_t* dst,
                             float* scales) {
  int64_t elements = 0;
  const KernelStatus status = internal::CheckQuantize(src, src_dtype, num_heads, num_tokens,
                                                      head_dim, axis, dst, scales, &elements);
  if (status != KernelStatus::kOk || elements == 0) return status;
  const internal::CpuKernels& k = internal::ActiveCpuKernels();
  if (axis == QuantAxis::kPerToken) {
    k.quantize_per_token(src, src_dtype, num_heads * num_tokens, head_dim, dst, scales);
  } else {
    k.quantize_per_channel(src, src_dtype, num_heads, num_tokens, head_dim, dst, scales);
  }
  return KernelStatus::kOk;
}

KernelStatus DequantizeInt8Cpu(const int8_t* src, const float* scales, int64_t num_heads,
                               int64_t num_tokens, int64_t head_dim, QuantAxis axis,
                               DType dst_dtype, void* dst) {
  int64_t elements = 0;
  const KernelStatus status = internal::CheckQuantize(dst, dst_dtype, num_heads, num_tokens,
                                                      head_dim, axis, src, scales, &elements);
  if (status != KernelStatus::kOk || elements == 0) return status;
  const internal::CpuKernels& k = internal::ActiveCpuKernels();
  if (axis == QuantAxis::kPerToken) {
    k.dequantize_per_token(src, scales, num_heads * num_tokens, head_dim, dst_dtype, dst);
  } else {
    k.dequantize_per_channel(src, scales, num_heads, num_tokens, head_dim, dst_dtype, dst);
  }
  return KernelStatus::kOk;
}

}  // namespace kvcache::kernels
