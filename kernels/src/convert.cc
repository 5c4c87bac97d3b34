#include "kvcache/kernels/convert.h"

#include "cpu_kernels.h"
#include "validate.h"

namespace kvcache::kernels {

KernelStatus ConvertCpu(const void* src, DType src_dtype, int64_t count, DType dst_dtype,
                        void* dst) {
  if (!internal::IsFloatDType(src_dtype) || !internal::IsFloatDType(dst_dtype) || count < 0 ||
      count > (int64_t{1} << 60)) {
    return KernelStatus::kInvalidArgument;
  }
  if (count == 0) return KernelStatus::kOk;
  if (src == nullptr || dst == nullptr) return KernelStatus::kInvalidArgument;
  internal::ActiveCpuKernels().convert(src, src_dtype, count, dst_dtype, dst);
  return KernelStatus::kOk;
}

}  // namespace kvcache::kernels
