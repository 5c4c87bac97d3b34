// kvcache-eval: the results table (markdown on stdout), the CSV file and the
// acceptance-target checks.
//
// A ResultRow is one policy at one budget (budget < 0: the policy's single
// operating point). Thread-safety: pure functions (writers touch only their
// own file).
#ifndef KVCACHE_TESTS_EVAL_REPORT_H_
#define KVCACHE_TESTS_EVAL_REPORT_H_

#include <cstdio>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "tests/eval/metrics.h"

namespace kvcache::eval {

struct ResultRow {
  std::string policy;
  double budget = -1;  // requested fraction of FP16 bytes; < 0: single operating point
  PlanMetrics m;
};

// Markdown tables: one per budget (policies side by side), then the single
// operating points.
void PrintResults(std::FILE* out, const std::vector<ResultRow>& rows,
                  const std::vector<double>& budgets);

// One line per row, every metric and every byte category.
absl::Status WriteCsv(const std::string& path, const std::vector<ResultRow>& rows);

struct TargetCheck {
  std::string target;
  std::string measured;
  bool met = false;
  bool evaluated = false;  // false: the rows needed are missing
};

// The acceptance targets (docs/importance.md): INT8 alone, ours vs H2O at
// `budget_point` (0.37), and gamma's cost or gain (`redundant` selects
// which: a win on the redundancy-heavy profile, <= 1% cost otherwise).
std::vector<TargetCheck> CheckTargets(const std::vector<ResultRow>& rows, double budget_point,
                                      bool redundant, bool outlier_channels);

void PrintTargets(std::FILE* out, const std::vector<TargetCheck>& checks);

}  // namespace kvcache::eval

#endif  // KVCACHE_TESTS_EVAL_REPORT_H_
