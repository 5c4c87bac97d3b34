// The AVX2 + F16C instantiation of the cpu_*_impl.inc kernels. CMake compiles only this file with
// -mavx2 -mf16c; it is called only after CpuHasAvx2F16c() said yes (cpu_dispatch.cc).
//
// It also holds the AVX-512 variant (cpu_quantize_avx512_impl.inc, quantize and dequantize; the
// rest of that table is the AVX2 code): its functions are compiled for AVX-512 F/BW/VL by a
// target region below, not by command-line flags, and are called only after CpuHasAvx512()
// said yes.
#if !defined(__AVX2__) || !defined(__F16C__)
#error "cpu_kernels_avx2.cc must be compiled with -mavx2 -mf16c"
#endif

#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
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

// Every function defined between the push and the pop may use AVX-512 F/BW/VL (and calls the
// AVX2 functions above, a subset, which may be inlined into it).
#if defined(__clang__)
#pragma clang attribute push(__attribute__((target("avx512f,avx512bw,avx512vl,avx512dq"))), \
                             apply_to = function)
#else
#pragma GCC push_options
#pragma GCC target("avx512f,avx512bw,avx512vl,avx512dq")
// GCC 12 reports its own _mm512_undefined_*() placeholders (avx512fintrin.h) as uninitialized
// once they are inlined here (GCC bug 105593).
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif
namespace {
namespace avx512 {
// clang-format off
#include "cpu_quantize_avx512_impl.inc"  // NOLINT(build/include)
// clang-format on
}  // namespace avx512
}  // namespace
#if defined(__clang__)
#pragma clang attribute pop
#else
#pragma GCC diagnostic pop
#pragma GCC pop_options
#endif

const CpuKernels* Avx512CpuKernels() {
  static constexpr CpuKernels kKernels{"avx512",
                                       &Convert,
                                       &avx512::QuantizePerToken,
                                       &avx512::DequantizePerToken,
                                       &avx512::QuantizePerChannel,
                                       &avx512::DequantizePerChannel};
  return &kKernels;
}

}  // namespace kvcache::kernels::internal
