#include "server/importance/budget_allocation.h"

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <optional>

#include "absl/strings/str_cat.h"

namespace kvcache::importance {

absl::StatusOr<BudgetAllocation> AllocateBudget(const BlockShape& shape,
                                                std::span<const float> scores,
                                                std::span<const uint8_t> fixed_full,
                                                std::span<const uint8_t> rank_first,
                                                double budget_bytes) {
  const uint64_t entries = shape.entries();
  if (entries == 0) return absl::InvalidArgumentError("budget allocation: invalid block shape");
  for (auto [name, n] : {std::pair<const char*, size_t>{"scores", scores.size()},
                         {"fixed_full", fixed_full.empty() ? entries : fixed_full.size()},
                         {"rank_first", rank_first.empty() ? entries : rank_first.size()}}) {
    if (n != entries) {
      return absl::InvalidArgumentError(absl::StrCat(
          "budget allocation: ", name, " has ", n, " values, the block has ", entries, " entries"));
    }
  }
  auto score = [&](size_t i) { return std::isfinite(scores[i]) ? scores[i] : 0.0f; };
  auto first = [&](size_t i) { return !rank_first.empty() && rank_first[i] != 0; };

  std::vector<TokenPrecision> base(entries, TokenPrecision::kInt8);
  std::vector<uint32_t> order;  // free entries, least important first
  order.reserve(entries);
  for (size_t i = 0; i < entries; ++i) {
    if (!fixed_full.empty() && fixed_full[i] != 0) {
      base[i] = TokenPrecision::kFull;
    } else {
      order.push_back(static_cast<uint32_t>(i));
    }
  }
  std::stable_sort(order.begin(), order.end(), [&](uint32_t a, uint32_t b) {
    if (first(a) != first(b)) return first(b);
    return !first(a) && score(a) < score(b);
  });
  const size_t n = order.size();

  std::vector<TokenPrecision> trial;
  // `start` with the first m entries of `seq` (order or its reverse) set to `p`.
  auto with = [&](const std::vector<TokenPrecision>& start, size_t m, TokenPrecision p,
                  bool reversed) -> const std::vector<TokenPrecision>& {
    trial = start;
    for (size_t j = 0; j < m; ++j) trial[order[reversed ? n - 1 - j : j]] = p;
    return trial;
  };
  auto bytes_of = [&](const std::vector<TokenPrecision>& p) -> uint64_t {
    const absl::StatusOr<uint64_t> size = CompressedSizeV2(shape, p);
    return size.ok() ? *size : UINT64_MAX;
  };
  auto fits = [&](const std::vector<TokenPrecision>& p) {
    return static_cast<double>(bytes_of(p)) <= budget_bytes;
  };
  // The smallest m in [0, n] with predicate(m), searched as the reference does.
  auto smallest = [&](auto predicate) -> std::optional<size_t> {
    size_t lo = 0, hi = n + 1;
    while (lo < hi) {
      const size_t mid = (lo + hi) / 2;
      if (mid <= n && predicate(mid)) {
        hi = mid;
      } else {
        lo = mid + 1;
      }
    }
    return lo <= n ? std::optional<size_t>(lo) : std::nullopt;
  };

  BudgetAllocation out;
  if (fits(base)) {
    const std::optional<size_t> over =
        smallest([&](size_t m) { return !fits(with(base, m, TokenPrecision::kFull, true)); });
    const size_t m = over ? *over - 1 : n;
    out.precision = with(base, m, TokenPrecision::kFull, true);
    out.promoted = static_cast<uint32_t>(m);
  } else if (const std::optional<size_t> m = smallest(
                 [&](size_t m) { return fits(with(base, m, TokenPrecision::kInt4, false)); })) {
    out.precision = with(base, *m, TokenPrecision::kInt4, false);
  } else {
    const std::vector<TokenPrecision> all4 = with(base, n, TokenPrecision::kInt4, false);
    const std::optional<size_t> p =
        smallest([&](size_t m) { return fits(with(all4, m, TokenPrecision::kPruned, false)); });
    out.precision = with(all4, p ? *p : n, TokenPrecision::kPruned, false);
  }
  out.bytes = bytes_of(out.precision);
  out.fits = static_cast<double>(out.bytes) <= budget_bytes;
  for (TokenPrecision p : out.precision) {
    out.int4 += p == TokenPrecision::kInt4;
    out.pruned += p == TokenPrecision::kPruned;
  }
  return out;
}

}  // namespace kvcache::importance
