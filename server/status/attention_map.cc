#include "server/status/attention_map.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "server/status/html.h"

namespace kvcache {
namespace {

constexpr int kCell = 14;  // px, a token's square
constexpr int kPitch = 15;
constexpr int kLayerRow = 12;  // px, a layer's row
constexpr int kLayerLabel = 40;
constexpr int kLayerWidth = 960;

const char* PrecisionName(StoredPrecision p) {
  switch (p) {
    case StoredPrecision::kFull:
      return "full";
    case StoredPrecision::kInt8:
      return "int8";
    case StoredPrecision::kInt4:
      return "int4";
    case StoredPrecision::kPruned:
      return "pruned";
    case StoredPrecision::kMixed:
      return "mixed";
  }
  return "full";
}

template <typename T>
T At(const std::vector<T>& v, size_t i, T otherwise = T{}) {
  return i < v.size() ? v[i] : otherwise;
}

// The token's cell, its title and its marks.
void AppendToken(const SequenceInspection& s, size_t i, const AttentionMapOptions& options,
                 std::string* out) {
  const int x = static_cast<int>(i % options.columns) * kPitch;
  const int y = static_cast<int>(i / options.columns) * kPitch;
  const StoredPrecision precision = At(s.precision, i, StoredPrecision::kFull);
  const bool pinned = At<uint8_t>(s.pinned, i) != 0;
  const bool is_protected = At<uint8_t>(s.is_protected, i) != 0;
  const float importance = At(s.importance, i);
  const uint32_t block_tokens = std::max<uint32_t>(1, s.layout.block_tokens);
  std::string title = absl::StrFormat(
      "position %d (block %d)%s: importance %.3f, activity %.3f, novelty %.3f, position factor "
      "%.3f; %s%s%s",
      i, i / block_tokens,
      options.show_tokens && i < s.tokens.size() ? absl::StrCat(", token ", s.tokens[i]) : "",
      importance, At(s.activity, i), At(s.novelty, i), At(s.position, i), PrecisionName(precision),
      is_protected ? "; protected" : "", pinned ? "; pinned" : "");
  const std::string fill =
      precision == StoredPrecision::kPruned ? "#d9d9d9" : ImportanceColour(importance);
  absl::StrAppend(out, "<rect class=\"cell\" data-position=\"", i, "\" x=\"", x, "\" y=\"", y,
                  "\" width=\"", kCell, "\" height=\"", kCell, "\" fill=\"", fill, "\"><title>",
                  HtmlEscape(title), "</title></rect>");
  if (is_protected) {
    absl::StrAppend(out, "<rect class=\"mark-protected\" x=\"", x + 1, "\" y=\"", y + 1,
                    "\" width=\"", kCell - 2, "\" height=\"", kCell - 2,
                    "\" fill=\"none\" stroke=\"#111\" stroke-width=\"1.5\"/>");
  }
  if (pinned) {
    absl::StrAppend(out, "<circle class=\"mark-pinned\" cx=\"", x + 4, "\" cy=\"", y + 4,
                    "\" r=\"2.5\" fill=\"#e6194b\"/>");
  }
  switch (precision) {
    case StoredPrecision::kFull:
      break;
    case StoredPrecision::kPruned:
      absl::StrAppend(out, "<path class=\"mark-pruned\" d=\"M", x + 2, " ", y + 2, " L", x + 12,
                      " ", y + 12, " M", x + 12, " ", y + 2, " L", x + 2, " ", y + 12,
                      "\" stroke=\"#555\" stroke-width=\"1.5\"/>");
      break;
    default: {
      const char* colour = precision == StoredPrecision::kInt8   ? "#f58231"
                           : precision == StoredPrecision::kInt4 ? "#911eb4"
                                                                 : "#9a6324";
      absl::StrAppend(out, "<rect class=\"mark-", PrecisionName(precision), "\" x=\"", x + 8,
                      "\" y=\"", y + 8, "\" width=\"5\" height=\"5\" fill=\"", colour, "\"/>");
    }
  }
}

// One row per layer: the layer's activity (mean over its KV heads) per token,
// or per bin of tokens when more tokens than pixels.
void AppendLayers(const SequenceInspection& s, size_t tokens, std::string* out) {
  const size_t layers = s.layout.num_layers;
  const size_t heads = s.layout.num_kv_heads;
  const size_t n = s.matched_tokens;
  if (layers == 0 || heads == 0 || n == 0 || s.head_activity.size() != layers * heads * n) return;
  const size_t bins = std::min<size_t>(tokens, kLayerWidth);
  const double width = static_cast<double>(kLayerWidth) / static_cast<double>(bins);
  absl::StrAppend(out, "<h3>Attention by layer</h3><svg class=\"layers\" role=\"img\" width=\"",
                  kLayerLabel + kLayerWidth, "\" height=\"", layers * kLayerRow,
                  "\" xmlns=\"http://www.w3.org/2000/svg\">");
  for (size_t l = 0; l < layers; ++l) {
    const double y = static_cast<double>(l * kLayerRow);
    absl::StrAppend(out, "<text x=\"0\" y=\"", y + kLayerRow - 1, "\" font-size=\"10\">L", l,
                    "</text>");
    for (size_t b = 0; b < bins; ++b) {
      const size_t first = b * tokens / bins;
      const size_t last = std::max(first + 1, (b + 1) * tokens / bins);
      double sum = 0;
      for (size_t h = 0; h < heads; ++h) {
        const float* row = &s.head_activity[(l * heads + h) * n];
        for (size_t t = first; t < last; ++t) sum += row[t];
      }
      const float mean = static_cast<float>(sum / static_cast<double>(heads * (last - first)));
      absl::StrAppendFormat(out,
                            "<rect class=\"layer-cell\" x=\"%.2f\" y=\"%.0f\" width=\"%.2f\" "
                            "height=\"%d\" fill=\"%s\"><title>layer %d, positions %d-%d: "
                            "activity %.3f</title></rect>",
                            kLayerLabel + b * width, y, std::max(width, 1.0), kLayerRow - 1,
                            ImportanceColour(mean), l, first, last - 1, mean);
    }
  }
  out->append("</svg>");
}

void AppendLegend(std::string* out) {
  out->append(
      "<svg class=\"legend\" role=\"img\" width=\"760\" height=\"22\" "
      "xmlns=\"http://www.w3.org/2000/svg\">");
  for (int i = 0; i <= 10; ++i) {
    absl::StrAppend(out, "<rect x=\"", i * 14, "\" y=\"4\" width=\"14\" height=\"14\" fill=\"",
                    ImportanceColour(static_cast<float>(i) / 10), "\"/>");
  }
  out->append(
      "<text x=\"160\" y=\"15\" font-size=\"11\">importance 0 &#8594; 1</text>"
      "<rect x=\"270\" y=\"4\" width=\"12\" height=\"12\" fill=\"none\" stroke=\"#111\" "
      "stroke-width=\"1.5\"/><text x=\"286\" y=\"15\" font-size=\"11\">protected</text>"
      "<circle cx=\"354\" cy=\"9\" r=\"2.5\" fill=\"#e6194b\"/>"
      "<text x=\"362\" y=\"15\" font-size=\"11\">pinned</text>"
      "<rect x=\"414\" y=\"8\" width=\"6\" height=\"6\" fill=\"#f58231\"/>"
      "<text x=\"424\" y=\"15\" font-size=\"11\">int8</text>"
      "<rect x=\"460\" y=\"8\" width=\"6\" height=\"6\" fill=\"#911eb4\"/>"
      "<text x=\"470\" y=\"15\" font-size=\"11\">int4</text>"
      "<rect x=\"506\" y=\"8\" width=\"6\" height=\"6\" fill=\"#9a6324\"/>"
      "<text x=\"516\" y=\"15\" font-size=\"11\">mixed</text>"
      "<rect x=\"560\" y=\"4\" width=\"14\" height=\"14\" fill=\"#d9d9d9\"/>"
      "<path d=\"M562 6 L572 16 M572 6 L562 16\" stroke=\"#555\" stroke-width=\"1.5\"/>"
      "<text x=\"580\" y=\"15\" font-size=\"11\">pruned</text></svg>");
}

}  // namespace

std::string ImportanceColour(float score) {
  // Viridis at five stops, interpolated.
  static constexpr int kStops[5][3] = {
      {68, 1, 84}, {59, 82, 139}, {33, 145, 140}, {94, 201, 98}, {253, 231, 37}};
  if (!(score >= 0)) score = 0;  // also NaN
  score = std::min(score, 1.0f);
  const float at = score * 4;
  const int i = std::min(3, static_cast<int>(at));
  const float f = at - static_cast<float>(i);
  int rgb[3];
  for (int c = 0; c < 3; ++c) {
    rgb[c] = static_cast<int>(std::lround(kStops[i][c] + f * (kStops[i + 1][c] - kStops[i][c])));
  }
  return absl::StrFormat("#%02x%02x%02x", rgb[0], rgb[1], rgb[2]);
}

std::string RenderAttentionMap(const SequenceInspection& s, const AttentionMapOptions& options) {
  const size_t tokens = std::min<size_t>(s.matched_tokens, options.max_tokens);
  if (tokens == 0) return "<p class=\"empty\">Nothing of this sequence is cached.</p>";
  AttentionMapOptions o = options;
  o.columns = std::max(1, options.columns);
  const size_t rows = (tokens + o.columns - 1) / o.columns;
  std::string out;
  if (tokens < s.matched_tokens) {
    absl::StrAppend(&out, "<p class=\"note\">The first ", tokens, " of ", s.matched_tokens,
                    " tokens.</p>");
  }
  absl::StrAppend(&out, "<svg class=\"attention-map\" role=\"img\" width=\"",
                  std::min<size_t>(tokens, o.columns) * kPitch, "\" height=\"", rows * kPitch,
                  "\" data-tokens=\"", tokens, "\" xmlns=\"http://www.w3.org/2000/svg\">");
  out.reserve(out.size() + tokens * 260);
  for (size_t i = 0; i < tokens; ++i) AppendToken(s, i, o, &out);
  out.append("</svg>");
  AppendLegend(&out);
  AppendLayers(s, tokens, &out);
  return out;
}

}  // namespace kvcache
