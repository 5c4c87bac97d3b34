#include "tests/eval/report.h"

#include <cmath>
#include <fstream>

#include "absl/strings/str_format.h"

namespace kvcache::eval {
namespace {

const ResultRow* Find(const std::vector<ResultRow>& rows, const std::string& policy,
                      double budget) {
  for (const ResultRow& r : rows) {
    if (r.policy == policy && std::fabs(r.budget - budget) < 1e-9) return &r;
  }
  return nullptr;
}

std::string Pct(double x, int digits = 2) { return absl::StrFormat("%.*f%%", digits, 100 * x); }

void PrintHeader(std::FILE* out) {
  std::fprintf(out,
               "| policy | bytes (of FP16) | kept | INT8 | output rel. err | err / RMS(v) | "
               "mass | mass w/o sink | top-64 recall |\n"
               "|---|---:|---:|---:|---:|---:|---:|---:|---:|\n");
}

void PrintRow(std::FILE* out, const ResultRow& r) {
  std::fprintf(out, "| %s | %.3f | %s | %s | %s | %s | %.4f | %.4f | %.3f |\n", r.policy.c_str(),
               r.m.bytes_fraction, Pct(r.m.kept_fraction, 1).c_str(),
               Pct(r.m.int8_fraction, 1).c_str(), Pct(r.m.output_error).c_str(),
               Pct(r.m.output_error_vrms).c_str(), r.m.mass, r.m.mass_no_sink, r.m.recall);
}

}  // namespace

void PrintResults(std::FILE* out, const std::vector<ResultRow>& rows,
                  const std::vector<double>& budgets) {
  for (double b : budgets) {
    std::fprintf(out, "\n### Budget %.2f of FP16 bytes\n\n", b);
    PrintHeader(out);
    for (const ResultRow& r : rows) {
      if (std::fabs(r.budget - b) < 1e-9) PrintRow(out, r);
    }
  }
  std::fprintf(out, "\n### Single operating points\n\n");
  PrintHeader(out);
  for (const ResultRow& r : rows) {
    if (r.budget < 0) PrintRow(out, r);
  }
  std::fflush(out);
}

absl::Status WriteCsv(const std::string& path, const std::vector<ResultRow>& rows) {
  std::ofstream f(path, std::ios::trunc);
  if (!f) return absl::NotFoundError(absl::StrFormat("cannot create %s", path));
  f << "policy,budget,bytes_fraction,bytes_total,bytes_fp16,bytes_int8_codes,bytes_key_scales,"
       "bytes_value_scales,bytes_indices,kept_fraction,int8_fraction,output_rel_error,"
       "output_error_over_rms_v,mass,mass_no_sink,top64_recall,key_int8_rel_rmse,"
       "value_int8_rel_rmse\n";
  for (const ResultRow& r : rows) {
    const PlanMetrics& m = r.m;
    f << absl::StrFormat(
        "%s,%s,%.6f,%d,%d,%d,%d,%d,%d,%.6f,%.6f,%.8f,%.8f,%.8f,%.8f,%.6f,%.8f,%.8f\n", r.policy,
        r.budget < 0 ? std::string("point") : absl::StrFormat("%.4f", r.budget), m.bytes_fraction,
        m.bytes.total(), m.bytes.fp16, m.bytes.int8_codes, m.bytes.key_scales, m.bytes.value_scales,
        m.bytes.indices, m.kept_fraction, m.int8_fraction, m.output_error, m.output_error_vrms,
        m.mass, m.mass_no_sink, m.recall, m.key_rel_rmse, m.value_rel_rmse);
  }
  f.close();
  if (!f) return absl::DataLossError(absl::StrFormat("error writing %s", path));
  return absl::OkStatus();
}

std::vector<TargetCheck> CheckTargets(const std::vector<ResultRow>& rows, double budget_point,
                                      bool redundant, bool outlier_channels) {
  std::vector<TargetCheck> checks;
  if (const ResultRow* q = Find(rows, "int8", -1)) {
    const double elem = std::max(q->m.key_rel_rmse, q->m.value_rel_rmse);
    checks.push_back({"INT8 alone: element relative RMSE <= 1%",
                      absl::StrFormat("keys %s, values %s", Pct(q->m.key_rel_rmse, 3),
                                      Pct(q->m.value_rel_rmse, 3)),
                      elem <= 0.01, true});
    const double limit = outlier_channels ? 0.015 : 0.01;
    checks.push_back({absl::StrFormat("INT8 alone: attention-output error <= %s%s", Pct(limit, 1),
                                      outlier_channels ? " (with outlier channels)" : ""),
                      Pct(q->m.output_error, 3), q->m.output_error <= limit, true});
  }
  const ResultRow* h2o = Find(rows, "h2o", budget_point);
  for (const char* ours : {"ours", "ours-int8"}) {
    const ResultRow* o = Find(rows, ours, budget_point);
    if (o == nullptr) continue;
    checks.push_back({absl::StrFormat("%s at %.2f: retained mass >= 0.95", ours, budget_point),
                      absl::StrFormat("%.4f (w/o sink %.4f; bytes %.3f)", o->m.mass,
                                      o->m.mass_no_sink, o->m.bytes_fraction),
                      o->m.mass >= 0.95, true});
    if (h2o != nullptr) {
      const double ratio = o->m.output_error / std::max(h2o->m.output_error, 1e-12);
      checks.push_back(
          {absl::StrFormat("%s at %.2f: output error <= 0.9x H2O's", ours, budget_point),
           absl::StrFormat("%s vs H2O %s (%.2fx)", Pct(o->m.output_error), Pct(h2o->m.output_error),
                           ratio),
           ratio <= 0.9, true});
    }
  }
  // gamma: ours vs ours-g0 at every budget both ran.
  double worst = -1e9, mean = 0;
  int n = 0, wins = 0;
  std::string detail;
  for (const ResultRow& r : rows) {
    if (r.policy != "ours" || r.budget < 0) continue;
    const ResultRow* g0 = Find(rows, "ours-g0", r.budget);
    if (g0 == nullptr || g0->m.output_error < 1e-6) continue;  // both exact: no comparison
    const double rel = r.m.output_error / std::max(g0->m.output_error, 1e-12) - 1;
    worst = std::max(worst, rel);
    mean += rel;
    wins += rel < 0;
    ++n;
    detail += absl::StrFormat("%s%.2f: %+.2f%%", detail.empty() ? "" : ", ", r.budget, 100 * rel);
  }
  if (n > 0) {
    mean /= n;
    if (redundant) {
      checks.push_back({"gamma > 0 wins on the redundancy-heavy profile (error vs gamma = 0)",
                        absl::StrFormat("mean %+.2f%%, wins at %d of %d budgets (%s)", 100 * mean,
                                        wins, n, detail),
                        mean < 0, true});
    } else {
      checks.push_back(
          {"gamma > 0 costs <= 1% on the standard profile (error vs gamma = 0)",
           absl::StrFormat("worst %+.2f%%, mean %+.2f%% (%s)", 100 * worst, 100 * mean, detail),
           worst <= 0.01, true});
    }
  }
  return checks;
}

void PrintTargets(std::FILE* out, const std::vector<TargetCheck>& checks) {
  std::fprintf(out, "\n### Acceptance targets\n\n| target | measured | met |\n|---|---|---|\n");
  for (const TargetCheck& c : checks) {
    std::fprintf(out, "| %s | %s | %s |\n", c.target.c_str(), c.measured.c_str(),
                 c.met ? "yes" : "**no**");
  }
  std::fflush(out);
}

}  // namespace kvcache::eval
