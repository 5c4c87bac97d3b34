#include "tests/eval/policies.h"

#include <algorithm>
#include <numeric>
#include <vector>

namespace kvcache::eval {
namespace {

// Token positions sorted, from a keep mask.
std::vector<int32_t> FromMask(const std::vector<uint8_t>& keep) {
  std::vector<int32_t> kept;
  for (size_t t = 0; t < keep.size(); ++t) {
    if (keep[t]) kept.push_back(static_cast<int32_t>(t));
  }
  return kept;
}

// Marks the `count` highest-scoring positions of [0, end) in `keep` (ties: later first).
void KeepTop(const float* score, int64_t end, int64_t count, std::vector<uint8_t>* keep) {
  if (count <= 0 || end <= 0) return;
  std::vector<int32_t> order(end);
  std::iota(order.begin(), order.end(), 0);
  count = std::min(count, end);
  std::partial_sort(order.begin(), order.begin() + count, order.end(), [&](int32_t a, int32_t b) {
    return score[a] != score[b] ? score[a] > score[b] : a > b;
  });
  for (int64_t i = 0; i < count; ++i) (*keep)[order[i]] = 1;
}

class SimplePolicy : public RetentionPolicy {
 public:
  SimplePolicy(std::string name, const PolicyContext& ctx) : name_(std::move(name)), ctx_(ctx) {}
  const std::string& name() const override { return name_; }

 protected:
  std::string name_;
  PolicyContext ctx_;
};

// Keeps every token: at full precision ("full") or all as INT8 ("int8").
class KeepAllPolicy final : public SimplePolicy {
 public:
  KeepAllPolicy(std::string name, const PolicyContext& ctx, bool int8)
      : SimplePolicy(std::move(name), ctx), int8_(int8) {}
  bool budgeted() const override { return false; }
  RetentionPlan Plan(uint64_t) const override {
    UnitPlan all;
    all.kept.resize(ctx_.shape.context);
    std::iota(all.kept.begin(), all.kept.end(), 0);
    if (int8_) all.int8.assign(ctx_.shape.context, 1);
    RetentionPlan plan;
    plan.index_cost = IndexCost::kNone;
    plan.units.assign(ctx_.shape.units(), all);
    return plan;
  }

 private:
  const bool int8_;
};

class StreamingPolicy final : public SimplePolicy {
 public:
  StreamingPolicy(const PolicyContext& ctx, int64_t sinks)
      : SimplePolicy("streaming", ctx), sinks_(sinks) {}
  bool budgeted() const override { return true; }
  RetentionPlan Plan(uint64_t budget) const override {
    const AccountingShape& s = ctx_.shape;
    // Two contiguous ranges: no index list.
    const int64_t n = std::max<int64_t>(1, TokensPerUnit(s, budget, 4u * s.head_dim));
    std::vector<uint8_t> keep(s.context, 0);
    const int64_t sinks = std::min(sinks_, n);
    for (int64_t t = 0; t < sinks; ++t) keep[t] = 1;
    for (int64_t t = s.context - (n - sinks); t < s.context; ++t) keep[t] = 1;
    RetentionPlan plan;
    plan.index_cost = IndexCost::kNone;
    plan.units.assign(s.units(), UnitPlan{FromMask(keep), {}});
    return plan;
  }

 private:
  int64_t sinks_;
};

class H2oPolicy final : public SimplePolicy {
 public:
  using SimplePolicy::SimplePolicy;
  bool budgeted() const override { return true; }
  RetentionPlan Plan(uint64_t budget) const override {
    const AccountingShape& s = ctx_.shape;
    const int64_t n = std::max<int64_t>(1, SparseTokensPerUnit(s, budget));
    RetentionPlan plan;
    plan.index_cost = n >= s.context ? IndexCost::kNone : IndexCost::kPerUnit;
    plan.units.resize(s.units());
    for (int64_t u = 0; u < s.units(); ++u) {
      std::vector<uint8_t> keep(s.context, 0);
      const int64_t heavy = n / 2;
      const int64_t recent = n - heavy;
      for (int64_t t = s.context - recent; t < s.context; ++t) keep[t] = 1;
      KeepTop(ctx_.past->accumulated[u].data(), s.context - recent, heavy, &keep);
      plan.units[u].kept = FromMask(keep);
    }
    return plan;
  }
};

class SnapKvPolicy final : public SimplePolicy {
 public:
  SnapKvPolicy(const PolicyContext& ctx, int64_t window, int64_t pool)
      : SimplePolicy("snapkv", ctx), window_(window), pool_(pool) {}
  bool budgeted() const override { return true; }
  RetentionPlan Plan(uint64_t budget) const override {
    const AccountingShape& s = ctx_.shape;
    const int64_t n = std::max<int64_t>(1, SparseTokensPerUnit(s, budget));
    RetentionPlan plan;
    plan.index_cost = n >= s.context ? IndexCost::kNone : IndexCost::kPerUnit;
    plan.units.resize(s.units());
    const int64_t window = std::min({window_, n, s.context});
    const int64_t prefix = s.context - window;
    std::vector<float> pooled(prefix);
    for (int64_t u = 0; u < s.units(); ++u) {
      const float* score = ctx_.past->window[u].data();
      const int64_t half = pool_ / 2;
      for (int64_t t = 0; t < prefix; ++t) {
        double sum = 0;
        int64_t count = 0;
        for (int64_t j = std::max<int64_t>(0, t - half); j <= std::min(prefix - 1, t + half); ++j) {
          sum += score[j];
          ++count;
        }
        pooled[t] = static_cast<float>(sum / static_cast<double>(std::max<int64_t>(count, 1)));
      }
      std::vector<uint8_t> keep(s.context, 0);
      for (int64_t t = prefix; t < s.context; ++t) keep[t] = 1;
      KeepTop(pooled.data(), prefix, n - window, &keep);
      plan.units[u].kept = FromMask(keep);
    }
    return plan;
  }

 private:
  int64_t window_;
  int64_t pool_;
};

}  // namespace

int64_t TokensPerUnit(const AccountingShape& shape, uint64_t budget_bytes,
                      uint64_t bytes_per_token) {
  const uint64_t per_unit = budget_bytes / static_cast<uint64_t>(shape.units());
  return static_cast<int64_t>(
      std::min<uint64_t>(per_unit / bytes_per_token, static_cast<uint64_t>(shape.context)));
}

int64_t SparseTokensPerUnit(const AccountingShape& shape, uint64_t budget_bytes) {
  const uint64_t fp16 = 4u * static_cast<uint64_t>(shape.head_dim);
  // Everything kept needs no index list.
  if (TokensPerUnit(shape, budget_bytes, fp16) >= shape.context) return shape.context;
  return TokensPerUnit(shape, budget_bytes, fp16 + 4u);
}

std::unique_ptr<RetentionPolicy> MakeFullPolicy(const PolicyContext& ctx) {
  return std::make_unique<KeepAllPolicy>("full", ctx, false);
}
std::unique_ptr<RetentionPolicy> MakeInt8Policy(const PolicyContext& ctx) {
  return std::make_unique<KeepAllPolicy>("int8", ctx, true);
}
std::unique_ptr<RetentionPolicy> MakeStreamingPolicy(const PolicyContext& ctx, int64_t sinks) {
  return std::make_unique<StreamingPolicy>(ctx, sinks);
}
std::unique_ptr<RetentionPolicy> MakeH2oPolicy(const PolicyContext& ctx) {
  return std::make_unique<H2oPolicy>("h2o", ctx);
}
std::unique_ptr<RetentionPolicy> MakeSnapKvPolicy(const PolicyContext& ctx, int64_t window,
                                                  int64_t pool) {
  return std::make_unique<SnapKvPolicy>(ctx, window, pool);
}

}  // namespace kvcache::eval
