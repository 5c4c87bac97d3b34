#include "tests/eval/accounting.h"

namespace kvcache::eval {

ByteCounts& ByteCounts::operator+=(const ByteCounts& o) {
  fp16 += o.fp16;
  int8_codes += o.int8_codes;
  key_scales += o.key_scales;
  value_scales += o.value_scales;
  indices += o.indices;
  return *this;
}

uint64_t FullFp16Bytes(const AccountingShape& shape) {
  return static_cast<uint64_t>(shape.units()) * static_cast<uint64_t>(shape.context) * 2u *
         static_cast<uint64_t>(shape.head_dim) * 2u;
}

ByteCounts UnitPayloadBytes(const AccountingShape& shape, int64_t full, int64_t int8,
                            int64_t int8_groups) {
  const uint64_t d = static_cast<uint64_t>(shape.head_dim);
  ByteCounts b;
  b.fp16 = static_cast<uint64_t>(full) * 2u * d * 2u;
  b.int8_codes = static_cast<uint64_t>(int8) * 2u * d;
  b.value_scales = static_cast<uint64_t>(int8) * 4u;
  b.key_scales = static_cast<uint64_t>(int8_groups) * d * 4u;
  return b;
}

int64_t Int8Groups(const AccountingShape& shape, const UnitPlan& unit) {
  int64_t groups = 0;
  int64_t last = -1;
  for (size_t i = 0; i < unit.int8.size(); ++i) {
    if (unit.int8[i] == 0) continue;
    const int64_t g = unit.kept[i] / shape.scale_group;
    if (g != last) {
      ++groups;
      last = g;
    }
  }
  return groups;
}

ByteCounts CountBytes(const AccountingShape& shape, const RetentionPlan& plan) {
  ByteCounts total;
  for (const UnitPlan& u : plan.units) {
    int64_t int8 = 0;
    for (uint8_t f : u.int8) int8 += f != 0;
    const int64_t full = static_cast<int64_t>(u.kept.size()) - int8;
    total += UnitPayloadBytes(shape, full, int8, Int8Groups(shape, u));
    if (plan.index_cost == IndexCost::kPerUnit &&
        static_cast<int64_t>(u.kept.size()) < shape.context) {
      total.indices += 4u * u.kept.size();
    }
  }
  if (plan.index_cost == IndexCost::kShared && !plan.units.empty() &&
      static_cast<int64_t>(plan.units[0].kept.size()) < shape.context) {
    total.indices += 4u * plan.units[0].kept.size();
  }
  return total;
}

ByteCounts SharedDecisionBytes(const AccountingShape& shape, std::span<const TokenChoice> choices) {
  int64_t full = 0;
  int64_t int8 = 0;
  int64_t groups = 0;
  int64_t last = -1;
  for (size_t t = 0; t < choices.size(); ++t) {
    if (choices[t] == TokenChoice::kFull) ++full;
    if (choices[t] != TokenChoice::kInt8) continue;
    ++int8;
    const int64_t g = static_cast<int64_t>(t) / shape.scale_group;
    if (g != last) {
      ++groups;
      last = g;
    }
  }
  const ByteCounts one = UnitPayloadBytes(shape, full, int8, groups);
  const uint64_t units = static_cast<uint64_t>(shape.units());
  ByteCounts b;
  b.fp16 = one.fp16 * units;
  b.int8_codes = one.int8_codes * units;
  b.key_scales = one.key_scales * units;
  b.value_scales = one.value_scales * units;
  const int64_t kept = full + int8;
  if (kept < static_cast<int64_t>(choices.size())) b.indices = 4u * static_cast<uint64_t>(kept);
  return b;
}

RetentionPlan SharedDecisionPlan(const AccountingShape& shape,
                                 std::span<const TokenChoice> choices) {
  UnitPlan unit;
  bool any_int8 = false;
  for (size_t t = 0; t < choices.size(); ++t) {
    if (choices[t] == TokenChoice::kPruned) continue;
    unit.kept.push_back(static_cast<int32_t>(t));
    unit.int8.push_back(choices[t] == TokenChoice::kInt8 ? 1 : 0);
    any_int8 = any_int8 || choices[t] == TokenChoice::kInt8;
  }
  if (!any_int8) unit.int8.clear();
  RetentionPlan plan;
  plan.index_cost = static_cast<int64_t>(unit.kept.size()) < static_cast<int64_t>(choices.size())
                        ? IndexCost::kShared
                        : IndexCost::kNone;
  plan.units.assign(shape.units(), unit);
  return plan;
}

}  // namespace kvcache::eval
