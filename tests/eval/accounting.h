// kvcache-eval: what a retention plan costs in bytes.
//
// A RetentionPlan says, for every kv unit (one (layer, kv head) slice of the
// context), which token positions are kept and which of those are stored as
// INT8. Every byte is counted:
//   * full-precision tokens: K and V in FP16, 2 * head_dim * 2 bytes;
//   * INT8 tokens: K and V codes, 2 * head_dim bytes, plus the value scale,
//     one fp32 per token (values are quantized per token);
//   * key scales: keys are quantized per channel over a group of
//     `scale_group` consecutive positions (the daemon's block), so each
//     group holding at least one INT8 token costs head_dim fp32 scales;
//   * kept-position indices: 4 bytes per kept token, per list, for a list
//     that leaves something out. A plan whose
//     positions are the same in every unit (kShared) stores one list; one
//     with a list per unit (kPerUnit) stores one per unit; kNone is for plans
//     whose positions need no list (everything kept, or contiguous ranges).
// The budget of a comparison is a fraction of the full-FP16 bytes
// (FullFp16Bytes): every token of every unit in FP16, no indices.
//
// Thread-safety: pure functions.
#ifndef KVCACHE_TESTS_EVAL_ACCOUNTING_H_
#define KVCACHE_TESTS_EVAL_ACCOUNTING_H_

#include <cstdint>
#include <span>
#include <vector>

namespace kvcache::eval {

struct AccountingShape {
  int layers = 0;
  int kv_heads = 0;
  int head_dim = 0;
  int64_t context = 0;
  int64_t scale_group = 64;  // positions per key-scale group

  int64_t units() const { return static_cast<int64_t>(layers) * kv_heads; }
};

enum class IndexCost { kNone, kPerUnit, kShared };

struct UnitPlan {
  std::vector<int32_t> kept;  // strictly increasing positions in [0, context)
  std::vector<uint8_t> int8;  // empty (all full precision) or one flag per kept token
};

struct RetentionPlan {
  std::vector<UnitPlan> units;  // layer * kv_heads + kv head
  IndexCost index_cost = IndexCost::kPerUnit;
};

struct ByteCounts {
  uint64_t fp16 = 0;          // full-precision K and V
  uint64_t int8_codes = 0;    // INT8 K and V codes
  uint64_t key_scales = 0;    // per channel per group
  uint64_t value_scales = 0;  // per token
  uint64_t indices = 0;       // kept-position lists

  uint64_t total() const { return fp16 + int8_codes + key_scales + value_scales + indices; }
  ByteCounts& operator+=(const ByteCounts& o);
};

// Bytes of the whole context in FP16 (the 1.0 of every budget).
uint64_t FullFp16Bytes(const AccountingShape& shape);

// Payload bytes of one unit: `full` FP16 tokens, `int8` INT8 tokens spread
// over `int8_groups` key-scale groups. No indices.
ByteCounts UnitPayloadBytes(const AccountingShape& shape, int64_t full, int64_t int8,
                            int64_t int8_groups);

// Key-scale groups that hold at least one INT8 token of `unit`.
int64_t Int8Groups(const AccountingShape& shape, const UnitPlan& unit);

// Every byte of `plan`.
// REQUIRES: plan.units.size() == shape.units().
ByteCounts CountBytes(const AccountingShape& shape, const RetentionPlan& plan);

// Per-token precision of a decision shared by every unit.
enum class TokenChoice : uint8_t { kPruned = 0, kFull = 1, kInt8 = 2 };

// Bytes of the plan that applies `choices` (one per context position) to
// every unit, with one shared index list when anything is pruned.
ByteCounts SharedDecisionBytes(const AccountingShape& shape, std::span<const TokenChoice> choices);

// The plan that applies `choices` to every unit.
RetentionPlan SharedDecisionPlan(const AccountingShape& shape,
                                 std::span<const TokenChoice> choices);

}  // namespace kvcache::eval

#endif  // KVCACHE_TESTS_EVAL_ACCOUNTING_H_
