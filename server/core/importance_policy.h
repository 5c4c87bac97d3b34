// ImportancePolicy and ImportanceOptions: how the cache scores tokens and
// which precision it keeps them at (docs/importance.md).
//
// Each model has a policy: a compression mode, the score's weights and
// position model, and the share of importance mass the dynamic threshold
// keeps. Modes:
//   off       lossless; nothing is ever quantized or dropped
//   quantize  cold blocks' unprotected tokens are stored as INT8
//   prune     as quantize, and tokens below the block's dynamic threshold
//             (the smallest set covering target_mass of the block's
//             importance) are dropped
//   budget    one precision per (layer, KV head, token) entry (compressed
//             format version 2) so that a cold block takes at most
//             target_bytes of its raw bytes: quantize first (INT8, then INT4
//             for the least important entries, pruning only when all-INT4
//             does not fit; budget left over promotes the most important to
//             full): importance::AllocateBudget
// Protected tokens (attention sinks, ranges a worker pinned at append, and in
// the modes other than budget the recent window of the sequence) always stay
// at full precision; in budget mode the recent window ranks above every other
// entry instead (the last demoted, the first promoted).
//
// ImportanceOptions are the cache-wide settings: the default policy for new
// models, how activity decays, when a block counts as cold, the memory
// pressure that makes the cache compress the coldest blocks early, and
// calibration's bounds.
#ifndef KVCACHE_SERVER_CORE_IMPORTANCE_POLICY_H_
#define KVCACHE_SERVER_CORE_IMPORTANCE_POLICY_H_

#include <cstdint>
#include <map>
#include <optional>
#include <span>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "kvcache/kernels/importance.h"
#include "kvcache/kernels/types.h"
#include "server/core/layout.h"
#include "server/importance/block_codec.h"
#include "server/importance/calibration.h"

namespace kvcache {

enum class CompressionMode : uint8_t { kOff = 0, kQuantize = 1, kPrune = 2, kBudget = 3 };

// "off", "quantize", "prune", "budget".
std::string_view CompressionModeName(CompressionMode mode);
// The mode named `name` (as above); nullopt for anything else.
std::optional<CompressionMode> ParseCompressionMode(std::string_view name);

struct ImportancePolicy {
  CompressionMode mode = CompressionMode::kOff;
  kernels::ImportanceParams params;  // alpha, beta, gamma, sinks, recent window, decay
  double target_mass = 0.95;         // in (0, 1]
  // Budget mode: the share of a raw block's bytes its compressed copy may take, in (0, 1].
  double target_bytes = 0.37;

  // INVALID_ARGUMENT naming the field when a weight is not finite or outside
  // [0, 1], the other params are invalid, the weights are all zero or
  // target_mass or target_bytes is outside (0, 1].
  absl::Status Validate() const;
};

struct ImportanceOptions {
  ImportancePolicy default_policy;
  // Activity fades by half every half-life without reports; each report
  // moves it toward the observed attention by `activity_weight`.
  double activity_half_life_seconds = 600;
  float activity_weight = 0.5f;
  // A block not used for this long is compressed (in quantize/prune mode).
  absl::Duration cold_after = absl::Minutes(5);
  // Above this share of the host tier's capacity the coldest blocks are
  // compressed without waiting for cold_after.
  double pressure_watermark = 0.85;
  // Most blocks one compaction pass compresses.
  uint32_t max_blocks_per_pass = 256;
  // Layers whose keys novelty is computed from; empty: up to 4 evenly spaced.
  std::vector<uint32_t> novelty_layers;
  // Calibration: samples kept per model, least samples to refit, largest
  // change of one weight per refit.
  uint32_t calibration_samples = 8192;
  uint32_t calibration_min_samples = 256;
  float calibration_max_step = 0.05f;
  // Weights a model starts with instead of the default policy's (what an
  // earlier run's calibration learned), applied when it registers.
  std::map<ModelKey, importance::Weights> initial_weights;
};

// The kernels' name for a layout's dtype, and a layout as a codec block shape.
kernels::DType ToKernelDType(DType dtype);
importance::BlockShape ToBlockShape(const ModelLayout& layout);

// Key novelty (kernels::KeyNoveltyCpu) of each token of the raw block `raw`,
// averaged over `layers`; empty when `layers` is empty or the block is not
// raw-sized.
std::vector<float> BlockKeyNovelty(const ModelLayout& layout, std::span<const std::byte> raw,
                                   const std::vector<uint32_t>& layers);

// The layers novelty reads for a model of `num_layers` layers: the
// configured ones that exist, or up to 4 evenly spaced ones.
std::vector<uint32_t> NoveltyLayers(const std::vector<uint32_t>& configured, uint32_t num_layers);

}  // namespace kvcache

#endif  // KVCACHE_SERVER_CORE_IMPORTANCE_POLICY_H_
