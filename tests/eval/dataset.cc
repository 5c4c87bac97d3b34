#include "tests/eval/dataset.h"

#include "absl/strings/str_cat.h"

namespace kvcache::eval {

const float* KvDataset::Query(int layer, int head, int64_t token) const {
  return q[layer].data() + (static_cast<int64_t>(head) * shape.tokens + token) * shape.head_dim;
}

const float* KvDataset::Keys(int layer, int head) const {
  return k[layer].data() + static_cast<int64_t>(head) * shape.tokens * shape.head_dim;
}

const float* KvDataset::Values(int layer, int head) const {
  return v[layer].data() + static_cast<int64_t>(head) * shape.tokens * shape.head_dim;
}

absl::Status KvDataset::Validate() const {
  const KvShape& s = shape;
  if (s.layers <= 0 || s.q_heads <= 0 || s.kv_heads <= 0 || s.head_dim <= 0 || s.tokens <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("every dimension must be positive: layers=", s.layers, " q_heads=", s.q_heads,
                     " kv_heads=", s.kv_heads, " head_dim=", s.head_dim, " tokens=", s.tokens));
  }
  if (s.q_heads % s.kv_heads != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("q_heads (", s.q_heads, ") is not a multiple of kv_heads (", s.kv_heads, ")"));
  }
  if (q.size() != static_cast<size_t>(s.layers) || k.size() != q.size() || v.size() != q.size()) {
    return absl::InvalidArgumentError(absl::StrCat("expected ", s.layers,
                                                   " layers of q, k and v; have ", q.size(), ", ",
                                                   k.size(), ", ", v.size()));
  }
  const size_t qn = static_cast<size_t>(s.q_heads) * s.tokens * s.head_dim;
  const size_t kn = static_cast<size_t>(s.kv_heads) * s.tokens * s.head_dim;
  for (int l = 0; l < s.layers; ++l) {
    if (q[l].size() != qn || k[l].size() != kn || v[l].size() != kn) {
      return absl::InvalidArgumentError(absl::StrCat("layer ", l, ": q/k/v hold ", q[l].size(), "/",
                                                     k[l].size(), "/", v[l].size(),
                                                     " values; expected ", qn, "/", kn, "/", kn));
    }
  }
  return absl::OkStatus();
}

absl::Status CheckSplit(const KvShape& shape, int64_t future) {
  if (future < 1 || shape.tokens - future < 2) {
    return absl::InvalidArgumentError(
        absl::StrCat("--future ", future, " must be >= 1 and leave at least 2 context tokens of ",
                     shape.tokens));
  }
  return absl::OkStatus();
}

}  // namespace kvcache::eval
