// Internal: the CPU kernels that profit from wider SIMD, compiled once per instruction set and
// chosen at run time (function multiversioning by translation unit).
//
// cpu_convert_impl.inc, cpu_simd_impl.inc and cpu_quantize_impl.inc hold the implementations:
// simple loops over contiguous memory that GCC and Clang auto-vectorize, plus SSE2 / AVX2
// intrinsics where the compiler's code is poor. They are compiled into internal linkage twice:
//   * cpu_kernels_baseline.cc with the project's flags (x86-64 baseline SSE2, or -march=native
//     when KVCACHE_KERNELS_NATIVE is on);
//   * cpu_kernels_avx2.cc with -mavx2 -mf16c (x86-64 GCC/Clang only, when NATIVE is off),
//     which also switches fp16 conversion to the F16C instructions, and with its own quantize /
//     dequantize loops (cpu_quantize_avx2_impl.inc).
// cpu_kernels_avx2.cc also holds a third variant, AVX-512 F/BW/VL quantize / dequantize
// (cpu_quantize_avx512_impl.inc, compiled under a target region) with the AVX2 conversion.
// All produce bit-identical results (no FMA contraction, same rounding), which dispatch_test
// checks. Not part of the public API.
#ifndef KVCACHE_KERNELS_SRC_CPU_KERNELS_H_
#define KVCACHE_KERNELS_SRC_CPU_KERNELS_H_

#include <cstdint>

#include "kvcache/kernels/types.h"

namespace kvcache::kernels::internal {

// One instruction-set variant. Arguments are pre-validated by the public entry points:
// non-null, non-empty, float dtypes only.
struct CpuKernels {
  const char* name;  // "baseline" (or "native"), "avx2-f16c" or "avx512".
  // Element-wise conversion between kFloat32, kFloat16 and kBFloat16.
  void (*convert)(const void* src, DType src_dtype, int64_t count, DType dst_dtype, void* dst);
  // `rows` rows of `cols` elements, one scale per row.
  void (*quantize_per_token)(const void* src, DType dtype, int64_t rows, int64_t cols, int8_t* dst,
                             float* scales);
  void (*dequantize_per_token)(const int8_t* src, const float* scales, int64_t rows, int64_t cols,
                               DType dtype, void* dst);
  // `mats` matrices of rows x cols, one scale per (matrix, column).
  void (*quantize_per_channel)(const void* src, DType dtype, int64_t mats, int64_t rows,
                               int64_t cols, int8_t* dst, float* scales);
  void (*dequantize_per_channel)(const int8_t* src, const float* scales, int64_t mats, int64_t rows,
                                 int64_t cols, DType dtype, void* dst);
};

const CpuKernels& BaselineCpuKernels();
// The AVX2+F16C variant, or nullptr when it was not compiled in.
const CpuKernels* Avx2CpuKernels();
// The AVX-512 variant, or nullptr when it was not compiled in (it is whenever AVX2 is).
const CpuKernels* Avx512CpuKernels();
// True when this CPU (and OS) supports AVX2 and F16C.
bool CpuHasAvx2F16c();
// True when this CPU (and OS) supports AVX2, F16C and AVX-512 F, BW, VL and DQ.
bool CpuHasAvx512();
// True when CpuHasAvx512() and the CPU also has AVX512_BF16 (the AVX-512 variant then converts
// dequantized bf16 with vcvtne2ps2bf16 where that is exact).
bool CpuHasAvx512Bf16();
// The variant the public kernels use: the widest one compiled in and supported (AVX-512, then
// AVX2), else baseline.
const CpuKernels& ActiveCpuKernels();
// Tests only: force the baseline variant (true) or return to automatic selection (false).
void ForceBaselineCpuKernelsForTesting(bool force);

}  // namespace kvcache::kernels::internal

#endif  // KVCACHE_KERNELS_SRC_CPU_KERNELS_H_
