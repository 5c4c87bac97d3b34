// The attention map of a cached sequence (kvcachectl attention): why the
// daemon kept what it kept, drawn from an InspectSequenceResponse.
//
//   AttentionSvg      a self-contained SVG: per-token importance as a heatmap
//                     (rows of tokens), each cell marked when the token is
//                     protected (kept exact) or pinned, a stripe under it for
//                     the precision it is stored at, and, when the response
//                     has per-(layer, KV head) activity, one row per layer of
//                     the attention reports averaged over its heads (else one
//                     row of the averaged reports)
//   AttentionPng      the same map as a PNG, without text
//   ImportantSpans    the most and least important spans of `span_tokens`
//                     consecutive tokens, by mean importance
//
// Pure functions of the response: no I/O.
#ifndef KVCACHE_CLIENT_TOOLS_ATTENTION_MAP_H_
#define KVCACHE_CLIENT_TOOLS_ATTENTION_MAP_H_

#include <cstdint>
#include <string>
#include <vector>

#include "kvcache/v1/admin.pb.h"

namespace kvcache::ctl {

struct AttentionSvgOptions {
  std::string title;             // drawn above the map
  uint32_t tokens_per_row = 64;  // heatmap width, in tokens
  bool label_tokens = false;     // write each token id in a tooltip (<title>)
};

std::string AttentionSvg(const v1::InspectSequenceResponse& r, const AttentionSvgOptions& options);

// The same heatmap as a PNG (no text: a token per 8 px cell, a red frame for
// protected tokens and a red dot for pinned ones, the precision band under
// each cell in the SVG's colours, then the activity rows of the first
// tokens_per_row tokens). For viewers and pipelines without SVG.
std::string AttentionPng(const v1::InspectSequenceResponse& r, const AttentionSvgOptions& options);

struct TokenSpan {
  uint64_t begin = 0;  // positions [begin, end) in the sequence
  uint64_t end = 0;
  double mean_importance = 0;
  double mean_activity = 0;
  uint32_t protected_tokens = 0;
  uint32_t reduced_tokens = 0;  // stored below full precision (or pruned)
};

struct SpanRanking {
  std::vector<TokenSpan> most;   // most important first
  std::vector<TokenSpan> least;  // least important first
};

// REQUIRES: span_tokens > 0. Spans tile the sequence (the last may be shorter).
SpanRanking ImportantSpans(const v1::InspectSequenceResponse& r, uint32_t span_tokens,
                           size_t count);

// Per-layer mean activity over the heads, [layer][token]; empty when the
// response has no per-head activity.
std::vector<std::vector<float>> LayerActivity(const v1::InspectSequenceResponse& r);

}  // namespace kvcache::ctl

#endif  // KVCACHE_CLIENT_TOOLS_ATTENTION_MAP_H_
