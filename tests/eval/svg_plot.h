// kvcache-eval: a hand-written SVG line plot of fidelity against bytes.
//
// Two panels share the x axis (bytes as a fraction of full FP16): the
// attention-output relative error (log scale; an exact 0 is drawn on the
// bottom edge) and the retained attention mass without the sink token. Each
// budgeted policy is a line through its budgets; single operating points
// are open markers. Self-contained SVG 1.1, no scripts, no external fonts.
//
// Thread-safety: pure functions.
#ifndef KVCACHE_TESTS_EVAL_SVG_PLOT_H_
#define KVCACHE_TESTS_EVAL_SVG_PLOT_H_

#include <string>
#include <vector>

#include "absl/status/status.h"
#include "tests/eval/report.h"

namespace kvcache::eval {

std::string RenderSvg(const std::vector<ResultRow>& rows, const std::string& title);

absl::Status WriteSvg(const std::string& path, const std::vector<ResultRow>& rows,
                      const std::string& title);

}  // namespace kvcache::eval

#endif  // KVCACHE_TESTS_EVAL_SVG_PLOT_H_
