// The baseline instantiation of the cpu_*_impl.inc kernels (project flags: x86-64 SSE2 by default,
// the host's full instruction set when KVCACHE_KERNELS_NATIVE is on), plus the scalar
// conversions of convert.h, which share its bit-exact routines.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <type_traits>
#if defined(__SSE2__)
#include <immintrin.h>
#endif

#include "cpu_kernels.h"
#include "kvcache/kernels/convert.h"

namespace kvcache::kernels {
namespace internal {
namespace {
// The three parts depend on each other in this order.
// clang-format off
#include "cpu_convert_impl.inc"   // NOLINT(build/include)
#include "cpu_simd_impl.inc"      // NOLINT(build/include)
#include "cpu_quantize_impl.inc"  // NOLINT(build/include)
// clang-format on
}  // namespace

const CpuKernels& BaselineCpuKernels() {
#if defined(KVCACHE_KERNELS_NATIVE)
  static constexpr CpuKernels kKernels = MakeCpuKernels("native");
#else
  static constexpr CpuKernels kKernels = MakeCpuKernels("baseline");
#endif
  return kKernels;
}

}  // namespace internal

float HalfBitsToFloat(uint16_t bits) { return internal::HalfToFloat(bits); }
uint16_t FloatToHalfBits(float value) { return internal::FloatToHalf(value); }
float BFloat16BitsToFloat(uint16_t bits) { return internal::BFloat16ToFloat(bits); }
uint16_t FloatToBFloat16Bits(float value) { return internal::FloatToBFloat16(value); }

}  // namespace kvcache::kernels
