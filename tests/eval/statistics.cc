#include "tests/eval/statistics.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <set>

#include "absl/strings/str_format.h"
#include "kvcache/kernels/novelty.h"

namespace kvcache::eval {
namespace {

double Median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

// Least-squares line through (log rank, log value) for ranks 1..count.
void LogLogFit(const std::vector<float>& sorted, int64_t count, double* r2, double* slope) {
  double sx = 0, sy = 0, sxx = 0, sxy = 0, syy = 0;
  int64_t n = 0;
  for (int64_t r = 0; r < count; ++r) {
    if (!(sorted[r] > 0)) break;
    const double x = std::log(static_cast<double>(r + 1));
    const double y = std::log(static_cast<double>(sorted[r]));
    sx += x;
    sy += y;
    sxx += x * x;
    sxy += x * y;
    syy += y * y;
    ++n;
  }
  if (n < 3) {
    *r2 = 0;
    *slope = 0;
    return;
  }
  const double cov = sxy - sx * sy / n;
  const double vx = sxx - sx * sx / n;
  const double vy = syy - sy * sy / n;
  *slope = vx > 0 ? cov / vx : 0;
  *r2 = vx > 0 && vy > 0 ? cov * cov / (vx * vy) : 0;
}

// The k best of [begin, end), skipping near-duplicate copies (their order
// among themselves is arbitrary: copies of one token get equal attention).
std::vector<int32_t> TopK(const std::vector<double>& score, int64_t begin, int64_t end, int64_t k,
                          const std::vector<double>& novelty) {
  std::vector<int32_t> order;
  for (int64_t t = begin; t < end; ++t) {
    if (novelty[t] >= 0.05) order.push_back(static_cast<int32_t>(t));
  }
  if (order.empty()) return order;
  k = std::min<int64_t>(k, static_cast<int64_t>(order.size()));
  std::partial_sort(order.begin(), order.begin() + k, order.end(), [&](int32_t a, int32_t b) {
    return score[a] != score[b] ? score[a] > score[b] : a < b;
  });
  order.resize(k);
  return order;
}

// Mean over layers of KeyNoveltyCpu over the context's keys.
std::vector<double> MeanNovelty(const KvDataset& data, int64_t T) {
  const KvShape& s = data.shape;
  const int D = s.head_dim;
  std::vector<double> sum(T, 0.0);
  std::vector<float> novelty(T);
  std::vector<float> keys(static_cast<size_t>(s.kv_heads) * T * D);
  for (int l = 0; l < s.layers; ++l) {
    for (int g = 0; g < s.kv_heads; ++g) {
      const float* k = data.Keys(l, g);
      std::copy(k, k + T * D, keys.begin() + static_cast<size_t>(g) * T * D);
    }
    kernels::KeyNoveltyCpu(keys.data(), kernels::DType::kFloat32, s.kv_heads, T, D, novelty.data());
    for (int64_t t = 0; t < T; ++t) sum[t] += novelty[t];
  }
  for (double& v : sum) v /= s.layers;
  return sum;
}

std::set<int> OutlierChannels(const float* keys, int64_t begin, int64_t end, int dim) {
  std::vector<double> rms(dim, 0.0);
  for (int64_t t = begin; t < end; ++t) {
    for (int d = 0; d < dim; ++d)
      rms[d] += static_cast<double>(keys[t * dim + d]) * keys[t * dim + d];
  }
  for (double& r : rms) r = std::sqrt(r / static_cast<double>(std::max<int64_t>(end - begin, 1)));
  const double median = Median(rms);
  std::set<int> out;
  for (int d = 0; d < dim; ++d) {
    if (rms[d] > 4 * median) out.insert(d);
  }
  return out;
}

}  // namespace

DatasetStatistics MeasureStatistics(const KvDataset& data, const PastAttention& past,
                                    const FutureReference& ref, int sink_from_layer) {
  const KvShape& s = data.shape;
  const int64_t T = ref.context;
  const int64_t F = ref.future;
  const int D = s.head_dim;
  DatasetStatistics st;
  int late_heads = 0, early_heads = 0, in_range = 0;
  int64_t sparse = 0, weights = 0;
  std::vector<double> r2s, slopes;
  double persistence = 0;
  double persistence_count = 0;
  double persistence_common = 0, persistence_top = 0;
  const int64_t region_end = std::max<int64_t>(2, T - past.options.stats_window);
  const std::vector<double> mean_novelty = MeanNovelty(data, T);
  for (int l = 0; l < s.layers; ++l) {
    for (int h = 0; h < s.q_heads; ++h) {
      const size_t qu = static_cast<size_t>(l) * s.q_heads + h;
      const std::vector<float>& w = ref.weights[qu];
      double sink = 0;
      std::vector<double> future_mean(T, 0.0);
      for (int64_t f = 0; f < F; ++f) {
        const int64_t n = T + f + 1;
        const float* row = w.data() + f * s.tokens;
        const float max = *std::max_element(row, row + n);
        for (int64_t j = 0; j < n; ++j) sparse += row[j] < 0.01f * max;
        for (int64_t j = 0; j < T; ++j) future_mean[j] += row[j];
        weights += n;
        sink += row[0];
      }
      sink /= static_cast<double>(F);
      const double local_share = past.local_share[qu];
      st.local_heads += local_share >= 0.5;
      st.broad_heads += local_share <= 0.2;
      ++st.heads;
      if (l >= sink_from_layer) {
        ++late_heads;
        st.sink_share_mean += sink;
        in_range += sink >= 0.6 && sink <= 0.9;
      } else {
        ++early_heads;
        st.sink_share_early += sink;
      }
      // Power law and persistence over tokens [1, region_end).
      const std::vector<float>& pm = past.recent_mean[qu];
      std::vector<float> sorted(pm.begin() + 1, pm.begin() + region_end);
      std::sort(sorted.begin(), sorted.end(), std::greater<float>());
      double r2 = 0, slope = 0;
      LogLogFit(sorted, std::max<int64_t>(3, static_cast<int64_t>(sorted.size()) / 4), &r2, &slope);
      r2s.push_back(r2);
      slopes.push_back(slope);
      const int64_t k = std::max<int64_t>(8, (region_end - 1) / 100);
      std::vector<double> past_score(pm.begin(), pm.end());
      const std::vector<int32_t> a = TopK(past_score, 1, region_end, k, mean_novelty);
      const std::vector<int32_t> b = TopK(future_mean, 1, region_end, k, mean_novelty);
      const std::set<int32_t> sa(a.begin(), a.end());
      int64_t common = 0;
      double common_mass = 0, top_mass = 0;
      for (int32_t t : b) {
        common += sa.count(t);
        common_mass += sa.count(t) ? future_mean[t] : 0.0;
        top_mass += future_mean[t];
      }
      persistence_common += common_mass;
      persistence_top += top_mass;
      persistence += top_mass > 0 ? common_mass / top_mass : 1.0;
      persistence_count +=
          static_cast<double>(common) / static_cast<double>(std::max<size_t>(b.size(), 1));
    }
  }
  st.sink_heads_in_range = late_heads > 0 ? static_cast<double>(in_range) / late_heads : 0;
  st.sink_share_mean = late_heads > 0 ? st.sink_share_mean / late_heads : 0;
  st.sink_share_early = early_heads > 0 ? st.sink_share_early / early_heads : 0;
  st.sparsity = weights > 0 ? static_cast<double>(sparse) / static_cast<double>(weights) : 0;
  st.powerlaw_r2 = Median(r2s);
  st.powerlaw_slope = Median(slopes);
  st.persistence = persistence_top > 0 ? persistence_common / persistence_top : 1.0;
  st.persistence_head_mean = st.heads > 0 ? persistence / st.heads : 0;
  st.persistence_count = st.heads > 0 ? persistence_count / st.heads : 0;

  // Keys: outlier channels, near-duplicates; values: the sink's norm.
  int kv_units = 0, late_units = 0;
  for (int l = 0; l < s.layers; ++l) {
    for (int g = 0; g < s.kv_heads; ++g) {
      const float* keys = data.Keys(l, g);
      const std::set<int> all = OutlierChannels(keys, 0, T, D);
      const std::set<int> first = OutlierChannels(keys, 0, T / 2, D);
      const std::set<int> second = OutlierChannels(keys, T / 2, T, D);
      std::vector<int> inter, uni;
      std::set_intersection(first.begin(), first.end(), second.begin(), second.end(),
                            std::back_inserter(inter));
      std::set_union(first.begin(), first.end(), second.begin(), second.end(),
                     std::back_inserter(uni));
      st.outlier_channels += static_cast<double>(all.size());
      st.outlier_stability += uni.empty() ? 1.0 : static_cast<double>(inter.size()) / uni.size();
      std::vector<double> rms(D, 0.0);
      for (int64_t t = 0; t < T; ++t) {
        for (int d = 0; d < D; ++d)
          rms[d] += static_cast<double>(keys[t * D + d]) * keys[t * D + d];
      }
      st.outlier_ratio +=
          std::sqrt(*std::max_element(rms.begin(), rms.end()) / std::max(Median(rms), 1e-30));
      ++kv_units;
      if (l >= sink_from_layer) {
        const float* v = data.Values(l, g);
        std::vector<double> norms(T);
        for (int64_t t = 0; t < T; ++t) {
          double n2 = 0;
          for (int d = 0; d < D; ++d) n2 += static_cast<double>(v[t * D + d]) * v[t * D + d];
          norms[t] = std::sqrt(n2);
        }
        const double v0 = norms[0];
        st.sink_value_ratio += v0 / std::max(Median(norms), 1e-30);
        ++late_units;
      }
    }
  }
  st.outlier_channels /= kv_units;
  st.outlier_ratio /= kv_units;
  st.outlier_stability /= kv_units;
  st.sink_value_ratio = late_units > 0 ? st.sink_value_ratio / late_units : 0;
  int64_t dups = 0;
  for (int64_t t = 1; t < T; ++t) {
    const double n = mean_novelty[t];
    dups += n < 0.05;
    st.mean_novelty += n;
  }
  st.duplicate_share = static_cast<double>(dups) / static_cast<double>(T - 1);
  st.mean_novelty /= static_cast<double>(T - 1);
  return st;
}

std::vector<StatisticRow> StatisticRows(const DatasetStatistics& s, bool redundant) {
  std::vector<StatisticRow> rows;
  auto add = [&](std::string name, std::string measured, std::string target, bool met) {
    rows.push_back({std::move(name), std::move(measured), std::move(target), true, met});
  };
  add("first-token share, layers >= 2",
      absl::StrFormat("%.0f%% of heads in [0.6, 0.9]; mean %.2f (layers 0-1: %.2f)",
                      100 * s.sink_heads_in_range, s.sink_share_mean, s.sink_share_early),
      "0.6-0.9 in most heads (>= 75%)", s.sink_heads_in_range >= 0.75);
  add("scores below 1% of the row max", absl::StrFormat("%.1f%%", 100 * s.sparsity), "> 95%",
      s.sparsity > 0.95);
  add("accumulated attention vs rank (log-log)",
      absl::StrFormat("R^2 %.3f, slope %.2f (median over heads)", s.powerlaw_r2, s.powerlaw_slope),
      "power law: R^2 >= 0.9", s.powerlaw_r2 >= 0.9);
  add("heavy hitters past vs future (top-1% overlap)",
      absl::StrFormat("%.1f%% of the top sets' future mass (per-head mean %.1f%%; %.1f%% of "
                      "the tokens)",
                      100 * s.persistence, 100 * s.persistence_head_mean,
                      100 * s.persistence_count),
      "> 95%", s.persistence > 0.95);
  add("outlier key channels per kv head (RMS > 4x median)",
      absl::StrFormat("%.1f channels, max/median RMS %.1f, same in both halves %.0f%%",
                      s.outlier_channels, s.outlier_ratio, 100 * s.outlier_stability),
      "a few (1-8), fixed (>= 90%)",
      s.outlier_channels >= 1 && s.outlier_channels <= 8 && s.outlier_stability >= 0.9);
  add("near-duplicate keys (novelty < 0.05)",
      absl::StrFormat("%.1f%% of tokens (mean novelty %.2f)", 100 * s.duplicate_share,
                      s.mean_novelty),
      redundant ? ">= 30% (redundant profile)" : "present (>= 2%)",
      s.duplicate_share >= (redundant ? 0.30 : 0.02));
  add("head types (local >= 50% / broad <= 20% of non-sink mass in last 64)",
      absl::StrFormat("%d local, %d broad of %d", s.local_heads, s.broad_heads, s.heads),
      "both present", s.local_heads > 0 && s.broad_heads > 0);
  rows.push_back({"sink value norm / median value norm",
                  absl::StrFormat("%.2f", s.sink_value_ratio), "small (reported)", false, false});
  return rows;
}

}  // namespace kvcache::eval
