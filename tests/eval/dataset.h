// kvcache-eval: the data every evaluation runs on.
//
// A KvDataset is one sequence's attention inputs for every layer: queries,
// keys and values after rotary embedding, as a model produced them (or as
// the synthetic generator made them). Tokens [0, context) are the cached
// sequence the retention policies compress; the queries of the remaining
// `future` tokens are held out and only used to measure what a policy costs
// (their own keys and values are never part of the cache).
//
// Layout per layer, row-major fp32 (values exactly representable in the
// dump's dtype, so "full FP16" is the reference itself):
//   q[layer]  [q_heads][tokens][head_dim]
//   k[layer]  [kv_heads][tokens][head_dim]
//   v[layer]  [kv_heads][tokens][head_dim]
// q_heads is a multiple of kv_heads (grouped-query attention): query head h
// reads kv head h / (q_heads / kv_heads).
//
// Thread-safety: a KvDataset is a plain value; concurrent reads are safe.
#ifndef KVCACHE_TESTS_EVAL_DATASET_H_
#define KVCACHE_TESTS_EVAL_DATASET_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"

namespace kvcache::eval {

struct KvShape {
  int layers = 0;
  int q_heads = 0;
  int kv_heads = 0;
  int head_dim = 0;
  int64_t tokens = 0;  // context + future

  int group() const { return kv_heads > 0 ? q_heads / kv_heads : 0; }
};

struct KvDataset {
  KvShape shape;
  std::vector<std::vector<float>> q;  // per layer, [q_heads][tokens][head_dim]
  std::vector<std::vector<float>> k;  // per layer, [kv_heads][tokens][head_dim]
  std::vector<std::vector<float>> v;  // per layer, [kv_heads][tokens][head_dim]
  std::string description;            // where the data came from, for reports

  // Row `token` of query head `head` of `layer` (head_dim floats).
  const float* Query(int layer, int head, int64_t token) const;
  // Start of kv head `head` of `layer`: [tokens][head_dim], rows contiguous.
  const float* Keys(int layer, int head) const;
  const float* Values(int layer, int head) const;

  // INVALID_ARGUMENT naming the field when a dimension is not positive,
  // q_heads is not a multiple of kv_heads, or a tensor has the wrong size.
  absl::Status Validate() const;
};

// Splits tokens into the cached context and held-out future queries.
struct EvalSplit {
  int64_t context = 0;
  int64_t future = 0;
};

// INVALID_ARGUMENT unless 1 <= future and context = tokens - future >= 2.
absl::Status CheckSplit(const KvShape& shape, int64_t future);

}  // namespace kvcache::eval

#endif  // KVCACHE_TESTS_EVAL_DATASET_H_
