// Cache: importance-aware retention. Attention reports and policy updates;
// calibration of the score's weights and compaction (re-encoding cold blocks
// with INT8 and pruned tokens) are the Compactor's (compactor.h).
// docs/importance.md explains the model.
#include <algorithm>
#include <cmath>
#include <span>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "server/common/status_macros.h"
#include "server/core/cache.h"
#include "server/importance/scoring.h"

namespace kvcache {

absl::StatusOr<ImportancePolicy> Cache::GetPolicy(const ModelKey& model) const {
  WriteLock lock(this);
  auto state = FindModelLocked(model);
  if (!state.ok()) return state.status();
  return (*state)->policy;
}

absl::StatusOr<PolicyChange> Cache::UpdatePolicy(const ModelKey& model,
                                                 const PolicyUpdate& update) {
  std::vector<BlockRef> dropped;  // released after the lock
  WriteLock lock(this);
  auto state = FindModelLocked(model);
  if (!state.ok()) return state.status();
  ModelState& m = **state;
  ImportancePolicy next = m.policy;
  if (update.mode) next.mode = *update.mode;
  if (update.weights) {
    next.params.alpha = update.weights->alpha;
    next.params.beta = update.weights->beta;
    next.params.gamma = update.weights->gamma;
  }
  if (update.target_mass) next.target_mass = *update.target_mass;
  if (update.target_bytes) next.target_bytes = *update.target_bytes;
  KVCACHE_RETURN_IF_ERROR(next.Validate());

  PolicyChange change{.previous_mode = m.policy.mode};
  m.policy = next;
  ++m.policy_generation;  // voids compaction jobs planned under the old policy
  if (next.mode == CompressionMode::kOff) {
    // Fetches in flight stop sending lossy blocks, and leases end before
    // their first one: off means lossless for everyone, now.
    m.lossless_epoch->fetch_add(1);
    leases_.ForEach([&](Lease& lease) {
      if (lease.model != model) return;
      const size_t keep = ExactBlocks(lease.blocks);
      auto lossy = lease.blocks.begin() + static_cast<ptrdiff_t>(keep);
      for (auto it = lossy; it != lease.blocks.end(); ++it) dropped.push_back(it->host.Unpin());
      lease.blocks.erase(lossy, lease.blocks.end());
      lease.matched_tokens = keep * m.layout.block_tokens;
    });
  }
  if (next.mode == CompressionMode::kOff && m.compressed_blocks > 0) {
    // Remove every compressed block (and what hangs below it): from now on
    // the model serves only lossless KV. Post-order, so a compressed block
    // below another is removed first and no removal touches a removed node.
    std::vector<IndexNode*> compressed;
    m.index.VisitPostOrder([&](IndexNode* n) {
      if (n->tokens_state().compressed) compressed.push_back(n);
    });
    for (IndexNode* n : compressed) {
      change.dropped_blocks += RemoveSubtreeLocked(m, n, &dropped).evicted_blocks;
    }
  }
  change.policy = m.policy;
  return change;
}

absl::StatusOr<ReportResult> Cache::ReportAttention(const ModelKey& model,
                                                    std::span<const Token> tokens,
                                                    uint64_t lease_id,
                                                    std::span<const float> attention,
                                                    uint32_t num_layers) {
  KVCACHE_RETURN_IF_ERROR(CheckTokenCount(tokens.size()));
  const uint32_t rows = std::max<uint32_t>(num_layers, 1);
  for (size_t i = 0; i < attention.size(); ++i) {
    if (!std::isfinite(attention[i]) || attention[i] < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("attention[", i, "] is ", attention[i], "; values must be finite and >= 0"));
    }
  }
  // 1. Under the lock only what the report is checked against: the layout,
  // the policy and, for a lease, the tokens it matched.
  ModelLayout layout;
  ImportancePolicy policy;
  uint64_t incarnation = 0;
  std::vector<Token> lease_tokens;
  {
    WriteLock lock(this);
    auto state = FindModelLocked(model);
    if (!state.ok()) return state.status();
    layout = (*state)->layout;
    policy = (*state)->policy;
    incarnation = (*state)->incarnation;
    if (lease_id != 0) {
      ExpireLeasesLocked(clock_->Now());
      const Lease* lease = leases_.Find(lease_id);
      // Another namespace's (tenant's) lease reads exactly as no lease.
      if (lease == nullptr || lease->model.ns != model.ns) {
        return absl::NotFoundError(absl::StrCat("lease_id ", lease_id, " is unknown or expired"));
      }
      if (lease->model != model) {
        return absl::InvalidArgumentError(
            absl::StrCat("lease_id ", lease_id, " belongs to another model"));
      }
      lease_tokens = lease->tokens;
    }
  }
  if (lease_id != 0) tokens = lease_tokens;

  // 2. Without the lock: the shape check, the per-token mass (rows summed),
  // its scaling, and the tokens' hashes.
  const size_t n = tokens.size();
  // Rows per (layer, KV head): row r is layer r / num_kv_heads, head r % num_kv_heads.
  const uint64_t head_rows = uint64_t{layout.num_layers} * layout.num_kv_heads;
  const bool per_head = n > 0 && rows == layout.num_layers && layout.num_kv_heads > 1 &&
                        attention.size() == head_rows * n;
  if (n == 0 || (attention.size() != uint64_t{rows} * n && !per_head)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "attention has ", attention.size(), " values; expected num_layers (", rows, ") x tokens (",
        n, ") = ", uint64_t{rows} * n, " or, per KV head, num_layers (", layout.num_layers,
        ") x num_kv_heads (", layout.num_kv_heads, ") x tokens = ", head_rows * n,
        lease_id != 0 ? " for the lease" : "",
        n == 0 ? "; a report needs at least one token" : ""));
  }
  // The token's mass sums every row: per (layer, KV head), or per layer.
  const uint64_t mass_rows = per_head ? head_rows : rows;
  std::vector<float> mass(n, 0.0f);
  for (uint64_t r = 0; r < mass_rows; ++r) {
    for (size_t t = 0; t < n; ++t) mass[t] += attention[r * n + t];
  }
  // Scale to [0, 1] by the largest unprotected mass (ObserveAttention: the
  // sink would squash the rest).
  const std::vector<float> observed = importance::ObserveAttention(mass, policy.params);
  // Budget mode keeps activity per (layer, KV head), each row scaled by its own
  // largest unprotected mass.
  std::vector<float> observed_heads;
  if (per_head && policy.mode == CompressionMode::kBudget) {
    observed_heads.reserve(head_rows * n);
    for (uint64_t r = 0; r < head_rows; ++r) {
      const std::vector<float> row =
          importance::ObserveAttention(attention.subspan(r * n, n), policy.params);
      observed_heads.insert(observed_heads.end(), row.begin(), row.end());
    }
  }
  absl::StatusOr<BlockHashes> hashes = HashBlocks(model, tokens);
  if (!hashes.ok()) return hashes.status();

  // 3. Under the lock again: fold the report into the cached blocks.
  std::vector<BlockRef> expired;  // released after the lock
  WriteLock lock(this);
  auto state = FindModelLocked(model);
  if (!state.ok()) return state.status();
  ModelState& m = **state;
  if (m.incarnation != incarnation) {
    return absl::AbortedError(absl::StrCat("model \"", model.model_id,
                                           "\" was registered anew during the report; retry"));
  }
  const absl::Time now = clock_->Now();
  std::vector<IndexNode*> path;
  MatchLocked(m, tokens, *hashes, &path, &expired);
  const uint32_t bt = m.layout.block_tokens;
  const ImportanceOptions& o = options_.importance;
  ReportResult result{.matched_tokens = path.size() * bt};
  for (IndexNode* node : path) {
    BlockTokenState& ts = node->mutable_tokens_state();
    const double elapsed = ts.SecondsSinceActivity(now);
    if (ts.activity.empty()) {
      ts.activity.assign(bt, 0.0f);
      RecountMetadataLocked(node);
    }
    for (uint32_t i = 0; i < bt; ++i) {
      const uint64_t g = uint64_t{node->depth} * bt + i;
      // Features as the score saw them before this report, for calibration;
      // only for tokens the score decides on (protected ones are kept anyway).
      const bool is_protected =
          importance::IsStructurallyProtected(m.policy.params, static_cast<int64_t>(g),
                                              static_cast<int64_t>(n)) ||
          (!ts.pinned.empty() && ts.pinned[i] != 0);
      if (!is_protected) {
        const float faded =
            importance::DecayActivity(ts.activity[i], elapsed, o.activity_half_life_seconds, 0, 0);
        const float novelty = ts.novelty.empty() ? 0.0f : std::min(ts.novelty[i], 1.0f);
        m.calibrator.Add({.activity = faded,
                          .position = kernels::PositionFactor(
                              static_cast<int64_t>(g), static_cast<int64_t>(n), m.policy.params),
                          .novelty = novelty,
                          .observed = observed[g]});
      }
      ts.activity[i] = importance::DecayActivity(
          ts.activity[i], elapsed, o.activity_half_life_seconds, observed[g], o.activity_weight);
      ++result.updated_tokens;
    }
    if (!observed_heads.empty()) {
      if (ts.head_activity.size() != head_rows * bt) {
        ts.head_activity.assign(head_rows * bt, 0.0f);
        RecountMetadataLocked(node);
      }
      for (uint64_t r = 0; r < head_rows; ++r) {
        for (uint32_t i = 0; i < bt; ++i) {
          float& a = ts.head_activity[r * bt + i];
          a = importance::DecayActivity(a, elapsed, o.activity_half_life_seconds,
                                        observed_heads[r * n + uint64_t{node->depth} * bt + i],
                                        o.activity_weight);
        }
      }
    }
    ts.activity_updated = now;
  }
  ++m.attention_reports;
  return result;
}

}  // namespace kvcache
