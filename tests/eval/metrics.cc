#include "tests/eval/metrics.h"

#include <atomic>
#include <cmath>
#include <vector>

#include "absl/strings/str_cat.h"
#include "kvcache/kernels/attention.h"
#include "kvcache/kernels/convert.h"
#include "kvcache/kernels/gather.h"
#include "kvcache/kernels/quantize.h"
#include "tests/eval/parallel.h"

namespace kvcache::eval {
namespace {

using kernels::DType;
using kernels::KernelStatus;
using kernels::QuantAxis;

// Round-trips `rows` rows of `dim` values through INT8 along `axis` and FP16
// (in place); adds the squared error and the squared values to the sums.
bool Int8RoundTrip(float* rows, int64_t count, int dim, QuantAxis axis, double* err2,
                   double* sum2) {
  if (count == 0) return true;
  std::vector<int8_t> codes(count * dim);
  std::vector<float> scales(kernels::Int8ScaleCount(axis, 1, count, dim));
  std::vector<uint16_t> half(count * dim);
  if (kernels::QuantizeInt8Cpu(rows, DType::kFloat32, 1, count, dim, axis, codes.data(),
                               scales.data()) != KernelStatus::kOk ||
      kernels::DequantizeInt8Cpu(codes.data(), scales.data(), 1, count, dim, axis, DType::kFloat16,
                                 half.data()) != KernelStatus::kOk) {
    return false;
  }
  std::vector<float> back(count * dim);
  if (kernels::ConvertCpu(half.data(), DType::kFloat16, count * dim, DType::kFloat32,
                          back.data()) != KernelStatus::kOk) {
    return false;
  }
  for (int64_t i = 0; i < count * dim; ++i) {
    const double e = static_cast<double>(back[i]) - rows[i];
    *err2 += e * e;
    *sum2 += static_cast<double>(rows[i]) * rows[i];
    rows[i] = back[i];
  }
  return true;
}

struct HeadResult {
  double output_error = 0;
  double output_error_vrms = 0;
  double mass = 0;
  double mass_no_sink = 0;
  double recall = 0;
};

struct UnitResult {
  double k_err2 = 0, k_sum2 = 0, v_err2 = 0, v_sum2 = 0;
  int64_t kept = 0;
  int64_t int8 = 0;
};

}  // namespace

absl::StatusOr<PlanMetrics> EvaluatePlan(const KvDataset& data, const FutureReference& ref,
                                         const AccountingShape& shape, const RetentionPlan& plan,
                                         int threads) {
  const KvShape& s = data.shape;
  const int64_t T = shape.context;
  const int64_t F = ref.future;
  const int D = s.head_dim;
  const int group = s.group();
  if (static_cast<int64_t>(plan.units.size()) != shape.units() || ref.context != T) {
    return absl::InvalidArgumentError(
        absl::StrCat("plan has ", plan.units.size(), " units; expected ", shape.units()));
  }
  std::vector<HeadResult> heads(static_cast<size_t>(s.layers) * s.q_heads);
  std::vector<UnitResult> units(shape.units());
  std::atomic<bool> failed{false};
  ParallelFor(shape.units(), threads, [&](int64_t u) {
    const int layer = static_cast<int>(u / s.kv_heads);
    const int kvh = static_cast<int>(u % s.kv_heads);
    const UnitPlan& up = plan.units[u];
    const int64_t n = static_cast<int64_t>(up.kept.size());
    if (n == 0) {
      failed = true;
      return;
    }
    // Kept context rows, then the F new tokens (never compressed).
    std::vector<float> k((n + F) * D);
    std::vector<float> v((n + F) * D);
    std::copy(data.Keys(layer, kvh) + T * D, data.Keys(layer, kvh) + (T + F) * D,
              k.begin() + n * D);
    std::copy(data.Values(layer, kvh) + T * D, data.Values(layer, kvh) + (T + F) * D,
              v.begin() + n * D);
    if (kernels::GatherTokensCpu(data.Keys(layer, kvh), DType::kFloat32, 1, T, D, up.kept.data(), n,
                                 k.data()) != KernelStatus::kOk ||
        kernels::GatherTokensCpu(data.Values(layer, kvh), DType::kFloat32, 1, T, D, up.kept.data(),
                                 n, v.data()) != KernelStatus::kOk) {
      failed = true;
      return;
    }
    UnitResult& ur = units[u];
    ur.kept = n;
    if (!up.int8.empty()) {
      // Keys: per channel over each scale group's INT8 tokens.
      std::vector<int64_t> rows;
      std::vector<float> buf;
      auto flush_keys = [&] {
        if (rows.empty()) return true;
        buf.resize(rows.size() * D);
        for (size_t r = 0; r < rows.size(); ++r) {
          std::copy(k.begin() + rows[r] * D, k.begin() + (rows[r] + 1) * D, buf.begin() + r * D);
        }
        if (!Int8RoundTrip(buf.data(), static_cast<int64_t>(rows.size()), D, QuantAxis::kPerChannel,
                           &ur.k_err2, &ur.k_sum2)) {
          return false;
        }
        for (size_t r = 0; r < rows.size(); ++r) {
          std::copy(buf.begin() + r * D, buf.begin() + (r + 1) * D, k.begin() + rows[r] * D);
        }
        rows.clear();
        return true;
      };
      std::vector<int64_t> value_rows;
      int64_t current_group = -1;
      for (int64_t i = 0; i < n; ++i) {
        if (up.int8[i] == 0) continue;
        const int64_t g = up.kept[i] / shape.scale_group;
        if (g != current_group && !flush_keys()) {
          failed = true;
          return;
        }
        current_group = g;
        rows.push_back(i);
        value_rows.push_back(i);
      }
      if (!flush_keys()) {
        failed = true;
        return;
      }
      ur.int8 = static_cast<int64_t>(value_rows.size());
      buf.resize(value_rows.size() * D);
      for (size_t r = 0; r < value_rows.size(); ++r) {
        std::copy(v.begin() + value_rows[r] * D, v.begin() + (value_rows[r] + 1) * D,
                  buf.begin() + r * D);
      }
      if (!Int8RoundTrip(buf.data(), static_cast<int64_t>(value_rows.size()), D,
                         QuantAxis::kPerToken, &ur.v_err2, &ur.v_sum2)) {
        failed = true;
        return;
      }
      for (size_t r = 0; r < value_rows.size(); ++r) {
        std::copy(buf.begin() + r * D, buf.begin() + (r + 1) * D, v.begin() + value_rows[r] * D);
      }
    }
    std::vector<uint8_t> kept_mask(T, 0);
    for (int32_t t : up.kept) kept_mask[t] = 1;
    std::vector<float> out(F * D);
    for (int g = 0; g < group; ++g) {
      const int head = kvh * group + g;
      const size_t qu = static_cast<size_t>(layer) * s.q_heads + head;
      for (int64_t f = 0; f < F; ++f) {
        if (kernels::ReferenceAttentionCpu(data.Query(layer, head, T + f), k.data(), v.data(), 1,
                                           n + f + 1, D, out.data() + f * D,
                                           nullptr) != KernelStatus::kOk) {
          failed = true;
          return;
        }
      }
      double diff2 = 0;
      double ref2 = 0;
      double mass = 0;
      double mass_no_sink = 0;
      double recall = 0;
      for (int64_t f = 0; f < F; ++f) {
        const float* o = ref.outputs[qu].data() + f * D;
        for (int d = 0; d < D; ++d) {
          const double e = static_cast<double>(out[f * D + d]) - o[d];
          diff2 += e * e;
          ref2 += static_cast<double>(o[d]) * o[d];
        }
        const float* w = ref.weights[qu].data() + f * s.tokens;
        double kept_w = 0;
        double context_w = 0;
        for (int32_t t : up.kept) kept_w += w[t];
        for (int64_t t = 0; t < T; ++t) context_w += w[t];
        mass += context_w > 0 ? kept_w / context_w : 1.0;
        const double sink_w = kept_mask[0] ? w[0] : 0.0;
        const double rest = context_w - w[0];
        mass_no_sink += rest > 0 ? (kept_w - sink_w) / rest : 1.0;
        int hits = 0;
        const int32_t* top = ref.top[qu].data() + f * ref.top_k;
        for (int i = 0; i < ref.top_k; ++i) hits += kept_mask[top[i]];
        recall += static_cast<double>(hits) / ref.top_k;
      }
      HeadResult& hr = heads[qu];
      hr.output_error = ref2 > 0 ? std::sqrt(diff2 / ref2) : 0.0;
      hr.output_error_vrms =
          ref.value_rms[u] > 0 ? std::sqrt(diff2 / static_cast<double>(F)) / ref.value_rms[u] : 0.0;
      hr.mass = mass / F;
      hr.mass_no_sink = mass_no_sink / F;
      hr.recall = recall / F;
    }
  });
  if (failed) return absl::InternalError("a kernel rejected its arguments (empty kept set?)");
  PlanMetrics m;
  m.bytes = CountBytes(shape, plan);
  m.bytes_fraction =
      static_cast<double>(m.bytes.total()) / static_cast<double>(FullFp16Bytes(shape));
  for (const HeadResult& h : heads) {
    m.output_error += h.output_error;
    m.output_error_vrms += h.output_error_vrms;
    m.mass += h.mass;
    m.mass_no_sink += h.mass_no_sink;
    m.recall += h.recall;
  }
  const double nh = static_cast<double>(heads.size());
  m.output_error /= nh;
  m.output_error_vrms /= nh;
  m.mass /= nh;
  m.mass_no_sink /= nh;
  m.recall /= nh;
  double k_err2 = 0, k_sum2 = 0, v_err2 = 0, v_sum2 = 0;
  for (const UnitResult& u : units) {
    m.kept_fraction += static_cast<double>(u.kept) / static_cast<double>(T);
    m.int8_fraction += static_cast<double>(u.int8) / static_cast<double>(T);
    k_err2 += u.k_err2;
    k_sum2 += u.k_sum2;
    v_err2 += u.v_err2;
    v_sum2 += u.v_sum2;
  }
  m.kept_fraction /= static_cast<double>(units.size());
  m.int8_fraction /= static_cast<double>(units.size());
  if (k_sum2 > 0) m.key_rel_rmse = std::sqrt(k_err2 / k_sum2);
  if (v_sum2 > 0) m.value_rel_rmse = std::sqrt(v_err2 / v_sum2);
  return m;
}

}  // namespace kvcache::eval
