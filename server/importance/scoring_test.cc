#include "server/importance/scoring.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <numeric>
#include <random>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace kvcache::importance {
namespace {

constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();
constexpr float kInf = std::numeric_limits<float>::infinity();

// The position factor of kvcache/kernels/importance.h, written out independently.
double ReferencePosition(int64_t t, int64_t n, const kernels::ImportanceParams& p) {
  if (t < p.sink_tokens || t >= n - p.recent_window) return 1.0;
  const double d = static_cast<double>((n - p.recent_window) - t);
  return p.decay == kernels::PositionDecay::kExponential ? std::exp(-d / p.decay_tau)
                                                         : 1.0 / (1.0 + d / p.decay_tau);
}

kernels::ImportanceParams TestParams() {
  kernels::ImportanceParams p;
  p.alpha = 0.5f;
  p.beta = 0.3f;
  p.gamma = 0.2f;
  p.sink_tokens = 2;
  p.recent_window = 3;
  p.decay_tau = 4.0f;
  return p;
}

TEST(ScoreTokensTest, MatchesFormula) {
  for (const auto decay :
       {kernels::PositionDecay::kExponential, kernels::PositionDecay::kHyperbolic}) {
    kernels::ImportanceParams p = TestParams();
    p.decay = decay;
    ASSERT_TRUE(p.Valid());
    std::mt19937 rng(7);
    std::uniform_real_distribution<float> u(0.0f, 1.0f);
    const int64_t sequence = 40;
    const int64_t first = 5;
    const size_t count = 35;
    std::vector<float> activity(count), novelty(count), out(count, -1.0f);
    for (size_t i = 0; i < count; ++i) {
      activity[i] = u(rng);
      novelty[i] = u(rng);
    }
    ScoreTokens(p, first, sequence, activity, novelty, out);
    for (size_t i = 0; i < count; ++i) {
      const int64_t t = first + static_cast<int64_t>(i);
      const double expected =
          p.alpha * activity[i] + p.beta * ReferencePosition(t, sequence, p) + p.gamma * novelty[i];
      EXPECT_NEAR(out[i], expected, 1e-6) << "token " << t;
    }
  }
}

TEST(ScoreTokensTest, EmptyInputsCountAsZero) {
  const kernels::ImportanceParams p = TestParams();
  const int64_t sequence = 30;
  std::vector<float> out(sequence);
  ScoreTokens(p, 0, sequence, {}, {}, out);
  for (int64_t t = 0; t < sequence; ++t) {
    EXPECT_NEAR(out[t], p.beta * ReferencePosition(t, sequence, p), 1e-6) << t;
  }
}

TEST(ScoreTokensTest, SanitisesInputs) {
  kernels::ImportanceParams p = TestParams();
  p.beta = 0.0f;  // isolate activity and novelty
  const std::vector<float> activity = {kNaN, -1.0f, kInf, 2.0f, 0.25f, -kInf};
  const std::vector<float> novelty = {0.5f, kNaN, 7.0f, -3.0f, kInf, 0.0f};
  std::vector<float> out(activity.size());
  ScoreTokens(p, 0, 100, activity, novelty, out);
  const std::vector<float> clean_a = {0.0f, 0.0f, 0.0f, 1.0f, 0.25f, 0.0f};
  const std::vector<float> clean_n = {0.5f, 0.0f, 1.0f, 0.0f, 0.0f, 0.0f};
  for (size_t i = 0; i < out.size(); ++i) {
    EXPECT_TRUE(std::isfinite(out[i])) << i;
    EXPECT_GE(out[i], 0.0f) << i;
    EXPECT_NEAR(out[i], p.alpha * clean_a[i] + p.gamma * clean_n[i], 1e-6) << i;
  }
}

TEST(IsStructurallyProtectedTest, SinksAndRecentWindow) {
  const kernels::ImportanceParams p = TestParams();  // 2 sinks, window 3
  const int64_t n = 10;
  const std::vector<bool> expected = {true,  true,  false, false, false,
                                      false, false, true,  true,  true};
  for (int64_t t = 0; t < n; ++t) {
    EXPECT_EQ(IsStructurallyProtected(p, t, n), expected[t]) << t;
  }
  kernels::ImportanceParams none = p;
  none.sink_tokens = 0;
  none.recent_window = 0;
  for (int64_t t = 0; t < n; ++t) EXPECT_FALSE(IsStructurallyProtected(none, t, n)) << t;
}

// Checks the invariants of a selection: bookkeeping, coverage and minimality.
void CheckSelection(const std::vector<float>& scores, double target,
                    const std::vector<uint8_t>& mask, const Selection& s) {
  ASSERT_EQ(s.keep.size(), scores.size());
  auto clean = [](float x) { return std::isfinite(x) && x > 0 ? static_cast<double>(x) : 0.0; };
  double total = 0, kept_mass = 0;
  int64_t kept = 0;
  float smallest = kInf;
  int64_t smallest_index = -1;
  for (size_t t = 0; t < scores.size(); ++t) {
    const bool is_protected = !mask.empty() && mask[t] != 0;
    total += clean(scores[t]);
    if (is_protected) {
      EXPECT_EQ(s.keep[t], 1) << "protected token " << t << " dropped";
    }
    if (!s.keep[t]) continue;
    ++kept;
    kept_mass += clean(scores[t]);
    if (!is_protected) {
      EXPECT_GT(clean(scores[t]), 0.0) << "unprotected zero token " << t << " kept";
      if (scores[t] <= smallest) {
        smallest = scores[t];
        smallest_index = static_cast<int64_t>(t);
      }
    }
  }
  EXPECT_EQ(s.kept, kept);
  EXPECT_NEAR(s.total_mass, total, 1e-9 * std::max(1.0, total));
  EXPECT_NEAR(s.kept_mass, kept_mass, 1e-9 * std::max(1.0, total));
  EXPECT_EQ(s.threshold, smallest);
  // Coverage: the target is met unless every positive token is already kept.
  bool all_positive_kept = true;
  for (size_t t = 0; t < scores.size(); ++t) {
    if (clean(scores[t]) > 0 && !s.keep[t]) all_positive_kept = false;
  }
  if (!all_positive_kept) {
    EXPECT_GE(kept_mass, target * total - 1e-9 * total);
  }
  // Minimality: dropping the smallest kept unprotected token falls short of the target.
  if (smallest_index >= 0) {
    EXPECT_LT(kept_mass - clean(scores[smallest_index]), target * total);
  }
  // Every dropped unprotected token scores no more than every kept one.
  for (size_t t = 0; t < scores.size(); ++t) {
    const bool is_protected = !mask.empty() && mask[t] != 0;
    if (!s.keep[t] && !is_protected) {
      EXPECT_LE(clean(scores[t]), smallest) << t;
    }
  }
}

TEST(SelectByMassTest, CoversTargetAndIsMinimal) {
  std::mt19937 rng(11);
  std::exponential_distribution<float> e(3.0f);
  for (int trial = 0; trial < 50; ++trial) {
    const size_t n = 1 + rng() % 300;
    std::vector<float> scores(n);
    for (float& v : scores) v = e(rng);
    std::vector<uint8_t> mask;
    if (trial % 2 == 1) {
      mask.resize(n);
      for (auto& m : mask) m = rng() % 10 == 0;
    }
    for (const double target : {0.1, 0.5, 0.9, 0.99}) {
      const Selection s = SelectByMass(scores, target, mask);
      SCOPED_TRACE(testing::Message() << "trial " << trial << " target " << target);
      CheckSelection(scores, target, mask, s);
    }
  }
}

TEST(SelectByMassTest, ProtectedAlwaysKeptEvenWithZeroScore) {
  const std::vector<float> scores = {0.0f, 5.0f, 0.0f, 1.0f, kNaN, 2.0f};
  const std::vector<uint8_t> mask = {1, 0, 1, 0, 1, 0};
  const Selection s = SelectByMass(scores, 0.5, mask);
  EXPECT_THAT(s.keep, testing::ElementsAre(1, 1, 1, 0, 1, 0));
  EXPECT_EQ(s.kept, 4);
  EXPECT_DOUBLE_EQ(s.total_mass, 8.0);
  EXPECT_DOUBLE_EQ(s.kept_mass, 5.0);
  EXPECT_EQ(s.threshold, 5.0f);
}

TEST(SelectByMassTest, ProtectedMassCountsTowardTarget) {
  const std::vector<float> scores = {6.0f, 1.0f, 2.0f, 1.0f};
  const std::vector<uint8_t> mask = {1, 0, 0, 0};
  const Selection s = SelectByMass(scores, 0.6, mask);  // 6 of 10 already covered
  EXPECT_THAT(s.keep, testing::ElementsAre(1, 0, 0, 0));
  EXPECT_EQ(s.kept, 1);
  EXPECT_EQ(s.threshold, kInf);
}

TEST(SelectByMassTest, FlatKeepsMoreThanPeaked) {
  const size_t n = 200;
  std::vector<float> flat(n, 1.0f);
  std::vector<float> peaked(n);
  for (size_t t = 0; t < n; ++t) peaked[t] = std::pow(0.9f, static_cast<float>(t));
  for (const double target : {0.5, 0.8, 0.95}) {
    const Selection f = SelectByMass(flat, target, {});
    const Selection p = SelectByMass(peaked, target, {});
    EXPECT_GT(f.kept, p.kept) << target;
    EXPECT_EQ(f.kept, static_cast<int64_t>(std::ceil(target * n))) << target;
    CheckSelection(flat, target, {}, f);
    CheckSelection(peaked, target, {}, p);
  }
}

TEST(SelectByMassTest, FullTargetKeepsEveryPositiveToken) {
  std::mt19937 rng(5);
  std::uniform_real_distribution<float> u(0.0f, 1.0f);
  std::vector<float> scores(500);
  for (size_t t = 0; t < scores.size(); ++t) scores[t] = t % 7 == 0 ? 0.0f : u(rng);
  scores[3] = -1.0f;
  scores[4] = kNaN;
  const Selection s = SelectByMass(scores, 1.0, {});
  for (size_t t = 0; t < scores.size(); ++t) {
    EXPECT_EQ(s.keep[t], std::isfinite(scores[t]) && scores[t] > 0 ? 1 : 0) << t;
  }
}

TEST(SelectByMassTest, ZeroScoresNotKeptWhenRoundingLeavesTargetUnmet) {
  // Summed in index order the tiny scores count; summed largest first they vanish, so the
  // kept mass never reaches the target and every positive token is taken. Zeros still are not.
  std::vector<float> scores(10, 1e-16f);
  scores.push_back(1.0f);
  scores.push_back(0.0f);
  scores.push_back(0.0f);
  const Selection s = SelectByMass(scores, 1.0, {});
  EXPECT_LT(s.kept_mass, s.total_mass);
  EXPECT_EQ(s.kept, 11);
  EXPECT_EQ(s.keep[11], 0);
  EXPECT_EQ(s.keep[12], 0);
}

TEST(SelectByMassTest, AllZeroScoresKeepNothingUnprotected) {
  const std::vector<float> scores(10, 0.0f);
  const Selection s = SelectByMass(scores, 0.9, {});
  EXPECT_EQ(s.kept, 0);
  EXPECT_EQ(s.total_mass, 0.0);
  EXPECT_EQ(s.threshold, kInf);
  const Selection empty = SelectByMass({}, 0.9, {});
  EXPECT_EQ(empty.kept, 0);
  EXPECT_TRUE(empty.keep.empty());
}

TEST(SelectByMassTest, TiesPreferLaterTokens) {
  const std::vector<float> scores(6, 1.0f);
  const Selection s = SelectByMass(scores, 0.5, {});
  EXPECT_THAT(s.keep, testing::ElementsAre(0, 0, 0, 1, 1, 1));
  const std::vector<float> mixed = {2.0f, 1.0f, 1.0f, 1.0f, 0.5f};  // total 5.5
  const Selection m = SelectByMass(mixed, 0.7, {});                 // needs 3.85: 2 + 1 + 1
  EXPECT_THAT(m.keep, testing::ElementsAre(1, 0, 1, 1, 0));
}

TEST(DecayActivityTest, HalvesEveryHalfLife) {
  const double h = 60.0;
  // Weight 0.5 toward observation 0: the faded value is halved once more.
  EXPECT_NEAR(DecayActivity(0.8f, h, h, 0.0f, 0.5f), 0.8 * 0.5 * 0.5, 1e-6);
  EXPECT_NEAR(DecayActivity(0.8f, 2 * h, h, 0.0f, 0.5f), 0.8 * 0.25 * 0.5, 1e-6);
  EXPECT_NEAR(DecayActivity(0.8f, 0.5 * h, h, 0.0f, 0.5f), 0.8 * std::sqrt(0.5) * 0.5, 1e-6);
  // Toward a non-zero observation.
  EXPECT_NEAR(DecayActivity(1.0f, h, h, 0.9f, 0.25f), 0.5 + 0.25 * (0.9 - 0.5), 1e-6);
  // No elapsed time or no half-life: no fade.
  EXPECT_NEAR(DecayActivity(0.8f, 0.0, h, 0.0f, 0.5f), 0.4, 1e-6);
  EXPECT_NEAR(DecayActivity(0.8f, 1e6, 0.0, 0.0f, 0.5f), 0.4, 1e-6);
  EXPECT_NEAR(DecayActivity(0.8f, 1e6, -1.0, 0.0f, 0.5f), 0.4, 1e-6);
  // Weight 1 takes the observation.
  EXPECT_NEAR(DecayActivity(0.1f, 5.0, h, 0.7f, 1.0f), 0.7, 1e-6);
}

TEST(DecayActivityTest, HeavyHitterStaysHighIdleTokenFades) {
  float hot = 0, cold = 1;
  for (int i = 0; i < 100; ++i) {
    hot = DecayActivity(hot, 1.0, 30.0, 1.0f, 0.3f);
    cold = DecayActivity(cold, 1.0, 30.0, 0.0f, 0.3f);
  }
  EXPECT_GT(hot, 0.9f);  // steady state 0.3 / (1 - 0.7 * 2^(-1/30)) = 0.95
  EXPECT_LT(cold, 0.01f);
}

TEST(DecayActivityTest, StaysInUnitInterval) {
  std::mt19937 rng(3);
  std::uniform_real_distribution<float> wide(-3.0f, 3.0f);
  const std::vector<float> specials = {kNaN, kInf, -kInf, -1.0f, 2.0f, 0.0f, 1.0f};
  for (int i = 0; i < 2000; ++i) {
    const float prev = i % 3 == 0 ? specials[i % specials.size()] : wide(rng);
    const float obs = i % 5 == 0 ? specials[(i / 5) % specials.size()] : wide(rng);
    const float w = std::uniform_real_distribution<float>(0.0f, 1.0f)(rng);
    const double elapsed = std::uniform_real_distribution<double>(-10, 1000)(rng);
    const float r = DecayActivity(prev, elapsed, 45.0, obs, w);
    ASSERT_TRUE(std::isfinite(r));
    EXPECT_GE(r, 0.0f);
    EXPECT_LE(r, 1.0f);
  }
}

TEST(NormaliseAttentionTest, ScalesByMaximum) {
  const std::vector<float> mass = {1.0f, 4.0f, 2.0f, 0.0f, -3.0f, kNaN, kInf};
  EXPECT_THAT(NormaliseAttention(mass),
              testing::ElementsAre(0.25f, 1.0f, 0.5f, 0.0f, 0.0f, 0.0f, 0.0f));
  EXPECT_THAT(NormaliseAttention(std::vector<float>(3, 0.0f)), testing::Each(0.0f));
  EXPECT_TRUE(NormaliseAttention({}).empty());
  const std::vector<float> tiny = {1e-30f, 3e-30f};
  const std::vector<float> n = NormaliseAttention(tiny);
  EXPECT_FLOAT_EQ(n[0], 1.0f / 3.0f);
  EXPECT_FLOAT_EQ(n[1], 1.0f);
}

}  // namespace
TEST(ObserveAttentionTest, ScalesByTheLargestUnprotectedMass) {
  kernels::ImportanceParams p;
  p.sink_tokens = 1;
  p.recent_window = 2;
  // Token 0 is the sink, tokens 4-5 the recent window.
  const std::vector<float> mass = {0.8f, 0.02f, 0.05f, 0.01f, 0.1f, 0.02f};
  const std::vector<float> got = ObserveAttention(mass, p);
  ASSERT_EQ(got.size(), mass.size());
  EXPECT_FLOAT_EQ(got[0], 1.0f);  // clamped
  EXPECT_FLOAT_EQ(got[1], 0.4f);
  EXPECT_FLOAT_EQ(got[2], 1.0f);  // the largest unprotected mass
  EXPECT_FLOAT_EQ(got[3], 0.2f);
  EXPECT_FLOAT_EQ(got[4], 1.0f);  // 2.0 clamped
  EXPECT_FLOAT_EQ(got[5], 0.4f);
  // Normalising by the overall maximum would have squashed token 2 to 1/16.
  EXPECT_FLOAT_EQ(NormaliseAttention(mass)[2], 0.0625f);
  // No unprotected mass: the plain normalisation.
  const std::vector<float> only_sink = {0.5f, 0, 0, 0, 0.25f, 0};
  EXPECT_EQ(ObserveAttention(only_sink, p), NormaliseAttention(only_sink));
}

}  // namespace kvcache::importance
