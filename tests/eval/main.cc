// kvcache-eval: compares KV retention policies side by side at equal byte
// budgets, on synthetic data with published attention statistics or on a
// real KV dump (docs/importance.md, "The evaluation").
//
//   kvcache-eval [--profile standard|redundant | --input dump.safetensors] [options]
//   kvcache-eval model --out results.json [options]   the real model (fidelity.py)
//
// Prints the data's measured statistics, one markdown table per budget,
// the single operating points and the acceptance targets; --csv and --svg
// write the results as a file and a plot. Exits 1 on an error (a bad dump,
// an unwritable file), 2 on a bad command line.
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "tests/eval/accounting.h"
#include "tests/eval/attention_pass.h"
#include "tests/eval/generator.h"
#include "tests/eval/importance_policy.h"
#include "tests/eval/metrics.h"
#include "tests/eval/policies.h"
#include "tests/eval/report.h"
#include "tests/eval/safetensors.h"
#include "tests/eval/statistics.h"
#include "tests/eval/svg_plot.h"

namespace kvcache::eval {
namespace {

constexpr const char* kDefaultPolicies =
    "full,int8,streaming,h2o,snapkv,ours,ours-int8,ours-a0,ours-b0,ours-g0";

struct Options {
  std::string input;
  std::string profile = "standard";
  GeneratorConfig gen;
  std::string dump;
  std::string dump_dtype = "f16";
  std::string budgets = "0.15,0.25,0.37,0.5,0.75,1.0";
  std::string policies = kDefaultPolicies;
  std::string natural_targets = "0.95";
  double budget_point = 0.37;
  ImportanceOptions ours;
  std::string activity = "decay";
  std::string activity_norm = "unprotected";
  std::string select_scope = "block";
  std::string calibration = "off";
  std::string novelty = "block";
  int64_t report_every = 64;
  int64_t snap_window = 32;
  int64_t snap_pool = 7;
  int64_t stream_sinks = 4;
  std::string csv;
  std::string svg;
  std::string svg_title;
  int threads = 1;
  int repeat = 1;
};

double Seconds(std::chrono::steady_clock::time_point since) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - since).count();
}

int Fail(const absl::Status& s) {
  std::fprintf(stderr, "kvcache-eval: %s\n", std::string(s.message()).c_str());
  return 1;
}

// One dataset (a seed, or the dump): its statistics and every policy's rows.
struct RunResult {
  DatasetStatistics stats;
  std::vector<ResultRow> rows;
  std::vector<double> budgets;
};

absl::Status RunOnce(Options& o, Profile profile, uint64_t seed, bool first, RunResult* out) {
  const auto start = std::chrono::steady_clock::now();
  // --- Data ---
  KvDataset data;
  const int64_t future = o.gen.future;
  if (!o.input.empty()) {
    absl::StatusOr<KvDataset> d = LoadKvDump(o.input);
    if (!d.ok()) return d.status();
    data = *std::move(d);
  } else {
    const GeneratorConfig g = GeneratorConfig::ForProfile(profile);
    GeneratorConfig c = o.gen;
    c.profile = profile;
    c.seed = seed;
    c.duplicate_share = c.duplicate_share < 0 ? g.duplicate_share : c.duplicate_share;
    c.duplicate_min = g.duplicate_min;
    c.duplicate_max = g.duplicate_max;
    c.threads = o.threads;
    absl::StatusOr<KvDataset> d = Generate(c);
    if (!d.ok()) return d.status();
    data = *std::move(d);
  }
  if (auto s = CheckSplit(data.shape, future); !s.ok()) return s;
  const int64_t context = data.shape.tokens - future;
  std::printf("\nData: %s. Context %lld tokens, %lld held-out future queries. Ready in %.1f s.\n",
              data.description.c_str(), static_cast<long long>(context),
              static_cast<long long>(future), Seconds(start));
  if (first && !o.dump.empty()) {
    kernels::DType dt = o.dump_dtype == "bf16"  ? kernels::DType::kBFloat16
                        : o.dump_dtype == "f32" ? kernels::DType::kFloat32
                                                : kernels::DType::kFloat16;
    if (auto s = WriteKvDump(o.dump, data, dt); !s.ok()) return s;
    std::printf("Wrote the data to %s.\n", o.dump.c_str());
  }

  // --- Attention ---
  auto t0 = std::chrono::steady_clock::now();
  PastAttentionOptions po;
  po.report_every = o.report_every;
  po.snap_window = o.snap_window;
  po.threads = o.threads;
  absl::StatusOr<PastAttention> past = ComputePastAttention(data, context, po);
  if (!past.ok()) return past.status();
  absl::StatusOr<FutureReference> ref = ComputeFutureReference(data, context, 64, o.threads);
  if (!ref.ok()) return ref.status();
  out->stats = MeasureStatistics(data, *past, *ref, o.gen.sink_from_layer);
  std::printf("Past and future attention in %.1f s.\n", Seconds(t0));

  // --- Policies ---
  PolicyContext ctx;
  ctx.data = &data;
  ctx.past = &*past;
  ctx.shape = {.layers = data.shape.layers,
               .kv_heads = data.shape.kv_heads,
               .head_dim = data.shape.head_dim,
               .context = context,
               .scale_group = o.ours.block_tokens};
  ImportanceOptions base = o.ours;
  base.activity = o.activity == "accumulate" ? ActivityMode::kAccumulate : ActivityMode::kDecay;
  base.norm =
      o.activity_norm == "unprotected" ? ActivityNorm::kUnprotected : ActivityNorm::kSequence;
  base.scope = o.select_scope == "sequence" ? SelectScope::kSequence : SelectScope::kBlock;
  base.novelty_per_block = o.novelty == "block";
  if (!base.params.Valid()) return absl::InvalidArgumentError("invalid importance params");
  if (o.calibration != "off") {
    const CalibrationOutcome cal = CalibrateWeights(
        ctx, base,
        o.calibration == "daemon" ? CalibrationMode::kDaemon : CalibrationMode::kUnprotected);
    if (cal.ok) {
      base.params.alpha = cal.weights.alpha;
      base.params.beta = cal.weights.beta;
      base.params.gamma = cal.weights.gamma;
    }
    std::printf(
        "Calibration (%s samples, %zu kept): %s alpha %.3f beta %.3f gamma %.3f "
        "(correlation %.3f).\n",
        o.calibration.c_str(), cal.samples, cal.ok ? "fitted" : "no fit, kept", base.params.alpha,
        base.params.beta, base.params.gamma, cal.correlation);
  }
  if (first) {
    std::printf(
        "Ours: alpha %.3f beta %.3f gamma %.3f, sinks %lld, window %lld, tau %.0f; "
        "activity %s, normalised by the %s max, threshold per %s, novelty per %s.\n",
        base.params.alpha, base.params.beta, base.params.gamma,
        static_cast<long long>(base.params.sink_tokens),
        static_cast<long long>(base.params.recent_window), base.params.decay_tau,
        o.activity.c_str(), o.activity_norm.c_str(), o.select_scope.c_str(), o.novelty.c_str());
  }
  std::vector<std::unique_ptr<RetentionPolicy>> policies;
  for (const std::string& name :
       std::vector<std::string>(absl::StrSplit(o.policies, ',', absl::SkipEmpty()))) {
    ImportanceOptions io = base;
    if (name == "full") {
      policies.push_back(MakeFullPolicy(ctx));
    } else if (name == "int8") {
      policies.push_back(MakeInt8Policy(ctx));
    } else if (name == "streaming") {
      policies.push_back(MakeStreamingPolicy(ctx, o.stream_sinks));
    } else if (name == "h2o") {
      policies.push_back(MakeH2oPolicy(ctx));
    } else if (name == "snapkv") {
      policies.push_back(MakeSnapKvPolicy(ctx, o.snap_window, o.snap_pool));
    } else if (name == "ours" || name == "ours-int8" || name == "ours-head" ||
               name == "ours-head-int8") {
      io.int8 = name.find("int8") != std::string::npos;
      io.granularity =
          name.find("head") != std::string::npos ? Granularity::kHead : Granularity::kModel;
      policies.push_back(MakeImportancePolicy(ctx, io, name));
      if (io.granularity == Granularity::kModel) {
        for (const std::string& t :
             std::vector<std::string>(absl::StrSplit(o.natural_targets, ',', absl::SkipEmpty()))) {
          double target = 0;
          if (!absl::SimpleAtod(t, &target) || !(target > 0) || target > 1) {
            return absl::InvalidArgumentError(
                absl::StrFormat("--natural-targets: '%s' is not in (0, 1]", t));
          }
          io.natural_target = target;
          policies.push_back(
              MakeImportancePolicy(ctx, io, absl::StrFormat("%s@%.2f", name, target)));
        }
      }
    } else if (name == "ours-a0" || name == "ours-b0" || name == "ours-g0") {
      (name == "ours-a0"   ? io.params.alpha
       : name == "ours-b0" ? io.params.beta
                           : io.params.gamma) = 0;
      if (!(io.params.alpha + io.params.beta + io.params.gamma > 0)) {
        std::printf("Skipping %s: no weight left.\n", name.c_str());
        continue;
      }
      policies.push_back(MakeImportancePolicy(ctx, io, name));
    } else {
      return absl::InvalidArgumentError(absl::StrFormat("unknown policy '%s'", name));
    }
  }

  // --- Evaluation ---
  t0 = std::chrono::steady_clock::now();
  const uint64_t full_bytes = FullFp16Bytes(ctx.shape);
  for (const auto& p : policies) {
    const std::vector<double> points = p->budgeted() ? out->budgets : std::vector<double>{-1.0};
    for (double b : points) {
      const uint64_t budget =
          b < 0 ? full_bytes : static_cast<uint64_t>(b * static_cast<double>(full_bytes));
      const RetentionPlan plan = p->Plan(budget);
      absl::StatusOr<PlanMetrics> m = EvaluatePlan(data, *ref, ctx.shape, plan, o.threads);
      if (!m.ok()) return m.status();
      out->rows.push_back({p->name(), b, *m});
    }
  }
  std::printf("Policies planned and evaluated in %.1f s.\n", Seconds(t0));
  return absl::OkStatus();
}

// Field-wise mean of the runs' statistics.
DatasetStatistics MeanStatistics(const std::vector<RunResult>& runs) {
  DatasetStatistics m;
  const double n = static_cast<double>(runs.size());
  for (const RunResult& r : runs) {
    const DatasetStatistics& s = r.stats;
    m.sink_heads_in_range += s.sink_heads_in_range / n;
    m.sink_share_mean += s.sink_share_mean / n;
    m.sink_share_early += s.sink_share_early / n;
    m.sparsity += s.sparsity / n;
    m.powerlaw_r2 += s.powerlaw_r2 / n;
    m.powerlaw_slope += s.powerlaw_slope / n;
    m.persistence += s.persistence / n;
    m.persistence_head_mean += s.persistence_head_mean / n;
    m.persistence_count += s.persistence_count / n;
    m.outlier_channels += s.outlier_channels / n;
    m.outlier_ratio += s.outlier_ratio / n;
    m.outlier_stability += s.outlier_stability / n;
    m.duplicate_share += s.duplicate_share / n;
    m.mean_novelty += s.mean_novelty / n;
    m.sink_value_ratio += s.sink_value_ratio / n;
    m.local_heads += s.local_heads;
    m.broad_heads += s.broad_heads;
    m.heads += s.heads;
  }
  return m;
}

// Row-wise mean of the runs' metrics (every run has the same rows in order).
std::vector<ResultRow> MeanRows(const std::vector<RunResult>& runs) {
  std::vector<ResultRow> rows = runs[0].rows;
  const double n = static_cast<double>(runs.size());
  for (size_t i = 0; i < rows.size(); ++i) {
    PlanMetrics m;
    m.key_rel_rmse = 0;
    m.value_rel_rmse = 0;
    double fraction = 0;
    for (const RunResult& r : runs) {
      const PlanMetrics& x = r.rows[i].m;
      fraction += x.bytes_fraction / n;
      m.kept_fraction += x.kept_fraction / n;
      m.int8_fraction += x.int8_fraction / n;
      m.output_error += x.output_error / n;
      m.output_error_vrms += x.output_error_vrms / n;
      m.mass += x.mass / n;
      m.mass_no_sink += x.mass_no_sink / n;
      m.recall += x.recall / n;
      m.key_rel_rmse += x.key_rel_rmse / n;
      m.value_rel_rmse += x.value_rel_rmse / n;
    }
    m.bytes = rows[i].m.bytes;  // the same shape in every run: the first run's bytes
    m.bytes_fraction = fraction;
    rows[i].m = m;
  }
  return rows;
}

int Run(Options& o) {
  const auto start = std::chrono::steady_clock::now();
  Profile profile = Profile::kStandard;
  ParseProfile(o.profile, &profile);
  const bool synthetic = o.input.empty();
  if (!synthetic && o.repeat != 1) {
    std::fprintf(stderr, "kvcache-eval: --repeat needs synthetic data\n");
    return 2;
  }
  std::vector<double> budgets;
  for (const std::string& b :
       std::vector<std::string>(absl::StrSplit(o.budgets, ',', absl::SkipEmpty()))) {
    double v = 0;
    if (!absl::SimpleAtod(b, &v) || !(v > 0) || v > 1.5) {
      std::fprintf(stderr, "kvcache-eval: bad budget '%s' (a fraction in (0, 1.5])\n", b.c_str());
      return 2;
    }
    budgets.push_back(v);
  }
  for (const std::string& name :
       std::vector<std::string>(absl::StrSplit(o.policies, ',', absl::SkipEmpty()))) {
    static const char* const kKnown[] = {"full",    "int8",    "streaming", "h2o",
                                         "snapkv",  "ours",    "ours-int8", "ours-a0",
                                         "ours-b0", "ours-g0", "ours-head", "ours-head-int8"};
    if (std::find(std::begin(kKnown), std::end(kKnown), name) == std::end(kKnown)) {
      std::fprintf(stderr, "kvcache-eval: unknown policy '%s'\n", name.c_str());
      return 2;
    }
  }
  std::printf("# kvcache-eval\n");
  std::vector<RunResult> runs(o.repeat);
  for (int r = 0; r < o.repeat; ++r) {
    runs[r].budgets = budgets;
    if (auto s = RunOnce(o, profile, o.gen.seed + r, r == 0, &runs[r]); !s.ok()) return Fail(s);
  }
  const std::string over = o.repeat > 1 ? absl::StrFormat(" (mean over %d seeds, %d..%d)", o.repeat,
                                                          o.gen.seed, o.gen.seed + o.repeat - 1)
                                        : std::string();
  std::printf(
      "\n### Measured statistics of the data%s\n\n| statistic | measured | target | met |\n"
      "|---|---|---|---|\n",
      over.c_str());
  for (const StatisticRow& r :
       StatisticRows(MeanStatistics(runs), synthetic && profile == Profile::kRedundant)) {
    std::printf("| %s | %s | %s | %s |\n", r.name.c_str(), r.measured.c_str(), r.target.c_str(),
                r.has_target ? (r.met ? "yes" : "**no**") : "-");
  }
  const std::vector<ResultRow> rows = MeanRows(runs);
  if (!over.empty()) std::printf("\nResults%s.\n", over.c_str());
  PrintResults(stdout, rows, budgets);
  const bool outliers = !synthetic || o.gen.outlier_channels > 0;
  PrintTargets(stdout, CheckTargets(rows, o.budget_point,
                                    synthetic && profile == Profile::kRedundant, outliers));
  if (!o.csv.empty()) {
    if (auto s = WriteCsv(o.csv, rows); !s.ok()) return Fail(s);
  }
  if (!o.svg.empty()) {
    const std::string title =
        !o.svg_title.empty() ? o.svg_title
        : synthetic ? absl::StrFormat("kvcache-eval: %s profile%s", ProfileName(profile), over)
                    : absl::StrFormat("kvcache-eval: %s", o.input);
    if (auto s = WriteSvg(o.svg, rows, title); !s.ok()) return Fail(s);
  }
  std::printf("\nTotal %.1f s.\n", Seconds(start));
  return 0;
}

}  // namespace
}  // namespace kvcache::eval

// `kvcache-eval model ...`: the fidelity evaluation on the real model, which
// runs in Python (tests/eval/fidelity.py through run_fidelity.sh, with this
// build's evaluation venv); the remaining arguments go to fidelity.py.
static int RunRealModel(int argc, char** argv) {
  std::vector<std::string> args = {"bash", KVCACHE_EVAL_SOURCE_DIR "/run_fidelity.sh",
                                   KVCACHE_EVAL_BUILD_DIR};
  for (int i = 2; i < argc; ++i) args.emplace_back(argv[i]);
  std::vector<char*> c_args;
  for (std::string& a : args) c_args.push_back(a.data());
  c_args.push_back(nullptr);
  execvp("bash", c_args.data());
  std::perror("kvcache-eval model: cannot run bash");
  return 1;
}

int main(int argc, char** argv) {
  using kvcache::eval::Options;
  if (argc >= 2 && std::string(argv[1]) == "model") return RunRealModel(argc, argv);
  Options o;
  o.gen.duplicate_share = -1;  // the profile's default unless given
  CLI::App app(
      "kvcache-eval: KV retention policies side by side at equal byte budgets.\n"
      "On the real model: kvcache-eval model --out results.json [--help for its options].\n"
      "Exits 1 on an error, 2 on a bad command line.",
      "kvcache-eval");
  auto* input = app.add_option("--input", o.input,
                               "KV dump (safetensors, schema in docs/importance.md) instead of "
                               "synthetic data");
  app.add_option("--profile", o.profile, "synthetic profile")
      ->capture_default_str()
      ->check(CLI::IsMember({"standard", "redundant"}))
      ->excludes(input);
  app.add_option("--seed", o.gen.seed, "generator seed")->capture_default_str();
  app.add_option("--layers", o.gen.layers, "generator: layers")->capture_default_str();
  app.add_option("--q-heads", o.gen.q_heads, "generator: query heads")->capture_default_str();
  app.add_option("--kv-heads", o.gen.kv_heads, "generator: kv heads")->capture_default_str();
  app.add_option("--head-dim", o.gen.head_dim, "generator: head_dim")->capture_default_str();
  app.add_option("--context", o.gen.context, "generator: cached context tokens")
      ->capture_default_str();
  app.add_option("--future", o.gen.future,
                 "held-out future queries (generated after the context; for a dump, its last "
                 "tokens)")
      ->capture_default_str();
  app.add_option("--outlier-channels", o.gen.outlier_channels,
                 "generator: outlier key channels per kv head")
      ->capture_default_str();
  app.add_option("--salience-head-correlation", o.gen.salience_head_correlation,
                 "generator: how much heads share heavy hitters (0..1)")
      ->capture_default_str();
  app.add_option("--query-noise", o.gen.query_noise,
                 "generator: std of the query-specific logit noise")
      ->capture_default_str();
  app.add_option("--duplicate-share", o.gen.duplicate_share,
                 "generator: share of tokens that are near-duplicate copies (default: the "
                 "profile's, 0.08 / 0.5)");
  app.add_option("--dump", o.dump, "also write the data as a KV dump (safetensors)");
  app.add_option("--dump-dtype", o.dump_dtype, "dtype of --dump")
      ->capture_default_str()
      ->check(CLI::IsMember({"f16", "bf16", "f32"}));
  app.add_option("--budgets", o.budgets, "byte budgets, fractions of full FP16")
      ->capture_default_str();
  app.add_option("--policies", o.policies,
                 "policies: full,int8,streaming,h2o,snapkv,ours,ours-int8,ours-a0,ours-b0,"
                 "ours-g0,ours-head,ours-head-int8")
      ->capture_default_str();
  app.add_option("--natural-targets", o.natural_targets,
                 "also report ours / ours-int8 at these target masses without a budget "
                 "(the daemon's operating points; 1.0 with INT8 is its quantize mode; empty: "
                 "none)")
      ->capture_default_str();
  app.add_option("--budget-point", o.budget_point, "budget of the acceptance targets")
      ->capture_default_str();
  app.add_option("--alpha", o.ours.params.alpha, "ours: weight of activity")->capture_default_str();
  app.add_option("--beta", o.ours.params.beta, "ours: weight of position")->capture_default_str();
  app.add_option("--gamma", o.ours.params.gamma, "ours: weight of novelty")->capture_default_str();
  app.add_option("--sinks", o.ours.params.sink_tokens, "ours: protected sink tokens")
      ->capture_default_str();
  app.add_option("--window", o.ours.params.recent_window, "ours: protected recent window")
      ->capture_default_str();
  app.add_option("--tau", o.ours.params.decay_tau, "ours: position decay tau (tokens)")
      ->capture_default_str();
  app.add_option("--activity", o.activity,
                 "ours: decay (DecayActivity per report) or "
                 "accumulate (normalised sum of all reports)")
      ->capture_default_str()
      ->check(CLI::IsMember({"decay", "accumulate"}));
  app.add_option("--activity-norm", o.activity_norm,
                 "ours: normalise reports by the largest unprotected mass (the daemon's rule) or "
                 "by the sequence max (its first rule)")
      ->capture_default_str()
      ->check(CLI::IsMember({"sequence", "unprotected"}));
  app.add_option("--select-scope", o.select_scope,
                 "ours: SelectByMass per block (daemon) or over the whole sequence")
      ->capture_default_str()
      ->check(CLI::IsMember({"block", "sequence"}));
  app.add_option("--calibration", o.calibration,
                 "ours: off (the given weights), daemon (fit weights on every reported token, "
                 "as the daemon's first rule sampled) or unprotected (fit on unprotected tokens "
                 "only, as the daemon samples now; the fit it converges to)")
      ->capture_default_str()
      ->check(CLI::IsMember({"off", "daemon", "unprotected"}));
  app.add_option("--novelty", o.novelty,
                 "ours: novelty per block as the daemon computes it (a block's first token "
                 "gets 1) or over the whole sequence")
      ->capture_default_str()
      ->check(CLI::IsMember({"block", "sequence"}));
  app.add_option("--block-tokens", o.ours.block_tokens,
                 "tokens per block (ours' blocks, novelty blocks, key-scale groups)")
      ->capture_default_str()
      ->check(CLI::Range(int64_t{1}, int64_t{1} << 20));
  app.add_option("--report-every", o.report_every, "past queries per attention report")
      ->capture_default_str()
      ->check(CLI::Range(int64_t{1}, int64_t{1} << 20));
  app.add_option("--seconds-per-token", o.ours.seconds_per_token,
                 "ours: time between past queries, for the activity half-life")
      ->capture_default_str();
  app.add_option("--half-life", o.ours.half_life_seconds, "ours: activity half-life (s)")
      ->capture_default_str();
  app.add_option("--activity-weight", o.ours.activity_weight,
                 "ours: DecayActivity weight of a report")
      ->capture_default_str();
  app.add_option("--snap-window", o.snap_window, "SnapKV observation window")
      ->capture_default_str()
      ->check(CLI::Range(int64_t{1}, int64_t{1} << 20));
  app.add_option("--snap-pool", o.snap_pool, "SnapKV pooling kernel")
      ->capture_default_str()
      ->check(CLI::Range(int64_t{1}, int64_t{1025}));
  app.add_option("--stream-sinks", o.stream_sinks, "StreamingLLM sink tokens")
      ->capture_default_str();
  app.add_option("--csv", o.csv, "write every result to this CSV file");
  app.add_option("--svg", o.svg, "write the fidelity-vs-bytes plot to this SVG file");
  app.add_option("--svg-title", o.svg_title, "title of the plot");
  app.add_option("--repeat", o.repeat,
                 "synthetic: run seeds seed..seed+N-1 and report the mean of every figure")
      ->capture_default_str()
      ->check(CLI::Range(1, 100));
  app.add_option("--threads", o.threads, "worker threads")
      ->capture_default_str()
      ->check(CLI::Range(1, 256));
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e) == 0 ? 0 : 2;
  }
  return kvcache::eval::Run(o);
}
