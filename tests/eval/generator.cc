#include "tests/eval/generator.h"

#include <algorithm>
#include <cmath>
#include <random>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "kvcache/kernels/convert.h"
#include "server/common/splitmix64.h"
#include "tests/eval/parallel.h"

namespace kvcache::eval {
namespace {

// Deterministic random numbers: std::mt19937_64 is bit-specified, the
// transforms below are ours (the standard distributions are not portable).
class Rng {
 public:
  explicit Rng(uint64_t seed) : engine_(seed) {}
  double Uniform() { return static_cast<double>(engine_() >> 11) * 0x1.0p-53; }
  double Uniform(double lo, double hi) { return lo + (hi - lo) * Uniform(); }
  double Normal() {
    if (has_spare_) {
      has_spare_ = false;
      return spare_;
    }
    double u1 = Uniform();
    while (u1 <= 0) u1 = Uniform();
    const double u2 = Uniform();
    const double r = std::sqrt(-2.0 * std::log(u1));
    spare_ = r * std::sin(2.0 * M_PI * u2);
    has_spare_ = true;
    return r * std::cos(2.0 * M_PI * u2);
  }
  int64_t Int(int64_t lo, int64_t hi) {  // inclusive
    return lo + static_cast<int64_t>(Uniform() * static_cast<double>(hi - lo + 1));
  }

 private:
  std::mt19937_64 engine_;
  bool has_spare_ = false;
  double spare_ = 0;
};

uint64_t StreamSeed(uint64_t seed, uint64_t kind, uint64_t a, uint64_t b) {
  return SplitMix64(SplitMix64(SplitMix64(seed ^ (kind << 56)) ^ a) ^ (b * 0x100000001B3ull));
}

// The Exp(1) quantile of a standard normal z: -ln(1 - Phi(z)), stable in the tail.
double ExpFromNormal(double z) {
  const double tail = 0.5 * std::erfc(z / std::sqrt(2.0));
  return std::min(20.0, -std::log(std::max(tail, 1e-300)));
}

float Dot(const float* a, const float* b, int n) {
  float acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  int i = 0;
  for (; i + 8 <= n; i += 8) {
    for (int j = 0; j < 8; ++j) acc[j] += a[i + j] * b[i + j];
  }
  float s = ((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7]));
  for (; i < n; ++i) s += a[i] * b[i];
  return s;
}

float RoundToHalf(float x) { return kernels::HalfBitsToFloat(kernels::FloatToHalfBits(x)); }

// Which dimensions carry what (pairs of the interleaved rotary layout).
// Low-frequency pairs hardly turn over a context, so what they carry does
// not depend on distance (salience, outliers, the sink); high-frequency pairs
// turn fast and carry the local component.
struct Subspaces {
  int pairs = 0;
  int local_end = 0;       // local: pairs [0, local_end)
  int salience_begin = 0;  // salience: pairs [salience_begin, salience_end)
  int salience_end = 0;
  int outlier_begin = 0;  // outlier channels: pairs [outlier_begin, sink_pair)
  int sink_pair = 0;      // the last pair

  explicit Subspaces(int head_dim) {
    pairs = head_dim / 2;
    local_end = std::max(2, pairs / 4);
    sink_pair = pairs - 1;
    outlier_begin = sink_pair - std::max(2, pairs / 16);
    salience_end = outlier_begin;
    salience_begin = salience_end - std::max(2, pairs / 4);
  }
};

void ApplyRope(float* x, int head_dim, int64_t position, double theta) {
  for (int p = 0; p < head_dim / 2; ++p) {
    const double freq = std::pow(theta, -2.0 * p / head_dim);
    const double angle = static_cast<double>(position) * freq;
    const double c = std::cos(angle);
    const double s = std::sin(angle);
    const double x0 = x[2 * p];
    const double x1 = x[2 * p + 1];
    x[2 * p] = static_cast<float>(x0 * c - x1 * s);
    x[2 * p + 1] = static_cast<float>(x0 * s + x1 * c);
  }
}

void RandomUnit(Rng& rng, int head_dim, int pair_begin, int pair_end, std::vector<float>* out) {
  out->assign(head_dim, 0.0f);
  double norm = 0;
  for (int d = 2 * pair_begin; d < 2 * pair_end; ++d) {
    (*out)[d] = static_cast<float>(rng.Normal());
    norm += (*out)[d] * (*out)[d];
  }
  const float inv = static_cast<float>(1.0 / std::sqrt(std::max(norm, 1e-30)));
  for (float& x : *out) x *= inv;
}

constexpr double kLocalKeyAmplitude = 8.0;     // |local component| of every key
constexpr double kSalienceKeyAmplitude = 2.0;  // key component per unit of salience
constexpr double kSinkKeyAmplitude = 8.0;      // the sink key's component in the sink pair

// Spans [start, start + len) over [1, context): tokens start+1.. copy token start.
std::vector<int64_t> DuplicateSources(const GeneratorConfig& c) {
  std::vector<int64_t> source(c.context + c.future);
  for (int64_t t = 0; t < static_cast<int64_t>(source.size()); ++t) source[t] = t;
  if (c.duplicate_share <= 0) return source;
  Rng rng(StreamSeed(c.seed, 1, 0, 0));
  std::vector<uint8_t> used(c.context, 0);
  used[0] = 1;
  const int64_t goal = static_cast<int64_t>(c.duplicate_share * static_cast<double>(c.context));
  int64_t copies = 0;
  for (int attempt = 0; attempt < 100000 && copies < goal; ++attempt) {
    const int64_t len = rng.Int(c.duplicate_min, c.duplicate_max);
    if (len + 1 >= c.context) break;
    const int64_t start = rng.Int(1, c.context - len - 1);
    bool free = true;
    // Keep one untouched token between spans so each span has its own origin.
    for (int64_t t = std::max<int64_t>(start - 1, 0); t <= std::min(start + len, c.context - 1);
         ++t) {
      free = free && used[t] == 0;
    }
    if (!free) continue;
    for (int64_t t = start; t < start + len; ++t) {
      used[t] = 1;
      source[t] = start;
    }
    copies += len - 1;
  }
  return source;
}

struct HeadSpec {
  bool local = false;
  double locality = 0;    // logit of the local component at distance 0
  double gain = 1;        // salience logit per unit of salience
  double sink_share = 0;  // target share of the first token
};

}  // namespace

const char* ProfileName(Profile p) { return p == Profile::kRedundant ? "redundant" : "standard"; }

bool ParseProfile(std::string_view name, Profile* out) {
  if (name == "standard") {
    *out = Profile::kStandard;
    return true;
  }
  if (name == "redundant") {
    *out = Profile::kRedundant;
    return true;
  }
  return false;
}

GeneratorConfig GeneratorConfig::ForProfile(Profile profile) {
  GeneratorConfig c;
  c.profile = profile;
  if (profile == Profile::kRedundant) {
    c.duplicate_share = 0.5;
    c.duplicate_min = 8;
    c.duplicate_max = 64;
  }
  return c;
}

absl::Status GeneratorConfig::Validate() const {
  auto bad = [](const std::string& what) {
    return absl::InvalidArgumentError(absl::StrCat("generator: ", what));
  };
  if (layers < 1 || q_heads < 1 || kv_heads < 1 || q_heads % kv_heads != 0) {
    return bad(absl::StrCat("layers (", layers, ") and heads (", q_heads, "/", kv_heads,
                            ") must be >= 1 with q_heads a multiple of kv_heads"));
  }
  if (head_dim < 32 || head_dim % 2 != 0 || head_dim > 1024) {
    return bad(absl::StrCat("head_dim ", head_dim, " must be even and in [32, 1024]"));
  }
  if (context < 16 || future < 1 || context + future > (int64_t{1} << 22)) {
    return bad(absl::StrCat("context ", context, " must be >= 16 and future ", future,
                            " >= 1 (total <= 2^22)"));
  }
  if (!(rope_theta > 1)) return bad("rope_theta must be > 1");
  // The sink is placed on the lowest-frequency rotary pair; it must not turn
  // by more than 1 radian over the sequence.
  const double lowest = std::pow(rope_theta, -2.0 * (head_dim / 2 - 1) / head_dim);
  if (static_cast<double>(context + future) * lowest > 1.0) {
    return bad(absl::StrCat("rope_theta ", rope_theta, " is too small for ", context + future,
                            " tokens (the lowest rotary frequency turns past 1 radian)"));
  }
  const Subspaces sub(head_dim);
  const int outlier_slots = 2 * (sub.sink_pair - sub.outlier_begin);
  if (outlier_channels < 0 || outlier_channels > outlier_slots) {
    return bad(absl::StrCat("outlier_channels ", outlier_channels, " must be in [0, ",
                            outlier_slots, "] for head_dim ", head_dim));
  }
  if (!(sink_share_min > 0 && sink_share_min <= sink_share_max && sink_share_max < 1)) {
    return bad("sink shares must satisfy 0 < min <= max < 1");
  }
  if (duplicate_share < 0 || duplicate_share > 0.9 || duplicate_min < 2 ||
      duplicate_max < duplicate_min) {
    return bad("duplicate_share must be in [0, 0.9] and 2 <= duplicate_min <= duplicate_max");
  }
  if (salience_head_correlation < 0 || salience_head_correlation > 1) {
    return bad("salience_head_correlation must be in [0, 1]");
  }
  if (local_head_share < 0 || local_head_share > 1 || sinkless_head_share < 0 ||
      sinkless_head_share > 1 || query_noise < 0 || sink_value_scale < 0) {
    return bad("head shares must be in [0, 1], query_noise and sink_value_scale >= 0");
  }
  return absl::OkStatus();
}

absl::StatusOr<KvDataset> Generate(const GeneratorConfig& c) {
  if (auto s = c.Validate(); !s.ok()) return s;
  const int D = c.head_dim;
  const int64_t T = c.context;
  const int64_t N = c.context + c.future;
  const Subspaces sub(D);
  const float sqrt_d = static_cast<float>(std::sqrt(static_cast<double>(D)));
  const int group = c.q_heads / c.kv_heads;

  KvDataset data;
  data.shape = {
      .layers = c.layers, .q_heads = c.q_heads, .kv_heads = c.kv_heads, .head_dim = D, .tokens = N};
  data.description = absl::StrFormat(
      "synthetic (%s profile, seed %d): %d layers, %d query heads, %d kv heads, head_dim %d, "
      "%d context + %d future tokens",
      ProfileName(c.profile), c.seed, c.layers, c.q_heads, c.kv_heads, D, T, c.future);
  data.q.assign(c.layers, std::vector<float>(static_cast<size_t>(c.q_heads) * N * D));
  data.k.assign(c.layers, std::vector<float>(static_cast<size_t>(c.kv_heads) * N * D));
  data.v.assign(c.layers, std::vector<float>(static_cast<size_t>(c.kv_heads) * N * D));

  const std::vector<int64_t> source = DuplicateSources(c);
  std::vector<double> shared_salience(N);
  {
    Rng rng(StreamSeed(c.seed, 2, 0, 0));
    for (double& z : shared_salience) z = rng.Normal();
  }

  // Per (layer, kv head): keys, values and the direction vectors its query
  // heads need.
  struct KvDirections {
    std::vector<float> local;     // unit, local subspace
    std::vector<float> salience;  // unit, salience subspace
  };
  std::vector<KvDirections> dirs(static_cast<size_t>(c.layers) * c.kv_heads);
  ParallelFor(static_cast<int64_t>(c.layers) * c.kv_heads, c.threads, [&](int64_t unit) {
    const int l = static_cast<int>(unit / c.kv_heads);
    const int g = static_cast<int>(unit % c.kv_heads);
    Rng rng(StreamSeed(c.seed, 3, static_cast<uint64_t>(l), static_cast<uint64_t>(g)));
    KvDirections& dir = dirs[unit];
    // Equal weight on every local pair (random phase): the logit then falls
    // with distance as a sum of cosines, RoPE's long-term decay.
    dir.local.assign(D, 0.0f);
    for (int p = 0; p < sub.local_end; ++p) {
      const double phase = 2 * M_PI * rng.Uniform();
      const double amp = 1.0 / std::sqrt(static_cast<double>(sub.local_end));
      dir.local[2 * p] = static_cast<float>(amp * std::cos(phase));
      dir.local[2 * p + 1] = static_cast<float>(amp * std::sin(phase));
    }
    RandomUnit(rng, D, sub.salience_begin, sub.salience_end, &dir.salience);
    // Outlier channels: distinct dims in the outlier pairs, signed magnitudes.
    std::vector<int> channels;
    std::vector<float> magnitude;
    const int slots = 2 * (sub.sink_pair - sub.outlier_begin);
    while (static_cast<int>(channels.size()) < c.outlier_channels) {
      const int ch = 2 * sub.outlier_begin + static_cast<int>(rng.Int(0, slots - 1));
      if (std::find(channels.begin(), channels.end(), ch) != channels.end()) continue;
      channels.push_back(ch);
      const double m = rng.Uniform(c.outlier_min, c.outlier_max);
      magnitude.push_back(static_cast<float>(rng.Uniform() < 0.5 ? -m : m));
    }
    const double rho = c.salience_head_correlation;
    float* keys = data.k[l].data() + static_cast<size_t>(g) * N * D;
    float* values = data.v[l].data() + static_cast<size_t>(g) * N * D;
    std::vector<double> salience(N);
    for (int64_t t = 0; t < N; ++t) {
      float* k = keys + t * D;
      float* v = values + t * D;
      const double own = rng.Normal();
      if (source[t] != t) {
        // A near-duplicate of the span's first token (already written, pre-rotary).
        const float* ks = keys + source[t] * D;  // still pre-rotary: rotated at the end
        const float* vs = values + source[t] * D;
        for (int d = 0; d < D; ++d) {
          k[d] = ks[d] + static_cast<float>(c.duplicate_noise * rng.Normal());
          v[d] = vs[d] * static_cast<float>(1.0 + c.duplicate_noise * rng.Normal());
        }
        salience[t] = salience[source[t]];
        k[2 * sub.sink_pair] = 0;
        k[2 * sub.sink_pair + 1] = 0;
        continue;
      }
      const double z = rho * shared_salience[t] + std::sqrt(1 - rho * rho) * own;
      salience[t] = t == 0 ? 0.0 : ExpFromNormal(z);
      for (int d = 0; d < 2 * sub.sink_pair; ++d) k[d] = static_cast<float>(rng.Normal());
      k[2 * sub.sink_pair] = t == 0 ? static_cast<float>(kSinkKeyAmplitude) : 0.0f;
      k[2 * sub.sink_pair + 1] = 0;
      for (int d = 0; d < D; ++d) {
        k[d] += static_cast<float>(kLocalKeyAmplitude) * dir.local[d] +
                static_cast<float>(kSalienceKeyAmplitude * salience[t]) * dir.salience[d];
      }
      for (size_t o = 0; o < channels.size(); ++o) {
        k[channels[o]] = magnitude[o] + static_cast<float>(0.5 * rng.Normal());
      }
      const double scale = std::exp(0.2 * rng.Normal()) * (t == 0 ? c.sink_value_scale : 1.0);
      for (int d = 0; d < D; ++d) v[d] = static_cast<float>(scale * rng.Normal());
    }
    // Rotary embedding, then fp16 rounding (copies were made from pre-rotary keys).
    for (int64_t t = 0; t < N; ++t) {
      ApplyRope(keys + t * D, D, t, c.rope_theta);
      for (int d = 0; d < D; ++d) {
        keys[t * D + d] = RoundToHalf(keys[t * D + d]);
        values[t * D + d] = RoundToHalf(values[t * D + d]);
      }
    }
  });

  // Queries, one (layer, query head) at a time.
  ParallelFor(static_cast<int64_t>(c.layers) * c.q_heads, c.threads, [&](int64_t unit) {
    const int l = static_cast<int>(unit / c.q_heads);
    const int h = static_cast<int>(unit % c.q_heads);
    const int g = h / group;
    const KvDirections& dir = dirs[static_cast<size_t>(l) * c.kv_heads + g];
    Rng rng(StreamSeed(c.seed, 4, static_cast<uint64_t>(l), static_cast<uint64_t>(h)));
    HeadSpec spec;
    spec.local = rng.Uniform() < c.local_head_share;
    spec.locality = spec.local ? rng.Uniform(8.0, 12.0) : rng.Uniform(0.5, 2.5);
    spec.gain = spec.local ? rng.Uniform(0.5, 0.8) : rng.Uniform(0.9, 1.2);
    if (l < c.sink_from_layer) {
      spec.sink_share = rng.Uniform(0.02, 0.25);
    } else if (rng.Uniform() < c.sinkless_head_share) {
      spec.sink_share = rng.Uniform(0.05, 0.4);
    } else {
      spec.sink_share = rng.Uniform(c.sink_share_min, c.sink_share_max);
    }
    const double lambda = spec.locality * sqrt_d / kLocalKeyAmplitude;
    const double salience_q = spec.gain * sqrt_d / kSalienceKeyAmplitude;
    const float* keys = data.k[l].data() + static_cast<size_t>(g) * N * D;
    float* queries = data.q[l].data() + static_cast<size_t>(h) * N * D;
    const double sink_freq = std::pow(c.rope_theta, -2.0 * sub.sink_pair / D);
    std::vector<double> logits(N);
    for (int64_t i = 0; i < N; ++i) {
      float* q = queries + i * D;
      const double gi = 1.0 + 0.05 * rng.Normal();
      for (int d = 0; d < 2 * sub.sink_pair; ++d) {
        q[d] = static_cast<float>(c.query_noise * rng.Normal() + lambda * dir.local[d] +
                                  salience_q * gi * dir.salience[d]);
      }
      q[2 * sub.sink_pair] = 0;
      q[2 * sub.sink_pair + 1] = 0;
      ApplyRope(q, D, i, c.rope_theta);
      const double share = std::clamp(spec.sink_share + 0.03 * rng.Normal(), 0.005, 0.98);
      // Causal: the query sees keys [0, i].
      const int64_t n = i + 1;
      if (n >= 2) {
        double max_logit = -1e300;
        for (int64_t j = 1; j < n; ++j) {
          logits[j] = Dot(q, keys + j * D, D) / sqrt_d;
          max_logit = std::max(max_logit, logits[j]);
        }
        double sum = 0;
        for (int64_t j = 1; j < n; ++j) sum += std::exp(logits[j] - max_logit);
        const double lse_rest = max_logit + std::log(sum);
        const double want = std::log(share / (1 - share)) + lse_rest;
        const double have = Dot(q, keys, D) / sqrt_d;
        // The sink key is kSinkKeyAmplitude along the sink pair's first axis
        // (position 0: not rotated); the query's component there, rotated by
        // i * sink_freq, contributes m * amplitude * cos(angle) / sqrt(D).
        const double angle = static_cast<double>(i) * sink_freq;
        const double m = (want - have) * sqrt_d / (kSinkKeyAmplitude * std::cos(angle));
        q[2 * sub.sink_pair] = static_cast<float>(m * std::cos(angle));
        q[2 * sub.sink_pair + 1] = static_cast<float>(m * std::sin(angle));
      }
      for (int d = 0; d < D; ++d) q[d] = RoundToHalf(q[d]);
    }
  });
  return data;
}

}  // namespace kvcache::eval
