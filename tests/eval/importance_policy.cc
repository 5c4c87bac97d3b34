#include "tests/eval/importance_policy.h"

#include <algorithm>
#include <numeric>
#include <span>
#include <utility>

#include "kvcache/kernels/novelty.h"
#include "server/importance/scoring.h"

namespace kvcache::eval {
namespace {

using importance::DecayActivity;
using importance::IsStructurallyProtected;
using importance::NormaliseAttention;
using importance::ScoreTokens;
using importance::SelectByMass;

// One report's observed activity for tokens [0, n).
std::vector<float> Observe(std::span<const float> mass, const ImportanceOptions& o) {
  if (o.norm == ActivityNorm::kSequence) return NormaliseAttention(mass);
  return importance::ObserveAttention(mass, o.params);  // what the daemon does
}

// Novelty of every context token of a group, as the daemon computes it at
// append: per block, averaged over the novelty layers (model granularity) or
// for the unit's own layer and head.
std::vector<float> GroupNovelty(const PolicyContext& ctx, const ImportanceOptions& o,
                                int64_t unit) {
  const KvDataset& d = *ctx.data;
  const int64_t T = ctx.shape.context;
  const int D = d.shape.head_dim;
  std::vector<float> novelty(T, 0.0f);
  std::vector<std::pair<int, int>> slices;  // (layer, first kv head); heads = count
  int heads = d.shape.kv_heads;
  if (unit < 0) {
    for (int l : DaemonNoveltyLayers(d.shape.layers)) slices.emplace_back(l, 0);
  } else {
    slices.emplace_back(static_cast<int>(unit / d.shape.kv_heads),
                        static_cast<int>(unit % d.shape.kv_heads));
    heads = 1;
  }
  std::vector<float> block;
  std::vector<float> one;
  const int64_t step = o.novelty_per_block ? o.block_tokens : T;
  for (int64_t first = 0; first < T; first += step) {
    const int64_t n = std::min(step, T - first);
    block.resize(static_cast<size_t>(heads) * n * D);
    one.resize(n);
    for (const auto& [layer, head0] : slices) {
      for (int h = 0; h < heads; ++h) {
        const float* src = d.Keys(layer, head0 + h) + first * D;
        std::copy(src, src + n * D, block.begin() + static_cast<size_t>(h) * n * D);
      }
      kernels::KeyNoveltyCpu(block.data(), kernels::DType::kFloat32, heads, n, D, one.data());
      for (int64_t t = 0; t < n; ++t) novelty[first + t] += one[t];
    }
    for (int64_t t = 0; t < n; ++t) novelty[first + t] /= static_cast<float>(slices.size());
  }
  return novelty;
}

struct Group {
  std::vector<int64_t> units;
  std::vector<float> scores;
  std::vector<uint8_t> protect;
};

class ImportancePolicy final : public RetentionPolicy {
 public:
  ImportancePolicy(const PolicyContext& ctx, const ImportanceOptions& options, std::string name)
      : ctx_(ctx), options_(options), name_(std::move(name)) {
    const int64_t T = ctx.shape.context;
    unit_shape_ = ctx.shape;
    if (options.granularity == Granularity::kHead) {
      unit_shape_.layers = 1;
      unit_shape_.kv_heads = 1;
    }
    const int64_t groups = options.granularity == Granularity::kModel ? 1 : ctx.shape.units();
    groups_.resize(groups);
    for (int64_t g = 0; g < groups; ++g) {
      Group& group = groups_[g];
      if (options.granularity == Granularity::kModel) {
        group.units.resize(ctx.shape.units());
        std::iota(group.units.begin(), group.units.end(), 0);
      } else {
        group.units = {g};
      }
      const std::vector<float> activity = GroupActivity(*ctx.past, group.units, options);
      const std::vector<float> novelty =
          GroupNovelty(ctx, options, options.granularity == Granularity::kModel ? -1 : g);
      group.scores.resize(T);
      ScoreTokens(options.params, 0, T, activity, novelty, group.scores);
      group.protect.resize(T);
      for (int64_t t = 0; t < T; ++t) {
        group.protect[t] = IsStructurallyProtected(options.params, t, T) ? 1 : 0;
      }
    }
  }

  const std::string& name() const override { return name_; }
  bool budgeted() const override { return options_.natural_target <= 0; }

  RetentionPlan Plan(uint64_t budget) const override {
    std::vector<std::vector<TokenChoice>> choices(groups_.size());
    const uint64_t group_budget = options_.granularity == Granularity::kModel
                                      ? budget
                                      : budget / static_cast<uint64_t>(ctx_.shape.units());
    for (size_t g = 0; g < groups_.size(); ++g) {
      choices[g] =
          budgeted() ? Fit(groups_[g], group_budget) : Choose(groups_[g], options_.natural_target);
    }
    if (options_.granularity == Granularity::kModel) {
      return SharedDecisionPlan(ctx_.shape, choices[0]);
    }
    RetentionPlan plan;
    plan.index_cost = IndexCost::kPerUnit;
    plan.units.resize(groups_.size());
    for (size_t g = 0; g < groups_.size(); ++g) {
      plan.units[g] = SharedDecisionPlan(unit_shape_, choices[g]).units[0];
    }
    return plan;
  }

 private:
  uint64_t Bytes(const std::vector<TokenChoice>& c) const {
    return SharedDecisionBytes(unit_shape_, c).total();
  }

  // The daemon's decision at target mass `target`.
  std::vector<TokenChoice> Choose(const Group& g, double target) const {
    const int64_t T = ctx_.shape.context;
    std::vector<uint8_t> keep(T, 0);
    const std::span<const float> scores(g.scores);
    const std::span<const uint8_t> protect(g.protect);
    const int64_t step = options_.scope == SelectScope::kBlock ? options_.block_tokens : T;
    for (int64_t first = 0; first < T; first += step) {
      const int64_t n = std::min(step, T - first);
      const importance::Selection s =
          SelectByMass(scores.subspan(first, n), target, protect.subspan(first, n));
      std::copy(s.keep.begin(), s.keep.end(), keep.begin() + first);
    }
    std::vector<TokenChoice> c(T, TokenChoice::kPruned);
    for (int64_t t = 0; t < T; ++t) {
      if (!keep[t]) continue;
      c[t] = g.protect[t] || !options_.int8 ? TokenChoice::kFull : TokenChoice::kInt8;
    }
    return c;
  }

  std::vector<TokenChoice> Fit(const Group& g, uint64_t budget) const {
    // The largest selection: every token (SelectByMass at target 1 keeps
    // every token with a positive score; this also keeps the zeros).
    std::vector<TokenChoice> all(ctx_.shape.context);
    for (int64_t t = 0; t < ctx_.shape.context; ++t) {
      all[t] = g.protect[t] || !options_.int8 ? TokenChoice::kFull : TokenChoice::kInt8;
    }
    if (Bytes(all) <= budget) return options_.int8 ? Promote(g, std::move(all), budget) : all;
    double lo = 0;
    double hi = 1;
    std::vector<TokenChoice> best;
    for (int i = 0; i < 48; ++i) {
      const double mid = 0.5 * (lo + hi);
      std::vector<TokenChoice> c = Choose(g, mid);
      if (Bytes(c) <= budget) {
        lo = mid;
        best = std::move(c);
      } else {
        hi = mid;
      }
    }
    if (!best.empty()) return best;
    // Not even the smallest selection fits: the protected tokens alone.
    best.assign(ctx_.shape.context, TokenChoice::kPruned);
    for (int64_t t = 0; t < ctx_.shape.context; ++t) {
      if (g.protect[t]) best[t] = TokenChoice::kFull;
    }
    return best;
  }

  // Everything is kept: spend what is left of the budget promoting INT8
  // tokens to FP16, highest score first (the most promotions that fit).
  std::vector<TokenChoice> Promote(const Group& g, std::vector<TokenChoice> c,
                                   uint64_t budget) const {
    std::vector<int32_t> order;
    for (size_t t = 0; t < c.size(); ++t) {
      if (c[t] == TokenChoice::kInt8) order.push_back(static_cast<int32_t>(t));
    }
    std::stable_sort(order.begin(), order.end(), [&](int32_t a, int32_t b) {
      return g.scores[a] != g.scores[b] ? g.scores[a] > g.scores[b] : a > b;
    });
    auto with = [&](size_t count) {
      std::vector<TokenChoice> p = c;
      for (size_t i = 0; i < count; ++i) p[order[i]] = TokenChoice::kFull;
      return p;
    };
    // All of them first: a last INT8 token in a key-scale group costs more
    // than FP16 (its group's scales), so bytes are not monotonic there.
    if (Bytes(with(order.size())) <= budget) return with(order.size());
    size_t lo = 0;
    size_t hi = order.size();
    while (lo < hi) {  // largest count that fits (bytes grow with count but for a freed group)
      const size_t mid = (lo + hi + 1) / 2;
      if (Bytes(with(mid)) <= budget) {
        lo = mid;
      } else {
        hi = mid - 1;
      }
    }
    return with(lo);
  }

  PolicyContext ctx_;
  ImportanceOptions options_;
  std::string name_;
  AccountingShape unit_shape_;
  std::vector<Group> groups_;
};

}  // namespace

std::vector<int> DaemonNoveltyLayers(int num_layers) {
  std::vector<int> layers;
  if (num_layers <= 4) {
    for (int l = 0; l < num_layers; ++l) layers.push_back(l);
  } else {
    for (int i = 0; i < 4; ++i) layers.push_back((2 * i + 1) * num_layers / 8);
  }
  return layers;
}

std::vector<float> GroupActivity(const PastAttention& past, const std::vector<int64_t>& units,
                                 const ImportanceOptions& o, std::span<const float> novelty,
                                 importance::Calibrator* calibrator, bool unprotected_only) {
  const int64_t T = past.context;
  const int64_t R = past.options.report_every;
  const int64_t bt = o.block_tokens;
  std::vector<float> activity(T, 0.0f);
  std::vector<float> mass(T);
  if (o.activity == ActivityMode::kAccumulate) {
    std::fill(mass.begin(), mass.end(), 0.0f);
    for (int64_t r = 0; r < past.reports; ++r) {
      for (int64_t u : units) {
        const float* m = past.report_mass[u].data() + r * T;
        for (int64_t j = 0; j < T; ++j) mass[j] += m[j];
      }
    }
    return Observe(mass, o);
  }
  std::vector<uint8_t> seen((T + bt - 1) / bt, 0);
  const double elapsed = static_cast<double>(R) * o.seconds_per_token;
  for (int64_t r = 0; r < past.reports; ++r) {
    const int64_t n = std::min((r + 1) * R, T);
    std::fill(mass.begin(), mass.begin() + n, 0.0f);
    for (int64_t u : units) {
      const float* m = past.report_mass[u].data() + r * T;
      for (int64_t j = 0; j < n; ++j) mass[j] += m[j];
    }
    const std::vector<float> observed = Observe(std::span<const float>(mass.data(), n), o);
    const int64_t cached_blocks = n / bt;
    for (int64_t b = 0; b < cached_blocks; ++b) {
      const double e = seen[b] ? elapsed : 0.0;
      for (int64_t j = b * bt; j < (b + 1) * bt; ++j) {
        if (calibrator != nullptr &&
            !(unprotected_only && IsStructurallyProtected(o.params, j, n))) {
          calibrator->Add({.activity = DecayActivity(activity[j], e, o.half_life_seconds, 0, 0),
                           .position = kernels::PositionFactor(j, n, o.params),
                           .novelty = std::min(novelty[j], 1.0f),
                           .observed = observed[j]});
        }
        activity[j] =
            DecayActivity(activity[j], e, o.half_life_seconds, observed[j], o.activity_weight);
      }
      seen[b] = 1;
    }
  }
  return activity;
}

CalibrationOutcome CalibrateWeights(const PolicyContext& ctx, const ImportanceOptions& options,
                                    CalibrationMode mode) {
  CalibrationOutcome out;
  if (mode == CalibrationMode::kOff) return out;
  std::vector<int64_t> units(ctx.shape.units());
  std::iota(units.begin(), units.end(), 0);
  const std::vector<float> novelty = GroupNovelty(ctx, options, -1);
  importance::Calibrator calibrator;
  GroupActivity(*ctx.past, units, options, novelty, &calibrator,
                mode == CalibrationMode::kUnprotected);
  const importance::FitResult fit = importance::FitWeights(calibrator.samples(), 256);
  out.ok = fit.ok;
  out.weights = fit.weights;
  out.correlation = fit.correlation;
  out.samples = calibrator.size();
  return out;
}

std::unique_ptr<RetentionPolicy> MakeImportancePolicy(const PolicyContext& ctx,
                                                      const ImportanceOptions& options,
                                                      std::string name) {
  return std::make_unique<ImportancePolicy>(ctx, options, std::move(name));
}

}  // namespace kvcache::eval
