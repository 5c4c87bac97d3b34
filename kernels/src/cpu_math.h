// Internal: small vectorizable helpers shared by the baseline-compiled CPU kernels. Only
// baseline translation units include this header (never cpu_kernels_avx2.cc), so its inline
// functions are compiled with one instruction set.
#ifndef KVCACHE_KERNELS_SRC_CPU_MATH_H_
#define KVCACHE_KERNELS_SRC_CPU_MATH_H_

#include <cmath>
#include <cstdint>

namespace kvcache::kernels::internal {

// Dot product with 8 independent fp32 partial sums (lane j sums elements i = j mod 8), so the
// compiler can vectorize it without reassociating; lanes are combined pairwise at the end.
inline float Dot(const float* __restrict a, const float* __restrict b, int64_t n) {
  float acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    for (int j = 0; j < 8; ++j) acc[j] += a[i + j] * b[i + j];
  }
  for (int j = 0; i < n; ++i, ++j) acc[j] += a[i] * b[i];
  return ((acc[0] + acc[4]) + (acc[1] + acc[5])) + ((acc[2] + acc[6]) + (acc[3] + acc[7]));
}

// 1 - cos(a, b) from dot(a, b), |a|^2 and |b|^2, the novelty.h formula (the ratio in fp64, so
// identical vectors give exactly 0). Mirrored by the CUDA twin.
inline float OneMinusCosine(float dot, float norm2_a, float norm2_b) {
  if (!(norm2_a > 0.0f) || !(norm2_b > 0.0f)) return 1.0f;
  double c = static_cast<double>(dot) /
             std::sqrt(static_cast<double>(norm2_a) * static_cast<double>(norm2_b));
  c = c < -1.0 ? -1.0 : (c > 1.0 ? 1.0 : c);
  return 1.0f - static_cast<float>(c);
}

}  // namespace kvcache::kernels::internal

#endif  // KVCACHE_KERNELS_SRC_CPU_MATH_H_
