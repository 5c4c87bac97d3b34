// Run-time choice between the CPU kernel variants (see cpu_kernels.h).
#include <atomic>

#include "cpu_kernels.h"

#if (defined(__x86_64__) || defined(__i386__)) && (defined(__GNUC__) || defined(__clang__))
#include <cpuid.h>
#define KVCACHE_KERNELS_X86_CPUID 1
#endif

namespace kvcache::kernels::internal {
namespace {

std::atomic<bool> force_baseline{false};

#if defined(KVCACHE_KERNELS_X86_CPUID)
bool DetectAvx2F16c() {
  unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
  if (__get_cpuid(1, &eax, &ebx, &ecx, &edx) == 0) return false;
  const bool osxsave = (ecx & (1u << 27)) != 0;
  const bool avx = (ecx & (1u << 28)) != 0;
  const bool f16c = (ecx & (1u << 29)) != 0;
  if (!osxsave || !avx || !f16c) return false;
  // The OS must save the SSE and AVX register state (XCR0 bits 1 and 2).
  unsigned xcr0_lo = 0, xcr0_hi = 0;
  __asm__ volatile("xgetbv" : "=a"(xcr0_lo), "=d"(xcr0_hi) : "c"(0));
  if ((xcr0_lo & 0x6u) != 0x6u) return false;
  if (__get_cpuid_max(0, nullptr) < 7) return false;
  __cpuid_count(7, 0, eax, ebx, ecx, edx);
  return (ebx & (1u << 5)) != 0;  // AVX2
}

// Call only when DetectAvx2F16c() is true (so OSXSAVE and leaf 7 exist).
bool DetectAvx512() {
  // The OS must also save the opmask and ZMM state (XCR0 bits 5, 6 and 7).
  unsigned xcr0_lo = 0, xcr0_hi = 0;
  __asm__ volatile("xgetbv" : "=a"(xcr0_lo), "=d"(xcr0_hi) : "c"(0));
  if ((xcr0_lo & 0xE6u) != 0xE6u) return false;
  unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
  __cpuid_count(7, 0, eax, ebx, ecx, edx);
  const unsigned kF = 1u << 16, kDq = 1u << 17, kBw = 1u << 30, kVl = 1u << 31;
  return (ebx & (kF | kDq | kBw | kVl)) == (kF | kDq | kBw | kVl);
}

// Call only when DetectAvx512() is true.
bool DetectAvx512Bf16() {
  unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
  __cpuid_count(7, 0, eax, ebx, ecx, edx);
  if (eax < 1) return false;  // No sub-leaf 1.
  __cpuid_count(7, 1, eax, ebx, ecx, edx);
  return (eax & (1u << 5)) != 0;  // AVX512_BF16
}
#endif

}  // namespace

#if !defined(KVCACHE_KERNELS_HAVE_AVX2_VARIANT)
const CpuKernels* Avx2CpuKernels() { return nullptr; }
const CpuKernels* Avx512CpuKernels() { return nullptr; }
#endif

bool CpuHasAvx2F16c() {
#if defined(KVCACHE_KERNELS_X86_CPUID)
  static const bool has = DetectAvx2F16c();
  return has;
#else
  return false;
#endif
}

bool CpuHasAvx512() {
#if defined(KVCACHE_KERNELS_X86_CPUID)
  static const bool has = CpuHasAvx2F16c() && DetectAvx512();
  return has;
#else
  return false;
#endif
}

bool CpuHasAvx512Bf16() {
#if defined(KVCACHE_KERNELS_X86_CPUID)
  static const bool has = CpuHasAvx512() && DetectAvx512Bf16();
  return has;
#else
  return false;
#endif
}

const CpuKernels& ActiveCpuKernels() {
  static const CpuKernels* const best = [] {
    if (CpuHasAvx512() && Avx512CpuKernels() != nullptr) return Avx512CpuKernels();
    return CpuHasAvx2F16c() ? Avx2CpuKernels() : nullptr;
  }();
  if (best != nullptr && !force_baseline.load(std::memory_order_relaxed)) return *best;
  return BaselineCpuKernels();
}

void ForceBaselineCpuKernelsForTesting(bool force) {
  force_baseline.store(force, std::memory_order_relaxed);
}

}  // namespace kvcache::kernels::internal
