#include "kvcache/kernels/attention.h"

#include <cmath>
#include <vector>

#include "cpu_math.h"
#include "validate.h"

namespace kvcache::kernels {

KernelStatus ReferenceAttentionCpu(const float* q, const float* k, const float* v,
                                   int64_t num_queries, int64_t num_keys, int64_t head_dim,
                                   float* out, float* weights) {
  const KernelStatus status =
      internal::CheckAttention(q, k, v, num_queries, num_keys, head_dim, out);
  if (status != KernelStatus::kOk || num_queries == 0) return status;

  const float scale = 1.0f / std::sqrt(static_cast<float>(head_dim));
  std::vector<float> scratch(weights == nullptr ? static_cast<size_t>(num_keys) : 0);
  std::vector<double> acc(static_cast<size_t>(head_dim));
  for (int64_t i = 0; i < num_queries; ++i) {
    const float* qi = q + i * head_dim;
    float* w = weights != nullptr ? weights + i * num_keys : scratch.data();
    // Scores and their maximum.
    float max_score = -INFINITY;
    for (int64_t j = 0; j < num_keys; ++j) {
      w[j] = internal::Dot(qi, k + j * head_dim, head_dim) * scale;
      max_score = w[j] > max_score ? w[j] : max_score;
    }
    // Normalised weights: exp(s - max) / sum, the sum in fp64.
    double sum = 0.0;
    for (int64_t j = 0; j < num_keys; ++j) {
      w[j] = std::exp(w[j] - max_score);
      sum += static_cast<double>(w[j]);
    }
    for (int64_t j = 0; j < num_keys; ++j) {
      w[j] = static_cast<float>(static_cast<double>(w[j]) / sum);
    }
    // out = sum_j w[j] * v[j], accumulated in fp64.
    for (int64_t c = 0; c < head_dim; ++c) acc[c] = 0.0;
    for (int64_t j = 0; j < num_keys; ++j) {
      const double wj = w[j];
      const float* vj = v + j * head_dim;
      for (int64_t c = 0; c < head_dim; ++c) acc[c] += wj * static_cast<double>(vj[c]);
    }
    float* oi = out + i * head_dim;
    for (int64_t c = 0; c < head_dim; ++c) oi[c] = static_cast<float>(acc[c]);
  }
  return KernelStatus::kOk;
}

}  // namespace kvcache::kernels
