#include "tests/eval/attention_pass.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <numeric>

#include "absl/strings/str_cat.h"
#include "kvcache/kernels/attention.h"
#include "tests/eval/parallel.h"

namespace kvcache::eval {

absl::StatusOr<PastAttention> ComputePastAttention(const KvDataset& data, int64_t context,
                                                   const PastAttentionOptions& options) {
  const KvShape& s = data.shape;
  if (context < 2 || context > s.tokens) {
    return absl::InvalidArgumentError(
        absl::StrCat("context ", context, " outside [2, ", s.tokens, "]"));
  }
  if (options.report_every < 1 || options.snap_window < 1 || options.stats_window < 1) {
    return absl::InvalidArgumentError("report_every, snap_window and stats_window must be >= 1");
  }
  PastAttention past;
  past.context = context;
  past.options = options;
  past.reports = (context + options.report_every - 1) / options.report_every;
  const int64_t kv_units = static_cast<int64_t>(s.layers) * s.kv_heads;
  const int group = s.group();
  past.accumulated.assign(kv_units, std::vector<float>(context, 0.0f));
  past.window.assign(kv_units, std::vector<float>(context, 0.0f));
  past.report_mass.assign(kv_units, std::vector<float>(past.reports * context, 0.0f));
  past.recent_mean.assign(static_cast<size_t>(s.layers) * s.q_heads,
                          std::vector<float>(context, 0.0f));
  past.local_share.assign(static_cast<size_t>(s.layers) * s.q_heads, 0.0);
  const int64_t stats_from = std::max<int64_t>(0, context - options.stats_window);
  const int64_t snap_from = std::max<int64_t>(0, context - options.snap_window);
  std::atomic<bool> failed{false};
  ParallelFor(kv_units, options.threads, [&](int64_t unit) {
    const int layer = static_cast<int>(unit / s.kv_heads);
    const int kvh = static_cast<int>(unit % s.kv_heads);
    const float* keys = data.Keys(layer, kvh);
    const float* values = data.Values(layer, kvh);
    std::vector<float> w(context);
    std::vector<float> out(s.head_dim);
    std::vector<double> recent(context);
    for (int g = 0; g < group; ++g) {
      const int head = kvh * group + g;
      std::fill(recent.begin(), recent.end(), 0.0);
      double local = 0;
      for (int64_t i = 0; i < context; ++i) {
        if (kernels::ReferenceAttentionCpu(data.Query(layer, head, i), keys, values, 1, i + 1,
                                           s.head_dim, out.data(),
                                           w.data()) != kernels::KernelStatus::kOk) {
          failed = true;
          return;
        }
        float* acc = past.accumulated[unit].data();
        float* report = past.report_mass[unit].data() + (i / options.report_every) * context;
        for (int64_t j = 0; j <= i; ++j) {
          acc[j] += w[j];
          report[j] += w[j];
        }
        if (i >= snap_from) {
          float* win = past.window[unit].data();
          for (int64_t j = 0; j <= i; ++j) win[j] += w[j];
        }
        if (i >= stats_from) {
          for (int64_t j = 0; j <= i; ++j) recent[j] += w[j];
          double near = 0;
          for (int64_t j = std::max<int64_t>(1, i - 63); j <= i; ++j) near += w[j];
          local += w[0] < 1 ? near / (1.0 - w[0]) : 0.0;
        }
      }
      const size_t qu = static_cast<size_t>(layer) * s.q_heads + head;
      std::vector<float>& mean = past.recent_mean[qu];
      const double n = static_cast<double>(context - stats_from);
      for (int64_t j = 0; j < context; ++j) mean[j] = static_cast<float>(recent[j] / n);
      past.local_share[qu] = local / n;
    }
  });
  if (failed) return absl::InternalError("ReferenceAttentionCpu rejected a past query");
  return past;
}

absl::StatusOr<FutureReference> ComputeFutureReference(const KvDataset& data, int64_t context,
                                                       int top_k, int threads) {
  const KvShape& s = data.shape;
  const int64_t future = s.tokens - context;
  if (context < 2 || future < 1) {
    return absl::InvalidArgumentError(absl::StrCat("context ", context, " leaves ", future,
                                                   " future queries of ", s.tokens, " tokens"));
  }
  FutureReference ref;
  ref.context = context;
  ref.future = future;
  ref.top_k = static_cast<int>(std::min<int64_t>(top_k, context));
  const int64_t q_units = static_cast<int64_t>(s.layers) * s.q_heads;
  const int group = s.group();
  ref.weights.resize(q_units);
  ref.outputs.resize(q_units);
  ref.top.resize(q_units);
  std::atomic<bool> failed{false};
  ParallelFor(q_units, threads, [&](int64_t unit) {
    const int layer = static_cast<int>(unit / s.q_heads);
    const int head = static_cast<int>(unit % s.q_heads);
    const int kvh = head / group;
    const int64_t n = s.tokens;
    ref.weights[unit].assign(future * n, 0.0f);
    ref.outputs[unit].resize(future * s.head_dim);
    for (int64_t f = 0; f < future; ++f) {
      if (kernels::ReferenceAttentionCpu(
              data.Query(layer, head, context + f), data.Keys(layer, kvh), data.Values(layer, kvh),
              1, context + f + 1, s.head_dim, ref.outputs[unit].data() + f * s.head_dim,
              ref.weights[unit].data() + f * n) != kernels::KernelStatus::kOk) {
        failed = true;
        return;
      }
    }
    ref.top[unit].resize(future * ref.top_k);
    std::vector<int32_t> order(context);
    for (int64_t f = 0; f < future; ++f) {
      const float* w = ref.weights[unit].data() + f * n;
      std::iota(order.begin(), order.end(), 0);
      std::partial_sort(order.begin(), order.begin() + ref.top_k, order.end(),
                        [&](int32_t a, int32_t b) { return w[a] != w[b] ? w[a] > w[b] : a < b; });
      std::copy(order.begin(), order.begin() + ref.top_k, ref.top[unit].begin() + f * ref.top_k);
    }
  });
  if (failed) return absl::InternalError("ReferenceAttentionCpu rejected a future query");
  const int64_t kv_units = static_cast<int64_t>(s.layers) * s.kv_heads;
  ref.value_rms.resize(kv_units);
  for (int64_t unit = 0; unit < kv_units; ++unit) {
    const float* v =
        data.Values(static_cast<int>(unit / s.kv_heads), static_cast<int>(unit % s.kv_heads));
    double sum = 0;
    for (int64_t i = 0; i < context * s.head_dim; ++i) sum += static_cast<double>(v[i]) * v[i];
    ref.value_rms[unit] = std::sqrt(sum / static_cast<double>(context));
  }
  return ref;
}

}  // namespace kvcache::eval
