// The AVX2 + F16C instantiation of the cpu_*_impl.inc kernels. CMake compiles only this file with
// -mavx2 -mf16c; it is called only after CpuHasAvx2F16c() said yes (cpu_dispatch.cc).
#if !defined(__AVX2__) || !defined(__F16C__)
#error "cpu_kernels_avx2.cc must be compiled with -mavx2 -mf16c"
#endif

#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <type_traits>

#include "cpu_kernels.h"

namespace kvcache::kernels::internal {
namespace {
// The three parts depend on each other in this order.
// clang-format off
#include "cpu_convert_impl.inc"   // NOLINT(build/include)
#include "cpu_simd_impl.inc"      // NOLINT(build/include)
#include "cpu_quantize_impl.inc"  // NOLINT(build/include)
// clang-format on
}  // namespace

const CpuKernels* Avx2CpuKernels() {
  static constexpr CpuKernels kKernels = MakeCpuKernels("avx2-f16c");
  return &kKernels;
}

}  // namespace kvcache::kernels::internal
