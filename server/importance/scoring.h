// Importance scoring and the dynamic keep threshold: the pure decision rules of
// importance-aware retention, shared by the daemon (server/core) and the
// evaluation tool (tests/eval, kvcache-eval), so both decide the same way.
//
//   importance[t] = alpha * activity[t] + beta * position[t] + gamma * novelty[t]
//
//   activity[t]  decayed attention activity in [0, 1] (see DecayActivity)
//   position[t]  kernels::PositionFactor of the token's position in its sequence
//                (attention sinks and the recent window are 1, decaying with
//                distance before the window; kvcache/kernels/importance.h)
//   novelty[t]   key novelty from kernels::KeyNoveltyCpu, clamped to [0, 1]
//
// The dynamic threshold keeps the smallest set of tokens whose scores cover a
// target share of the total score mass (SelectByMass): a flat distribution
// keeps many tokens, a peaked one few. Protected tokens are always kept.
//
// Thread-safety: every function is pure.
#ifndef KVCACHE_SERVER_IMPORTANCE_SCORING_H_
#define KVCACHE_SERVER_IMPORTANCE_SCORING_H_

#include <cstdint>
#include <span>
#include <vector>

#include "kvcache/kernels/importance.h"

namespace kvcache::importance {

// Scores `count` consecutive tokens that sit at positions
// [first_position, first_position + count) of a sequence of `sequence_tokens`
// tokens (first_position + count <= sequence_tokens). `activity` and `novelty`
// hold `count` values each or are empty (all zeros). Non-finite or negative
// inputs count as 0; novelty is clamped to [0, 1]. Writes `count` scores >= 0.
// REQUIRES: params.Valid(); out.size() == count.
void ScoreTokens(const kernels::ImportanceParams& params, int64_t first_position,
                 int64_t sequence_tokens, std::span<const float> activity,
                 std::span<const float> novelty, std::span<float> out);

// True for a position the params protect: an attention sink
// (position < sink_tokens) or in the recent window
// (position >= sequence_tokens - recent_window).
bool IsStructurallyProtected(const kernels::ImportanceParams& params, int64_t position,
                             int64_t sequence_tokens);

struct Selection {
  std::vector<uint8_t> keep;  // 1 for a kept token, one entry per score
  int64_t kept = 0;           // number of ones in keep
  double total_mass = 0;      // sum of all (sanitised) scores
  double kept_mass = 0;       // sum of the kept tokens' scores
  float threshold = 0;        // smallest unprotected score kept; +inf when none
};

// The smallest set of tokens that covers `target_mass` (in (0, 1]) of the
// total score mass. Protected tokens (protected_mask[t] != 0; the mask may be
// empty) are kept first and their mass counts toward the target; then
// unprotected tokens in decreasing score order (ties: the later token first,
// as later tokens are more likely to be attended again) until
// kept_mass >= target_mass * total_mass. Tokens with score 0 are kept only
// when protected. Negative or non-finite scores count as 0.
// REQUIRES: protected_mask is empty or scores.size() long; target_mass in (0, 1].
Selection SelectByMass(std::span<const float> scores, double target_mass,
                       std::span<const uint8_t> protected_mask);

// Exponentially decayed activity. `previous` was last updated `elapsed_seconds`
// ago; it first fades by 2^(-elapsed / half_life_seconds) and then moves
// toward the new observation by `weight` (in (0, 1]):
//   a = previous * 2^(-elapsed / half_life);   result = a + weight * (observed - a)
// Observations are normalised attention in [0, 1] (clamped), so the result
// stays in [0, 1]. Heavy hitters that keep being attended stay near 1; tokens
// no longer attended fade with the half-life. half_life_seconds <= 0 disables
// the fade.
float DecayActivity(float previous, double elapsed_seconds, double half_life_seconds,
                    float observed, float weight);

// Normalises a report of per-token attention mass to [0, 1] by its maximum
// (all zeros stay zero). Non-finite or negative values become 0.
std::vector<float> NormaliseAttention(std::span<const float> mass);

// What a report of per-token attention mass over a sequence of mass.size()
// tokens says about each token, in [0, 1]: the mass divided by the largest
// mass of a token that is not structurally protected, clamped to 1. The sink
// takes most of the attention in most heads, so normalising by the overall
// maximum would squash every other token toward 0; protected tokens are kept
// whatever their score, so only the unprotected ones need a scale. Falls back
// to NormaliseAttention when no unprotected token has any mass.
std::vector<float> ObserveAttention(std::span<const float> mass,
                                    const kernels::ImportanceParams& params);

}  // namespace kvcache::importance

#endif  // KVCACHE_SERVER_IMPORTANCE_SCORING_H_
