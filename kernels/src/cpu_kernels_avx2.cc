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

// bf16 dequantization with AVX512_BF16 (vcvtne2ps2bf16), defined after the AVX-512 region
// with their own target; called by it only when CpuHasAvx512Bf16().
#define KVCACHE_KERNELS_AVX512_BF16 \
  __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx512bf16")))
namespace {
namespace avx512 {
KVCACHE_KERNELS_AVX512_BF16 void DequantizePerTokenBf16(const int8_t* src, const float* scales,
                                                        int64_t rows, int64_t cols, uint16_t* dst);
KVCACHE_KERNELS_AVX512_BF16 void DequantizePerChannelBf16(const int8_t* src, const float* scales,
                                                          int64_t mats, int64_t rows, int64_t cols,
                                                          uint16_t* dst);
}  // namespace avx512
}  // namespace

// Every function defined between the push and the pop may use AVX-512 F/BW/VL/DQ (and calls the
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

namespace {
namespace avx512 {

// vcvtne2ps2bf16 rounds to nearest even like FloatToBFloat16 but treats subnormal inputs and
// results as zero. The products q * s are never subnormal when s is 0 or a normal number (|q| >= 1
// or q == 0), and not NaN when s is finite, so for such scales it is exact; any other scale takes
// DequantizeRow.
KVCACHE_KERNELS_AVX512_BF16 inline bool ExactForBf16Instruction(const float* scales, int64_t n) {
  const __m512i magnitude = _mm512_set1_epi32(0x7FFFFFFF);
  const __m512i min_normal = _mm512_set1_epi32(0x00800000);
  const __m512i inf = _mm512_set1_epi32(0x7F800000);
  __mmask16 bad = 0;
  for (int64_t j = 0; j < n; j += 16) {
    const __mmask16 k = static_cast<__mmask16>(FirstLanes(n - j));
    const __m512i m = _mm512_and_si512(_mm512_maskz_loadu_epi32(k, scales + j), magnitude);
    const __mmask16 subnormal = _mm512_mask_cmplt_epi32_mask(_mm512_test_epi32_mask(m, m), m,
                                                             min_normal);  // 0 < m < min normal
    bad |= subnormal | _mm512_mask_cmpge_epi32_mask(k, m, inf);            // Inf or NaN
  }
  return bad == 0;
}

// 32 bf16 results of 32 products; p0 gives the low 16.
KVCACHE_KERNELS_AVX512_BF16 inline __m512i ToBFloat16(__m512 p0, __m512 p1) {
  return reinterpret_cast<__m512i>(_mm512_cvtne2ps_pbh(p1, p0));
}

template <bool kVector>
KVCACHE_KERNELS_AVX512_BF16 inline void DequantizeRowBf16(const int8_t* __restrict q,
                                                          const float* __restrict scale, int64_t n,
                                                          uint16_t* __restrict x) {
  const __m512 uniform = _mm512_set1_ps(scale[0]);
  int64_t j = 0;
  for (; j + 32 <= n; j += 32) {
    const __m512 s0 = kVector ? _mm512_loadu_ps(scale + j) : uniform;
    const __m512 s1 = kVector ? _mm512_loadu_ps(scale + j + 16) : uniform;
    _mm512_storeu_si512(x + j, ToBFloat16(_mm512_mul_ps(CodesToFloats(q + j), s0),
                                          _mm512_mul_ps(CodesToFloats(q + j + 16), s1)));
  }
  if (j < n) {
    const __mmask64 k = FirstLanes(n - j);
    const __mmask16 k0 = static_cast<__mmask16>(k), k1 = static_cast<__mmask16>(k >> 16);
    const __m512 s0 = kVector ? _mm512_maskz_loadu_ps(k0, scale + j) : uniform;
    const __m512 s1 = kVector ? _mm512_maskz_loadu_ps(k1, scale + j + 16) : uniform;
    _mm512_mask_storeu_epi16(x + j, static_cast<__mmask32>(k),
                             ToBFloat16(_mm512_mul_ps(CodesToFloats(q + j, k0), s0),
                                        _mm512_mul_ps(CodesToFloats(q + j + 16, k1), s1)));
  }
}

KVCACHE_KERNELS_AVX512_BF16 void DequantizePerTokenBf16(const int8_t* src, const float* scales,
                                                        int64_t rows, int64_t cols, uint16_t* dst) {
  const bool all_exact = ExactForBf16Instruction(scales, rows);
  for (int64_t r = 0; r < rows; ++r) {
    if (all_exact || ExactForBf16Instruction(scales + r, 1)) {
      DequantizeRowBf16<false>(src + r * cols, scales + r, cols, dst + r * cols);
    } else {
      DequantizeRow<DType::kBFloat16, false>(src + r * cols, scales + r, cols,
                                             AllFinite(scales + r, 1), dst + r * cols);
    }
  }
}

KVCACHE_KERNELS_AVX512_BF16 void DequantizePerChannelBf16(const int8_t* src, const float* scales,
                                                          int64_t mats, int64_t rows, int64_t cols,
                                                          uint16_t* dst) {
  for (int64_t m = 0; m < mats; ++m) {
    const float* s = scales + m * cols;
    const bool exact = ExactForBf16Instruction(s, cols);
    const bool finite = AllFinite(s, cols);
    for (int64_t r = 0; r < rows; ++r) {
      const int64_t at = (m * rows + r) * cols;
      if (exact) {
        DequantizeRowBf16<true>(src + at, s, cols, dst + at);
      } else {
        DequantizeRow<DType::kBFloat16, true>(src + at, s, cols, finite, dst + at);
      }
    }
  }
}

}  // namespace avx512
}  // namespace

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
