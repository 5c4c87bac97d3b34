#include "tests/eval/svg_plot.h"

#include <algorithm>
#include <cmath>
#include <fstream>
#include <map>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace kvcache::eval {
namespace {

constexpr const char* kColors[] = {"#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b",
                                   "#e377c2", "#7f7f7f", "#bcbd22", "#17becf", "#000000", "#aec7e8",
                                   "#98df8a", "#ff9896", "#c5b0d5", "#c49c94"};

std::string Escape(const std::string& s) {
  std::string out;
  for (char c : s) {
    if (c == '<') {
      out += "&lt;";
    } else if (c == '>') {
      out += "&gt;";
    } else if (c == '&') {
      out += "&amp;";
    } else {
      out.push_back(c);
    }
  }
  return out;
}

struct Panel {
  double x0, y0, w, h;  // pixel box of the plotting area
  double ymin, ymax;    // data range (log10 when log)
  bool log = false;
  double X(double v) const { return x0 + w * std::clamp(v / 1.05, 0.0, 1.0); }
  double Y(double v) const {
    double t = log ? (std::log10(std::max(v, std::pow(10.0, ymin))) - ymin) / (ymax - ymin)
                   : (v - ymin) / (ymax - ymin);
    return y0 + h * (1 - std::clamp(t, 0.0, 1.0));
  }
};

void Axes(std::string* svg, const Panel& p, const std::string& ylabel) {
  absl::StrAppend(svg,
                  absl::StrFormat("<rect x='%.1f' y='%.1f' width='%.1f' height='%.1f' fill='none' "
                                  "stroke='#333'/>\n",
                                  p.x0, p.y0, p.w, p.h));
  for (double x = 0; x <= 1.0001; x += 0.25) {
    const double px = p.X(x);
    absl::StrAppend(svg, absl::StrFormat("<line x1='%.1f' y1='%.1f' x2='%.1f' y2='%.1f' "
                                         "stroke='#ddd'/>\n",
                                         px, p.y0, px, p.y0 + p.h));
    absl::StrAppend(svg, absl::StrFormat("<text x='%.1f' y='%.1f' text-anchor='middle'>%.2f"
                                         "</text>\n",
                                         px, p.y0 + p.h + 16, x));
  }
  if (p.log) {
    for (int e = static_cast<int>(p.ymin); e <= static_cast<int>(p.ymax); ++e) {
      const double py = p.Y(std::pow(10.0, e));
      absl::StrAppend(svg, absl::StrFormat("<line x1='%.1f' y1='%.1f' x2='%.1f' y2='%.1f' "
                                           "stroke='#ddd'/>\n",
                                           p.x0, py, p.x0 + p.w, py));
      absl::StrAppend(
          svg, absl::StrFormat("<text x='%.1f' y='%.1f' text-anchor='end'>%g%%</text>\n", p.x0 - 5,
                               py + 4, 100 * std::pow(10.0, e)));
    }
  } else {
    const double step = p.ymax - p.ymin > 0.5 ? 0.2 : 0.1;
    const int ticks = static_cast<int>(std::lround((p.ymax - p.ymin) / step));
    for (int i = 0; i <= ticks; ++i) {
      const double v = p.ymin + step * i;
      const double py = p.Y(v);
      absl::StrAppend(svg, absl::StrFormat("<line x1='%.1f' y1='%.1f' x2='%.1f' y2='%.1f' "
                                           "stroke='#ddd'/>\n",
                                           p.x0, py, p.x0 + p.w, py));
      absl::StrAppend(
          svg, absl::StrFormat("<text x='%.1f' y='%.1f' text-anchor='end'>%.2f</text>\n", p.x0 - 5,
                               py + 4, v));
    }
  }
  absl::StrAppend(svg, absl::StrFormat("<text x='%.1f' y='%.1f' text-anchor='middle'>bytes "
                                       "(fraction of FP16)</text>\n",
                                       p.x0 + p.w / 2, p.y0 + p.h + 34));
  absl::StrAppend(svg, absl::StrFormat("<text x='%.1f' y='%.1f' text-anchor='middle' "
                                       "font-weight='bold'>%s</text>\n",
                                       p.x0 + p.w / 2, p.y0 - 8, Escape(ylabel)));
}

}  // namespace

std::string RenderSvg(const std::vector<ResultRow>& rows, const std::string& title) {
  // Policies in first-seen order, each with its budget points sorted by bytes.
  std::vector<std::string> order;
  std::map<std::string, std::vector<const ResultRow*>> by_policy;
  for (const ResultRow& r : rows) {
    if (!by_policy.count(r.policy)) order.push_back(r.policy);
    by_policy[r.policy].push_back(&r);
  }
  double emin = 1, emax = 1e-6, mmin = 1;
  for (const ResultRow& r : rows) {
    if (r.m.output_error > 0) emin = std::min(emin, r.m.output_error);
    emax = std::max(emax, r.m.output_error);
    mmin = std::min(mmin, r.m.mass_no_sink);
  }
  const double lo = std::floor(std::log10(std::max(emin, 1e-6)));
  const double hi = std::max(lo + 1, std::ceil(std::log10(std::max(emax, 1e-6))));
  // Mass axis from a multiple of its tick step (0.2 for a range over 0.5) to 1.
  double mass_lo = std::max(0.0, std::floor(mmin * 10) / 10);
  if (1.0 - mass_lo > 0.5) mass_lo = std::floor(mass_lo * 5) / 5;
  const int width = 1100;
  const int legend_rows = static_cast<int>((order.size() + 3) / 4);
  const int height = 470 + 20 * legend_rows;
  Panel err{70, 60, 430, 330, lo, hi, true};
  Panel mass{620, 60, 430, 330, mass_lo, 1.0, false};
  std::string svg = absl::StrFormat(
      "<svg xmlns='http://www.w3.org/2000/svg' width='%d' height='%d' viewBox='0 0 %d %d' "
      "font-family='sans-serif' font-size='12'>\n<rect width='100%%' height='100%%' "
      "fill='white'/>\n<text x='%d' y='24' text-anchor='middle' font-size='15' "
      "font-weight='bold'>%s</text>\n",
      width, height, width, height, width / 2, Escape(title));
  Axes(&svg, err, "attention-output relative error (log)");
  Axes(&svg, mass, "retained attention mass without the sink token");
  for (size_t i = 0; i < order.size(); ++i) {
    const char* color = kColors[i % (sizeof(kColors) / sizeof(kColors[0]))];
    std::vector<const ResultRow*> pts = by_policy[order[i]];
    std::sort(pts.begin(), pts.end(), [](const ResultRow* a, const ResultRow* b) {
      return a->m.bytes_fraction < b->m.bytes_fraction;
    });
    const bool single = pts.size() == 1 || pts[0]->budget < 0;
    const std::string dash = order[i].find("-a0") != std::string::npos ||
                                     order[i].find("-b0") != std::string::npos ||
                                     order[i].find("-g0") != std::string::npos
                                 ? " stroke-dasharray='5,3'"
                                 : "";
    for (const Panel* p : {&err, &mass}) {
      auto value = [&](const ResultRow* r) {
        return p == &err ? r->m.output_error : r->m.mass_no_sink;
      };
      if (!single) {
        std::string path;
        for (const ResultRow* r : pts) {
          absl::StrAppend(&path, path.empty() ? "M" : " L",
                          absl::StrFormat("%.1f,%.1f", p->X(r->m.bytes_fraction), p->Y(value(r))));
        }
        absl::StrAppend(&svg, absl::StrFormat("<path d='%s' fill='none' stroke='%s' "
                                              "stroke-width='1.8'%s/>\n",
                                              path, color, dash));
      }
      for (const ResultRow* r : pts) {
        absl::StrAppend(
            &svg, absl::StrFormat("<circle cx='%.1f' cy='%.1f' r='%s' fill='%s' stroke='%s' "
                                  "stroke-width='1.5'/>\n",
                                  p->X(r->m.bytes_fraction), p->Y(value(r)), single ? "5" : "3",
                                  single ? "white" : color, color));
      }
    }
    const double lx = 70 + 260.0 * (i % 4);
    const double ly = 450 + 20.0 * (i / 4);
    if (single) {
      absl::StrAppend(&svg, absl::StrFormat("<circle cx='%.1f' cy='%.1f' r='5' fill='white' "
                                            "stroke='%s' stroke-width='1.5'/>\n",
                                            lx + 12, ly - 4, color));
    } else {
      absl::StrAppend(&svg, absl::StrFormat("<line x1='%.1f' y1='%.1f' x2='%.1f' y2='%.1f' "
                                            "stroke='%s' stroke-width='2'%s/>\n",
                                            lx, ly - 4, lx + 24, ly - 4, color, dash));
    }
    absl::StrAppend(&svg, absl::StrFormat("<text x='%.1f' y='%.1f'>%s</text>\n", lx + 30, ly,
                                          Escape(order[i])));
  }
  svg += "</svg>\n";
  return svg;
}

absl::Status WriteSvg(const std::string& path, const std::vector<ResultRow>& rows,
                      const std::string& title) {
  std::ofstream f(path, std::ios::trunc);
  if (!f) return absl::NotFoundError(absl::StrCat("cannot create ", path));
  f << RenderSvg(rows, title);
  f.close();
  if (!f) return absl::DataLossError(absl::StrCat("error writing ", path));
  return absl::OkStatus();
}

}  // namespace kvcache::eval
