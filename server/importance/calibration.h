// Online calibration of the importance weights (alpha, beta, gamma).
//
// Each attention report a worker sends tells what attention tokens actually
// received. Before the report is folded into the tokens' activity, the
// daemon records for a sample of tokens the features the score had at that
// moment (activity, position factor, novelty) and the attention the report
// observed (normalised to [0, 1]): a CalibrationSample. Periodically
// (default every 30 minutes) the weights are refitted so the score predicts
// the attention tokens later receive.
//
// The fit: non-negative least squares of observed ~ a*activity + b*position
// + g*novelty (no intercept), solved exactly by trying every subset of the
// three features (an active-set enumeration), then normalised so a+b+g = 1
// (the keep decision, SelectByMass, is invariant to scaling the scores). A
// fit with all weights 0 (nothing explains the observations) is not applied.
// The step toward the fit is bounded: no weight moves by more than max_step
// in one refit (the step is taken along the line from the current weights to
// the fit, so the result still sums to 1), so one odd sample cannot swing the
// policy.
//
// Thread-safety: Calibrator is not thread-safe; its owner serialises calls.
// FitWeights and StepToward are pure.
#ifndef KVCACHE_SERVER_IMPORTANCE_CALIBRATION_H_
#define KVCACHE_SERVER_IMPORTANCE_CALIBRATION_H_

#include <cstddef>
#include <cstdint>
#include <random>
#include <span>
#include <vector>

namespace kvcache::importance {

struct CalibrationSample {
  float activity = 0;  // features at report time, each in [0, 1]
  float position = 0;
  float novelty = 0;
  float observed = 0;  // normalised attention the report observed, in [0, 1]
};

struct Weights {
  float alpha = 0.6f;
  float beta = 0.3f;
  float gamma = 0.1f;
};

struct FitResult {
  bool ok = false;         // false: too few samples or a degenerate fit
  Weights weights;         // normalised to sum 1 when ok
  double mse_fitted = 0;   // mean squared error of the (unnormalised) fit
  double correlation = 0;  // Pearson correlation of fitted score vs observed
};

// Fits weights to `samples`. ok is false with fewer than `min_samples`
// samples, or when the best non-negative fit is all zeros.
FitResult FitWeights(std::span<const CalibrationSample> samples, size_t min_samples);

// `current` moved toward `target` along the straight line between them (both
// first normalised to sum 1), by the largest fraction of the way that moves no
// weight by more than max_step (a non-finite or negative max_step counts as 0);
// the result sums to 1 and weights stay >= 0. Non-finite or negative weights
// count as 0; a side with no positive weight is replaced by the other (both:
// the default Weights).
Weights StepToward(const Weights& current, const Weights& target, float max_step);

// Pearson correlation between a*activity + b*position + g*novelty and
// observed over the samples; 0 when either side has no variance.
double ScoreCorrelation(std::span<const CalibrationSample> samples, const Weights& weights);

// A bounded reservoir of recent samples (uniform over everything added since
// the last Clear, Vitter's algorithm R).
class Calibrator {
 public:
  explicit Calibrator(size_t capacity = 8192, uint64_t seed = 0x6b7663616368);

  void Add(const CalibrationSample& sample);
  size_t size() const { return samples_.size(); }
  uint64_t seen() const { return seen_; }
  std::span<const CalibrationSample> samples() const { return samples_; }
  void Clear();

 private:
  size_t capacity_;
  uint64_t seen_ = 0;
  std::vector<CalibrationSample> samples_;
  std::mt19937_64 rng_;
};

}  // namespace kvcache::importance

#endif  // KVCACHE_SERVER_IMPORTANCE_CALIBRATION_H_
