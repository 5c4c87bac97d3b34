// kvcache-eval: KV retention policies compared at equal byte budgets.
//
// A RetentionPolicy turns a byte budget into a RetentionPlan (accounting.h):
// which positions each kv unit keeps, and at which precision. Policies see
// only the context's keys and values and the past queries' attention
// (attention_pass.h), never the held-out future queries. Each keeps as many
// tokens as fit in the budget; per-unit policies split the budget evenly
// over the kv units, as the published algorithms do.
//
//   full       every token in FP16 (one operating point, 1.0)
//   int8       every token INT8 (keys per channel per group, values per
//              token; one operating point)
//   streaming  StreamingLLM: `sinks` first tokens + the most recent ones
//   h2o        H2O: half the kept tokens by attention accumulated over every
//              past query ("heavy hitters"), half the most recent
//   snapkv     SnapKV: the last `window` queries' attention, average-pooled
//              over `pool` neighbouring positions, selects the kept tokens;
//              the window's own tokens are always kept
// The importance-aware policy (the daemon's rules) is in importance_policy.h.
//
// Thread-safety: Plan() is const and safe to call concurrently; a policy
// holds pointers into the PolicyContext's data, which must outlive it.
#ifndef KVCACHE_TESTS_EVAL_POLICIES_H_
#define KVCACHE_TESTS_EVAL_POLICIES_H_

#include <cstdint>
#include <memory>
#include <string>

#include "tests/eval/accounting.h"
#include "tests/eval/attention_pass.h"
#include "tests/eval/dataset.h"

namespace kvcache::eval {

struct PolicyContext {
  const KvDataset* data = nullptr;
  const PastAttention* past = nullptr;
  AccountingShape shape;  // shape.context is the cached context
};

class RetentionPolicy {
 public:
  virtual ~RetentionPolicy() = default;
  virtual const std::string& name() const = 0;
  // False for a policy with a single operating point: Plan ignores the budget.
  virtual bool budgeted() const = 0;
  // The plan for `budget_bytes`. It never exceeds the budget unless even the
  // policy's smallest plan does (then it returns that smallest plan).
  virtual RetentionPlan Plan(uint64_t budget_bytes) const = 0;
};

std::unique_ptr<RetentionPolicy> MakeFullPolicy(const PolicyContext& ctx);
std::unique_ptr<RetentionPolicy> MakeInt8Policy(const PolicyContext& ctx);
std::unique_ptr<RetentionPolicy> MakeStreamingPolicy(const PolicyContext& ctx, int64_t sinks);
std::unique_ptr<RetentionPolicy> MakeH2oPolicy(const PolicyContext& ctx);
std::unique_ptr<RetentionPolicy> MakeSnapKvPolicy(const PolicyContext& ctx, int64_t window,
                                                  int64_t pool);

// Kept tokens per unit that fit `budget_bytes` split over the units, at
// `bytes_per_token` each (capped at the context).
int64_t TokensPerUnit(const AccountingShape& shape, uint64_t budget_bytes,
                      uint64_t bytes_per_token);

// Kept FP16 tokens per unit of a sparse policy: the whole context when it
// fits (no index list needed), else tokens of FP16 payload + a 4-byte index.
int64_t SparseTokensPerUnit(const AccountingShape& shape, uint64_t budget_bytes);

}  // namespace kvcache::eval

#endif  // KVCACHE_TESTS_EVAL_POLICIES_H_
