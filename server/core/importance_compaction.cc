// Compactor::Compact: importance-aware compaction. Plans under the lock which
// cold (or, under pool pressure, any) host blocks to re-encode, scores and
// encodes them outside it (INT8 and pruned tokens, or budget mode's
// per-entry precisions), and swaps the smaller copies in when nothing
// changed meanwhile. docs/importance.md explains the model.
#include <algorithm>
#include <functional>
#include <span>
#include <utility>
#include <vector>

#include "server/core/block_move.h"
#include "server/core/compactor.h"
#include "server/importance/block_codec.h"
#include "server/importance/budget_allocation.h"
#include "server/importance/scoring.h"

namespace kvcache {
namespace {

// One block a compaction pass re-encodes outside the lock.
struct CompactionJob {
  BlockMove move;  // the raw block, re-encoded outside the lock
  ModelLayout layout;
  ImportancePolicy policy;
  int64_t first_position = 0;
  int64_t sequence_tokens = 0;
  std::vector<float> activity;
  std::vector<float> head_activity;  // budget mode, when reported per head
  std::vector<float> novelty;
  std::vector<uint8_t> pinned;
  bool novelty_computed = false;   // novelty was missing and computed by the pass
  uint64_t policy_generation = 0;  // the model's when planned
  // Results.
  bool corrupt = false;  // the stored bytes do not match their checksum
  BlockRef encoded;
  uint32_t num_int8 = 0;
  uint32_t num_pruned = 0;
  // Budget mode (version 2): entries per precision, and whether it missed the budget.
  uint32_t int8_entries = 0;
  uint32_t int4_entries = 0;
  uint32_t pruned_entries = 0;
  bool over_budget = false;
};

// True for a token that stays full whatever the budget: a sink or pinned (and,
// in the modes other than budget, the recent window).
bool KeptFull(const ImportancePolicy& p, int64_t position, int64_t seq,
              const std::vector<uint8_t>& pinned, int64_t i) {
  if (!pinned.empty() && pinned[i] != 0) return true;
  if (p.mode == CompressionMode::kBudget) return position < p.params.sink_tokens;
  return importance::IsStructurallyProtected(p.params, position, seq);
}

// True when every token of the block is protected, so compressing it would
// change nothing.
bool FullyProtected(const ImportancePolicy& p, int64_t first, int64_t bt, int64_t seq,
                    const std::vector<uint8_t>& pinned) {
  for (int64_t i = 0; i < bt; ++i) {
    if (!KeptFull(p, first + i, seq, pinned, i)) return false;
  }
  return true;
}

// Budget mode: the precision of every (layer, KV head, token) entry of the raw
// block `raw` (importance::AllocateBudget). Scores are per entry: the
// (layer, head)'s activity when the worker reported per head, else the
// token's, with the token's position factor and novelty. Sinks, pinned
// tokens and entries with a non-finite value stay full; the recent window
// ranks first. Appends the scores to `scores_out`.
absl::StatusOr<importance::BudgetAllocation> PlanBudget(
    const ModelLayout& layout, const ImportancePolicy& policy, int64_t first_position,
    int64_t sequence_tokens, const std::vector<float>& activity,
    const std::vector<float>& head_activity, const std::vector<float>& novelty,
    const std::vector<uint8_t>& pinned, std::span<const std::byte> raw,
    std::vector<float>* scores_out) {
  const importance::BlockShape shape = ToBlockShape(layout);
  const uint64_t entries = shape.entries();
  const uint32_t bt = layout.block_tokens;
  const uint64_t groups = uint64_t{layout.num_layers} * layout.num_kv_heads;
  std::vector<float> scores(entries);
  const bool per_head = head_activity.size() == entries;
  const std::span<const float> token_activity =
      activity.size() == bt ? std::span<const float>(activity) : std::span<const float>();
  const std::span<const float> token_novelty =
      novelty.size() == bt ? std::span<const float>(novelty) : std::span<const float>();
  for (uint64_t g = 0; g < groups; ++g) {
    const std::span<const float> a =
        per_head ? std::span<const float>(head_activity).subspan(g * bt, bt) : token_activity;
    importance::ScoreTokens(policy.params, first_position, sequence_tokens, a, token_novelty,
                            std::span<float>(scores).subspan(g * bt, bt));
  }
  std::vector<uint8_t> fixed(entries, 0), first(entries, 0);
  std::vector<importance::TokenPrecision> probe(entries, importance::TokenPrecision::kInt8);
  importance::KeepNonFiniteEntriesFull(shape, raw, probe);
  for (uint64_t i = 0; i < entries; ++i) {
    const int64_t t = static_cast<int64_t>(i % bt);
    const int64_t position = first_position + t;
    fixed[i] = KeptFull(policy, position, sequence_tokens, pinned, t) ||
               probe[i] == importance::TokenPrecision::kFull;
    first[i] = importance::IsStructurallyProtected(policy.params, position, sequence_tokens);
  }
  scores_out->insert(scores_out->end(), scores.begin(), scores.end());
  return importance::AllocateBudget(shape, scores, fixed, first,
                                    policy.target_bytes * static_cast<double>(shape.raw_bytes()));
}

// Installs the compressed copies of a pass whose blocks and policies did
// not change meanwhile; drops blocks found corrupt.
void SwapCompacted(const CacheAccess::Held& held, std::vector<CompactionJob>& jobs,
                   const std::vector<float>& all_scores, std::vector<BlockRef>* dropped,
                   CompactionResult* out) {
  CompactionResult& result = *out;
  for (float s : all_scores) held.compactor_counters().scores.Add(s);
  for (CompactionJob& job : jobs) {
    IndexNode* node = held.EndRewrite(job.move);
    if (node == nullptr) continue;
    if (job.corrupt) {
      if (held.DropCorrupt(job.move, BlockTier::kHost, "checksum", dropped).has_value()) {
        ++result.corrupt_blocks;
      }
      continue;
    }
    ModelState& m = held.ModelOfBlock(*node);
    if (job.novelty_computed && node->tokens_state().novelty.empty()) {
      node->mutable_tokens_state().novelty = std::move(job.novelty);
      held.RecountMetadata(node);
    }
    // A policy change since planning (above all a switch to off) voids the job.
    if (job.encoded == nullptr || m.policy_generation != job.policy_generation ||
        m.policy.mode == CompressionMode::kOff) {
      continue;
    }
    const uint64_t saved = job.move.host()->footprint() - job.encoded->footprint();
    held.ReplaceHostCopy(node, std::move(job.encoded));
    BlockTokenState& ts = node->mutable_tokens_state();
    ts.compressed = true;
    ts.num_int8 = job.num_int8;
    ts.num_pruned = job.num_pruned;
    ts.int8_entries = job.int8_entries;
    ts.int4_entries = job.int4_entries;
    ts.pruned_entries = job.pruned_entries;
    ts.bytes_saved = saved;
    held.RecountMetadata(node);  // the state may be new
    m.CountCompressed(ts);
    m.budget_overruns += job.over_budget ? 1 : 0;
    ++result.compressed_blocks;
    result.bytes_saved += saved;
    result.int8_tokens += job.num_int8;
    result.pruned_tokens += job.num_pruned;
    result.int8_entries += job.int8_entries;
    result.int4_entries += job.int4_entries;
    result.pruned_entries += job.pruned_entries;
    result.budget_overruns += job.over_budget ? 1 : 0;
  }
}

}  // namespace

CompactionResult Compactor::Compact() const {
  CompactionResult result;
  std::vector<CompactionJob> jobs;  // destroyed after the lock: old payloads free there
  std::vector<float> all_scores;
  const ImportanceOptions& o = access_.options().importance;
  SlabPool& pool = access_.pool();
  {
    const SlabPoolStats pool_stats = pool.GetStats();
    CacheAccess::Locked locked(access_);
    ++locked.compactor_counters().passes;
    const absl::Time now = locked.Now();
    result.under_pressure =
        pool_stats.capacity_bytes > 0 &&
        static_cast<double>(pool_stats.reserved_bytes) >=
            o.pressure_watermark * static_cast<double>(pool_stats.capacity_bytes);
    struct Candidate {
      absl::Time last_access;
      const ModelState* model;
      const IndexNode* node;
      int64_t sequence_tokens;
    };
    std::vector<Candidate> candidates;
    locked.ForEachModel([&](const ModelState& m) {
      if (m.policy.mode == CompressionMode::kOff) return;
      const int64_t bt = m.layout.block_tokens;
      absl::flat_hash_map<const IndexNode*, uint32_t> deepest;
      m.index.VisitPostOrder([&](IndexNode* n) {
        // Children come first, so deepest[n] already holds their maximum.
        // (Copy it out: inserting the parent may move the map's values.)
        const uint32_t d = std::max(deepest[n], n->depth);
        deepest[n] = d;
        if (n->parent != nullptr) {
          uint32_t& pd = deepest[n->parent];
          pd = std::max(pd, d);
        }
        // Only host copies are re-encoded, and not while a reader or another
        // move (pool compaction) pins them.
        if (n->payload == nullptr || n->tokens_state().compressed || n->payload->pins().pinned()) {
          return;
        }
        if (!result.under_pressure && n->last_access > now - o.cold_after) return;
        const int64_t seq = (int64_t{d} + 1) * bt;
        if (FullyProtected(m.policy, int64_t{n->depth} * bt, bt, seq, n->tokens_state().pinned)) {
          return;
        }
        candidates.push_back({n->last_access, &m, n, seq});
      });
    });
    result.candidates = candidates.size();
    std::sort(candidates.begin(), candidates.end(),
              [](const Candidate& a, const Candidate& b) { return a.last_access < b.last_access; });
    if (candidates.size() > o.max_blocks_per_pass) candidates.resize(o.max_blocks_per_pass);
    jobs.reserve(candidates.size());
    for (const Candidate& c : candidates) {
      const BlockTokenState& ts = c.node->tokens_state();
      CompactionJob job{.move = locked.ClaimRewrite(*c.node),
                        .layout = c.model->layout,
                        .policy = c.model->policy,
                        .first_position = int64_t{c.node->depth} * c.model->layout.block_tokens,
                        .sequence_tokens = c.sequence_tokens,
                        .novelty = ts.novelty,
                        .pinned = ts.pinned,
                        .policy_generation = c.model->policy_generation};
      if (!ts.activity.empty()) {
        const double elapsed = ts.SecondsSinceActivity(now);
        job.activity.resize(ts.activity.size());
        for (size_t i = 0; i < ts.activity.size(); ++i) {
          job.activity[i] = importance::DecayActivity(ts.activity[i], elapsed,
                                                      o.activity_half_life_seconds, 0, 0);
        }
        if (c.model->policy.mode == CompressionMode::kBudget) {
          job.head_activity.resize(ts.head_activity.size());
          for (size_t i = 0; i < ts.head_activity.size(); ++i) {
            job.head_activity[i] = importance::DecayActivity(ts.head_activity[i], elapsed,
                                                             o.activity_half_life_seconds, 0, 0);
          }
        }
      }
      jobs.push_back(std::move(job));
    }
  }

  // Encodes `old` into a new pool allocation of `bytes` and seals it with the
  // checksums of the encoding, of the appended bytes and of what the encoding
  // decodes to (a fetch checks its decode against the last). `block` is null
  // when the encoder or the decode check refused (the block stays as it is);
  // pool_full when the pool has no room for the copy (the pass stops).
  struct Sealed {
    BlockRef block;
    bool pool_full = false;
  };
  auto encode_and_seal = [&](const BlockPayload& old, uint64_t bytes,
                             const std::function<absl::Status(std::span<std::byte>)>& encode) {
    absl::StatusOr<Allocation> a = pool.Allocate(bytes);
    if (!a.ok()) return Sealed{.pool_full = true};
    StagingBlock encoded(&pool, *a, bytes);
    if (!encode(encoded.data()).ok()) return Sealed{};
    std::vector<std::byte> decoded(old.size());
    absl::StatusOr<importance::CompressedBlockView> view =
        importance::ParseCompressedBlock(encoded.data());
    if (!view.ok() || !importance::DecodeBlock(*view, decoded).ok()) return Sealed{};
    const BlockSeal seal{.size = bytes,
                         .checksum = Checksum(encoded.data()),
                         .raw_checksum = old.raw_checksum(),
                         .decoded_checksum = Checksum(decoded),
                         .compressed = true};
    return Sealed{.block = std::move(encoded).Seal(old.key(), seal)};
  };

  // Outside the lock: verify, score, decide each token's precision, encode.
  for (CompactionJob& job : jobs) {
    const BlockPayload& old = *job.move.host();
    const uint32_t bt = job.layout.block_tokens;
    // Never re-encode bytes that are not what was appended: the new checksum
    // would make the corruption look valid.
    if (Checksum(old.data()) != old.checksum()) {
      job.corrupt = true;
      continue;
    }
    if (job.novelty.empty()) {  // appended while the model did not compress
      job.novelty = BlockKeyNovelty(job.layout, old.data(),
                                    NoveltyLayers(o.novelty_layers, job.layout.num_layers));
      job.novelty_computed = !job.novelty.empty();
    }
    const importance::BlockShape shape = ToBlockShape(job.layout);
    if (job.policy.mode == CompressionMode::kBudget) {
      absl::StatusOr<importance::BudgetAllocation> plan =
          PlanBudget(job.layout, job.policy, job.first_position, job.sequence_tokens, job.activity,
                     job.head_activity, job.novelty, job.pinned, old.data(), &all_scores);
      if (!plan.ok()) continue;
      job.int8_entries = job.int4_entries = job.pruned_entries = 0;
      for (importance::TokenPrecision p : plan->precision) {
        job.int8_entries += p == importance::TokenPrecision::kInt8;
        job.int4_entries += p == importance::TokenPrecision::kInt4;
        job.pruned_entries += p == importance::TokenPrecision::kPruned;
      }
      job.over_budget = !plan->fits;
      if (job.int8_entries + job.int4_entries + job.pruned_entries == 0) continue;
      if (pool.RoundedSize(plan->bytes) >= old.footprint()) {
        ++result.no_saving_blocks;
        continue;
      }
      const Sealed sealed = encode_and_seal(old, plan->bytes, [&](std::span<std::byte> out) {
        return importance::EncodeBlockV2(shape, old.data(), plan->precision, out);
      });
      if (sealed.pool_full) break;
      job.encoded = sealed.block;
      continue;
    }
    std::vector<float> scores(bt);
    importance::ScoreTokens(job.policy.params, job.first_position, job.sequence_tokens,
                            job.activity, job.novelty, scores);
    all_scores.insert(all_scores.end(), scores.begin(), scores.end());
    std::vector<uint8_t> protect(bt, 0);
    for (uint32_t i = 0; i < bt; ++i) {
      protect[i] = importance::IsStructurallyProtected(job.policy.params, job.first_position + i,
                                                       job.sequence_tokens) ||
                   (!job.pinned.empty() && job.pinned[i] != 0);
    }
    std::vector<importance::TokenPrecision> precision(bt, importance::TokenPrecision::kInt8);
    importance::Selection keep;
    if (job.policy.mode == CompressionMode::kPrune) {
      keep = importance::SelectByMass(scores, job.policy.target_mass, protect);
    }
    for (uint32_t i = 0; i < bt; ++i) {
      if (protect[i]) {
        precision[i] = importance::TokenPrecision::kFull;
      } else if (job.policy.mode == CompressionMode::kPrune && keep.keep[i] == 0) {
        precision[i] = importance::TokenPrecision::kPruned;
        ++job.num_pruned;
      } else {
        ++job.num_int8;
      }
    }
    // A token with an Inf or NaN stays exact: INT8 cannot represent it.
    const uint32_t non_finite = importance::KeepNonFiniteTokensFull(shape, old.data(), precision);
    if (non_finite > 0) {
      job.num_int8 = 0;
      job.num_pruned = 0;
      for (importance::TokenPrecision p : precision) {
        job.num_int8 += p == importance::TokenPrecision::kInt8;
        job.num_pruned += p == importance::TokenPrecision::kPruned;
      }
      if (job.num_int8 + job.num_pruned == 0) continue;
    }
    absl::StatusOr<uint64_t> size = importance::CompressedSize(shape, precision);
    if (!size.ok()) continue;
    // Lossy only when it pays: the copy must take a smaller piece of the pool.
    if (pool.RoundedSize(*size) >= old.footprint()) {
      ++result.no_saving_blocks;
      continue;
    }
    // The copy needs a chunk of another size class. Commits keep
    // append_staging_bytes of the pool free, so a full tier still has room
    // for it; when even that is taken, stop this pass.
    const Sealed sealed = encode_and_seal(old, *size, [&](std::span<std::byte> out) {
      return importance::EncodeBlock(shape, old.data(), precision, out);
    });
    if (sealed.pool_full) break;
    job.encoded = sealed.block;
  }

  if (access_.options().on_compaction_encoded) access_.options().on_compaction_encoded();
  std::vector<BlockRef> dropped;  // released after the lock
  {
    CacheAccess::Locked locked(access_);
    SwapCompacted(locked, jobs, all_scores, &dropped, &result);
  }
  jobs.clear();  // frees the raw copies replaced
  dropped.clear();
  // Attention reports and novelty grow metadata between appends.
  CacheAccess::Locked locked(access_);
  result.evicted_blocks += locked.EnforceBudgets(&dropped);
  return result;
}

}  // namespace kvcache
