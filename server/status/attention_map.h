// The attention map of a cached sequence, as inline SVG (server/status): one
// cell per token coloured by its importance score, with marks for what the
// cache decided about the token, and, when the sequence has per-head
// attention reports, one row per layer of that layer's activity.
//
// Cells and marks carry classes so the map can be checked and styled:
//   rect.cell           one per token drawn (the first max_tokens)
//   rect.mark-protected kept exact whatever the score (pinned, sink, recent)
//   circle.mark-pinned  protected by a worker's hints
//   rect.mark-int8, rect.mark-int4, rect.mark-mixed, path.mark-pruned
//                       the precision the token is stored at (none: full)
//   rect.layer-cell     the per-layer rows (one per token, or per bin of
//                       tokens when there are more than fit the width)
// Each cell's <title> gives its position and scores, and its token id only
// with show_tokens.
#ifndef KVCACHE_SERVER_STATUS_ATTENTION_MAP_H_
#define KVCACHE_SERVER_STATUS_ATTENTION_MAP_H_

#include <cstddef>
#include <string>

#include "server/core/cache_inspection.h"

namespace kvcache {

struct AttentionMapOptions {
  bool show_tokens = false;
  size_t max_tokens = 8192;
  int columns = 64;  // tokens per row of the map
};

// The <svg> elements (map, then legend), or a paragraph saying there is
// nothing to draw.
std::string RenderAttentionMap(const SequenceInspection& sequence,
                               const AttentionMapOptions& options);

// The colour of an importance score in [0, 1] ("#rrggbb", dark to bright).
std::string ImportanceColour(float score);

}  // namespace kvcache

#endif  // KVCACHE_SERVER_STATUS_ATTENTION_MAP_H_
