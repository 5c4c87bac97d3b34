// kvcache-eval: what a retention plan costs in attention fidelity.
//
// The held-out future queries attend to the compressed cache (and, query f,
// to the f + 1 new tokens after it, uncompressed): each kv
// unit's kept keys and values are gathered (kernels::GatherTokensCpu), the
// INT8 ones quantized and dequantized to FP16 exactly as the daemon stores
// and decodes them (kernels::QuantizeInt8Cpu / DequantizeInt8Cpu; keys per
// channel over each group of `scale_group` positions' INT8 tokens, values
// per token), and kernels::ReferenceAttentionCpu computes the output. Per
// query head, over its future queries:
//   output_error       sqrt(sum |o_c - o|^2 / sum |o|^2)   (relative error)
//   output_error_vrms  sqrt(mean |o_c - o|^2) / RMS(|v|)   (error in units
//                      of a typical value vector; robust when |o| is small)
//   mass               share of the context's attention mass (full
//                      weights) that falls on kept tokens
//   mass_no_sink       the same without the first token (kept mass and
//                      context mass both without it)
//   recall             share of the true top-k context positions that are kept
// Every figure is the mean over query heads of all layers. INT8 element
// error is sqrt(sum (x' - x)^2 / sum x^2) over the INT8 tokens' keys
// (values), -1 without INT8 tokens.
//
// Thread-safety: pure function; work is split over `threads` threads.
#ifndef KVCACHE_TESTS_EVAL_METRICS_H_
#define KVCACHE_TESTS_EVAL_METRICS_H_

#include "absl/status/statusor.h"
#include "tests/eval/accounting.h"
#include "tests/eval/attention_pass.h"
#include "tests/eval/dataset.h"

namespace kvcache::eval {

struct PlanMetrics {
  ByteCounts bytes;
  double bytes_fraction = 0;  // of FullFp16Bytes
  double kept_fraction = 0;   // kept tokens / context tokens, mean over units
  double int8_fraction = 0;   // INT8 tokens / context tokens, mean over units
  double output_error = 0;
  double output_error_vrms = 0;
  double mass = 0;
  double mass_no_sink = 0;
  double recall = 0;
  double key_rel_rmse = -1;
  double value_rel_rmse = -1;
};

// REQUIRES: plan.units.size() == shape.units(); ref computed for shape.context.
absl::StatusOr<PlanMetrics> EvaluatePlan(const KvDataset& data, const FutureReference& ref,
                                         const AccountingShape& shape, const RetentionPlan& plan,
                                         int threads);

}  // namespace kvcache::eval

#endif  // KVCACHE_TESTS_EVAL_METRICS_H_
