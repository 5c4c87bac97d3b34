#include "attention_map.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "png_writer.h"

namespace kvcache::ctl {
namespace {

constexpr int kCell = 12;   // px per token
constexpr int kStripe = 3;  // px of the precision stripe under a cell
constexpr int kMargin = 16;
constexpr int kLabelWidth = 64;  // the left column's labels

std::string Escape(std::string_view s) {
  std::string out;
  for (char c : s) {
    switch (c) {
      case '&':
        out += "&amp;";
        break;
      case '<':
        out += "&lt;";
        break;
      case '>':
        out += "&gt;";
        break;
      case '"':
        out += "&quot;";
        break;
      default:
        out += c;
    }
  }
  return out;
}

// A perceptually ordered ramp (dark blue -> teal -> yellow) for x in [0, 1], as 0xRRGGBB.
uint32_t RampRgb(double x) {
  x = std::clamp(std::isfinite(x) ? x : 0.0, 0.0, 1.0);
  static constexpr double kStops[][3] = {
      {68, 1, 84}, {59, 82, 139}, {33, 145, 140}, {94, 201, 98}, {253, 231, 37}};
  const double at = x * 4;
  const int i = std::min(3, static_cast<int>(at));
  const double f = at - i;
  uint32_t rgb = 0;
  for (int c = 0; c < 3; ++c) {
    rgb = rgb << 8 |
          static_cast<uint32_t>(std::lround(kStops[i][c] + f * (kStops[i + 1][c] - kStops[i][c])));
  }
  return rgb;
}

std::string Css(uint32_t rgb) { return absl::StrFormat("#%06x", rgb); }
std::string Ramp(double x) { return Css(RampRgb(x)); }

uint32_t PrecisionRgb(v1::StoredPrecision p) {
  switch (p) {
    case v1::STORED_PRECISION_INT8:
      return 0xf4a261;
    case v1::STORED_PRECISION_INT4:
      return 0xe76f51;
    case v1::STORED_PRECISION_PRUNED:
      return 0x6c757d;
    case v1::STORED_PRECISION_MIXED:
      return 0x9b5de5;
    default:
      return 0x2a9d8f;  // full
  }
}
std::string PrecisionColour(v1::StoredPrecision p) { return Css(PrecisionRgb(p)); }

constexpr uint32_t kProtectedRgb = 0xd62828;

const char* PrecisionName(v1::StoredPrecision p) {
  switch (p) {
    case v1::STORED_PRECISION_INT8:
      return "int8";
    case v1::STORED_PRECISION_INT4:
      return "int4";
    case v1::STORED_PRECISION_PRUNED:
      return "pruned";
    case v1::STORED_PRECISION_MIXED:
      return "mixed";
    default:
      return "full";
  }
}

v1::StoredPrecision PrecisionAt(const v1::InspectSequenceResponse& r, int t) {
  return t < r.precision_size() ? r.precision(t) : v1::STORED_PRECISION_FULL;
}

}  // namespace

std::vector<std::vector<float>> LayerActivity(const v1::InspectSequenceResponse& r) {
  const uint64_t n = r.matched_tokens();
  const uint64_t layers = r.layout().num_layers();
  const uint64_t heads = r.layout().num_kv_heads();
  if (n == 0 || r.head_activity().size() != layers * heads * n * sizeof(float)) return {};
  std::vector<float> all(layers * heads * n);
  std::memcpy(all.data(), r.head_activity().data(), r.head_activity().size());
  std::vector<std::vector<float>> out(layers, std::vector<float>(n, 0.0f));
  for (uint64_t l = 0; l < layers; ++l) {
    for (uint64_t h = 0; h < heads; ++h) {
      for (uint64_t t = 0; t < n; ++t) out[l][t] += all[(l * heads + h) * n + t] / heads;
    }
  }
  return out;
}

std::string AttentionSvg(const v1::InspectSequenceResponse& r, const AttentionSvgOptions& options) {
  const int n = static_cast<int>(r.importance_size());
  const int per_row = static_cast<int>(std::max<uint32_t>(options.tokens_per_row, 1));
  const int rows = std::max(1, (n + per_row - 1) / per_row);
  const std::vector<std::vector<float>> layers = LayerActivity(r);
  const int activity_rows = layers.empty() ? 1 : static_cast<int>(layers.size());
  const int row_height = kCell + kStripe + 2;
  const int width =
      std::max(kMargin * 2 + kLabelWidth + per_row * kCell, 760);  // room for the captions
  const int heat_top = kMargin + 44;
  const int activity_top = heat_top + rows * row_height + 40;
  const int legend_top = activity_top + activity_rows * kCell + 24;
  const int height = legend_top + 48;
  float max_importance = 0;
  for (float v : r.importance()) max_importance = std::max(max_importance, v);
  if (max_importance <= 0) max_importance = 1;

  std::string svg = absl::StrFormat(
      "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%d\" height=\"%d\" "
      "viewBox=\"0 0 %d %d\" font-family=\"sans-serif\" font-size=\"11\">\n"
      "<rect width=\"100%%\" height=\"100%%\" fill=\"#ffffff\"/>\n",
      width, height, width, height);
  absl::StrAppend(&svg, "<text x=\"", kMargin, "\" y=\"", kMargin + 12,
                  "\" font-size=\"14\" font-weight=\"bold\">", Escape(options.title), "</text>\n");
  absl::StrAppend(
      &svg, "<text x=\"", kMargin, "\" y=\"", kMargin + 30, "\">",
      absl::StrFormat("%d tokens in %d blocks; importance (max %.3f), protected tokens outlined, "
                      "pinned dotted; the stripe is the stored precision",
                      n, r.blocks_size(), max_importance),
      "</text>\n");

  // The importance heatmap, one cell per token.
  svg += "<g id=\"importance\">\n";
  for (int t = 0; t < n; ++t) {
    const int x = kMargin + kLabelWidth + (t % per_row) * kCell;
    const int y = heat_top + (t / per_row) * row_height;
    if (t % per_row == 0) {
      absl::StrAppend(&svg, "<text x=\"", kMargin, "\" y=\"", y + kCell - 2, "\">", t, "</text>\n");
    }
    const bool is_protected = t < r.is_protected_size() && r.is_protected(t);
    const bool pinned = t < r.pinned_size() && r.pinned(t);
    const v1::StoredPrecision p = PrecisionAt(r, t);
    absl::StrAppend(&svg, "<rect class=\"token\" x=\"", x, "\" y=\"", y, "\" width=\"", kCell - 1,
                    "\" height=\"", kCell - 1, "\" fill=\"", Ramp(r.importance(t) / max_importance),
                    "\"");
    if (is_protected)
      absl::StrAppend(&svg, " stroke=\"", Css(kProtectedRgb), "\" stroke-width=\"1.5\"");
    if (pinned) absl::StrAppend(&svg, " stroke-dasharray=\"2,1\"");
    absl::StrAppend(
        &svg, "><title>",
        absl::StrFormat("position %d: importance %.4f, activity %.4f, %s%s%s", t, r.importance(t),
                        t < r.activity_size() ? r.activity(t) : 0.0f, PrecisionName(p),
                        is_protected ? ", protected" : "", pinned ? ", pinned" : ""));
    if (options.label_tokens && t < r.tokens_size()) {
      absl::StrAppend(&svg, ", token ", r.tokens(t));
    }
    svg += "</title></rect>\n";
    absl::StrAppend(&svg, "<rect class=\"precision\" x=\"", x, "\" y=\"", y + kCell, "\" width=\"",
                    kCell - 1, "\" height=\"", kStripe, "\" fill=\"", PrecisionColour(p), "\"/>\n");
  }
  svg += "</g>\n";

  // The attention reports: per layer (mean over its KV heads), or averaged.
  absl::StrAppend(&svg, "<text x=\"", kMargin, "\" y=\"", activity_top - 8, "\">",
                  layers.empty() ? "attention reports (averaged over layers; decayed to now)"
                                 : "attention reports per layer (mean over KV heads; decayed)",
                  ", first ", std::min(n, per_row * 4), " tokens</text>\n");
  svg += "<g id=\"activity\">\n";
  const int shown = std::min(n, per_row * 4);
  const double cell = static_cast<double>(per_row * kCell) / std::max(shown, 1);
  for (int row = 0; row < activity_rows; ++row) {
    const int y = activity_top + row * kCell;
    if (!layers.empty()) {
      absl::StrAppend(&svg, "<text x=\"", kMargin, "\" y=\"", y + kCell - 3, "\">L", row,
                      "</text>\n");
    }
    for (int t = 0; t < shown; ++t) {
      const float a =
          layers.empty() ? (t < r.activity_size() ? r.activity(t) : 0.0f) : layers[row][t];
      absl::StrAppend(&svg, "<rect x=\"", absl::StrFormat("%.2f", kMargin + kLabelWidth + t * cell),
                      "\" y=\"", y, "\" width=\"",
                      absl::StrFormat("%.2f", std::max(cell - 0.2, 0.5)), "\" height=\"", kCell - 1,
                      "\" fill=\"", Ramp(a), "\"/>\n");
    }
  }
  svg += "</g>\n";

  // Legend.
  svg += "<g id=\"legend\">\n";
  int x = kMargin;
  for (v1::StoredPrecision p :
       {v1::STORED_PRECISION_FULL, v1::STORED_PRECISION_INT8, v1::STORED_PRECISION_INT4,
        v1::STORED_PRECISION_PRUNED, v1::STORED_PRECISION_MIXED}) {
    absl::StrAppend(&svg, "<rect x=\"", x, "\" y=\"", legend_top,
                    "\" width=\"12\" height=\"8\" "
                    "fill=\"",
                    PrecisionColour(p), "\"/><text x=\"", x + 16, "\" y=\"", legend_top + 8, "\">",
                    PrecisionName(p), "</text>\n");
    x += 70;
  }
  for (int i = 0; i <= 10; ++i) {
    absl::StrAppend(&svg, "<rect x=\"", x + i * 10, "\" y=\"", legend_top,
                    "\" width=\"10\" "
                    "height=\"8\" fill=\"",
                    Ramp(i / 10.0), "\"/>\n");
  }
  absl::StrAppend(&svg, "<text x=\"", x + 116, "\" y=\"", legend_top + 8,
                  "\">low .. high</text>\n</g>\n</svg>\n");
  return svg;
}

std::string AttentionPng(const v1::InspectSequenceResponse& r, const AttentionSvgOptions& options) {
  constexpr int kPixel = 8;  // px per token
  constexpr int kBand = 3;   // the precision band under a token
  constexpr int kGap = 12;   // between the heatmap and the activity rows
  const int n = r.importance_size();
  const int per_row = static_cast<int>(std::max<uint32_t>(options.tokens_per_row, 1));
  const int rows = std::max(1, (n + per_row - 1) / per_row);
  const std::vector<std::vector<float>> layers = LayerActivity(r);
  const int activity_rows = layers.empty() ? 1 : static_cast<int>(layers.size());
  const int shown = std::min(n, per_row);  // activity of the first row's tokens
  const int row_height = kPixel + kBand + 1;
  RgbImage image(static_cast<uint32_t>(per_row * kPixel + 2),
                 static_cast<uint32_t>(rows * row_height + kGap + activity_rows * kPixel + 2));
  float max_importance = 0;
  for (float v : r.importance()) max_importance = std::max(max_importance, v);
  if (max_importance <= 0) max_importance = 1;
  for (int t = 0; t < n; ++t) {
    const int x = 1 + (t % per_row) * kPixel;
    const int y = 1 + (t / per_row) * row_height;
    const bool is_protected = t < r.is_protected_size() && r.is_protected(t);
    const bool pinned = t < r.pinned_size() && r.pinned(t);
    if (is_protected) image.Fill(x, y, kPixel - 1, kPixel - 1, kProtectedRgb);
    const int inset = is_protected ? 1 : 0;
    image.Fill(x + inset, y + inset, kPixel - 1 - 2 * inset, kPixel - 1 - 2 * inset,
               RampRgb(r.importance(t) / max_importance));
    if (pinned) image.Fill(x + kPixel / 2 - 1, y + kPixel / 2 - 1, 2, 2, kProtectedRgb);
    image.Fill(x, y + kPixel, kPixel - 1, kBand - 1, PrecisionRgb(PrecisionAt(r, t)));
  }
  const int top = 1 + rows * row_height + kGap;
  for (int row = 0; row < activity_rows; ++row) {
    for (int t = 0; t < shown; ++t) {
      const float a =
          layers.empty() ? (t < r.activity_size() ? r.activity(t) : 0.0f) : layers[row][t];
      image.Fill(1 + t * kPixel, top + row * kPixel, kPixel - 1, kPixel - 1, RampRgb(a));
    }
  }
  return EncodePng(image);
}

SpanRanking ImportantSpans(const v1::InspectSequenceResponse& r, uint32_t span_tokens,
                           size_t count) {
  std::vector<TokenSpan> spans;
  const uint64_t n = r.importance_size();
  for (uint64_t begin = 0; begin < n; begin += span_tokens) {
    TokenSpan s{.begin = begin, .end = std::min<uint64_t>(n, begin + span_tokens)};
    for (uint64_t t = s.begin; t < s.end; ++t) {
      s.mean_importance += r.importance(static_cast<int>(t));
      if (static_cast<int>(t) < r.activity_size())
        s.mean_activity += r.activity(static_cast<int>(t));
      if (static_cast<int>(t) < r.is_protected_size() && r.is_protected(static_cast<int>(t))) {
        ++s.protected_tokens;
      }
      if (PrecisionAt(r, static_cast<int>(t)) != v1::STORED_PRECISION_FULL) ++s.reduced_tokens;
    }
    s.mean_importance /= static_cast<double>(s.end - s.begin);
    s.mean_activity /= static_cast<double>(s.end - s.begin);
    spans.push_back(s);
  }
  SpanRanking out;
  out.most = spans;
  std::stable_sort(out.most.begin(), out.most.end(), [](const TokenSpan& a, const TokenSpan& b) {
    return a.mean_importance > b.mean_importance;
  });
  out.least.assign(out.most.rbegin(), out.most.rend());
  if (out.most.size() > count) out.most.resize(count);
  if (out.least.size() > count) out.least.resize(count);
  return out;
}

}  // namespace kvcache::ctl
