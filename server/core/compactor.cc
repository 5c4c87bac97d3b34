// Compactor: what is not a pass over blocks (compactor.h); Compact is in
// importance_compaction.cc, CompactPool in pool_compaction.cc.
#include "server/core/compactor.h"

#include <vector>

#include "server/importance/calibration.h"

namespace kvcache {

std::vector<CalibrationOutcome> Compactor::Calibrate() const {
  std::vector<CalibrationOutcome> outcomes;
  const ImportanceOptions& o = access_.options().importance;
  CacheAccess::Locked locked(access_);
  locked.ForEachMutableModel([&](ModelState& m) {
    if (m.calibrator.size() == 0) return;
    CalibrationOutcome out{.model = m.key, .samples = m.calibrator.size()};
    out.before = {m.policy.params.alpha, m.policy.params.beta, m.policy.params.gamma};
    out.correlation_before = importance::ScoreCorrelation(m.calibrator.samples(), out.before);
    const importance::FitResult fit =
        importance::FitWeights(m.calibrator.samples(), o.calibration_min_samples);
    out.after = out.before;
    if (fit.ok) {
      out.fitted = fit.weights;
      out.after = importance::StepToward(out.before, fit.weights, o.calibration_max_step);
      out.applied = true;
      m.policy.params.alpha = out.after.alpha;
      m.policy.params.beta = out.after.beta;
      m.policy.params.gamma = out.after.gamma;
      ++m.calibrations;
    }
    out.correlation_after = importance::ScoreCorrelation(m.calibrator.samples(), out.after);
    if (fit.ok) m.calibrator.Clear();  // the next refit learns from newer reports
    outcomes.push_back(out);
  });
  return outcomes;
}

}  // namespace kvcache
