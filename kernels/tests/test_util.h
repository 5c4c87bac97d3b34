// Helpers shared by the kernel tests: deterministic random data and dtype round trips.
#ifndef KVCACHE_KERNELS_TESTS_TEST_UTIL_H_
#define KVCACHE_KERNELS_TESTS_TEST_UTIL_H_

#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

#include "kvcache/kernels/convert.h"
#include "kvcache/kernels/types.h"

namespace kvcache::kernels::test {

inline std::vector<float> Gaussian(size_t n, uint32_t seed, float stddev = 1.0f) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> dist(0.0f, stddev);
  std::vector<float> out(n);
  for (float& x : out) x = dist(rng);
  return out;
}

inline std::vector<float> Uniform(size_t n, uint32_t seed, float lo, float hi) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> dist(lo, hi);
  std::vector<float> out(n);
  for (float& x : out) x = dist(rng);
  return out;
}

// `values` encoded as `dtype` (raw bytes, rounded to nearest even).
inline std::vector<uint8_t> Encode(const std::vector<float>& values, DType dtype) {
  std::vector<uint8_t> bytes(values.size() * DTypeSize(dtype));
  if (!values.empty()) {
    ConvertCpu(values.data(), DType::kFloat32, static_cast<int64_t>(values.size()), dtype,
               bytes.data());
  }
  return bytes;
}

// Raw `dtype` bytes decoded to floats.
inline std::vector<float> Decode(const std::vector<uint8_t>& bytes, DType dtype) {
  std::vector<float> values(bytes.size() / DTypeSize(dtype));
  if (!values.empty()) {
    ConvertCpu(bytes.data(), dtype, static_cast<int64_t>(values.size()), DType::kFloat32,
               values.data());
  }
  return values;
}

// `values` rounded to what `dtype` can represent.
inline std::vector<float> RoundTo(const std::vector<float>& values, DType dtype) {
  return Decode(Encode(values, dtype), dtype);
}

// Unit roundoff of a float dtype (half an ulp at 1.0).
inline double UnitRoundoff(DType dtype) {
  switch (dtype) {
    case DType::kFloat16:
      return std::ldexp(1.0, -11);
    case DType::kBFloat16:
      return std::ldexp(1.0, -8);
    default:
      return 0.0;
  }
}

inline double RelativeRmse(const std::vector<float>& reference, const std::vector<float>& got) {
  double err = 0.0, norm = 0.0;
  for (size_t i = 0; i < reference.size(); ++i) {
    const double d = static_cast<double>(got[i]) - reference[i];
    err += d * d;
    norm += static_cast<double>(reference[i]) * reference[i];
  }
  return std::sqrt(err / norm);
}

}  // namespace kvcache::kernels::test

#endif  // KVCACHE_KERNELS_TESTS_TEST_UTIL_H_
