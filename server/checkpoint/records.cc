#include "server/checkpoint/records.h"

#include <algorithm>
#include <cstring>

#include "absl/strings/str_cat.h"

namespace kvcache::checkpoint {
namespace {

int64_t ToUnixMs(absl::Time t) {
  if (t == absl::InfiniteFuture() || t == absl::InfinitePast()) return 0;
  return absl::ToUnixMillis(t);
}

absl::Time FromUnixMs(int64_t ms, absl::Time if_zero) {
  return ms == 0 ? if_zero : absl::FromUnixMillis(ms);
}

absl::Status Damaged(absl::string_view what) {
  return absl::DataLossError(absl::StrCat("checkpoint record: ", what));
}

}  // namespace

v1::CheckpointModel EncodeModel(const ModelImage& image, uint64_t blocks) {
  v1::CheckpointModel r;
  r.set_namespace_(image.key.ns);
  r.set_model_id(image.key.model_id);
  r.set_num_layers(image.layout.num_layers);
  r.set_num_kv_heads(image.layout.num_kv_heads);
  r.set_head_dim(image.layout.head_dim);
  r.set_dtype(static_cast<uint32_t>(image.layout.dtype));
  r.set_block_tokens(image.layout.block_tokens);
  const ImportancePolicy& p = image.policy;
  r.set_compression_mode(static_cast<uint32_t>(p.mode));
  r.set_alpha(p.params.alpha);
  r.set_beta(p.params.beta);
  r.set_gamma(p.params.gamma);
  r.set_sink_tokens(p.params.sink_tokens);
  r.set_recent_window(p.params.recent_window);
  r.set_decay_tau(p.params.decay_tau);
  r.set_position_decay(static_cast<uint32_t>(p.params.decay));
  r.set_target_mass(p.target_mass);
  r.set_target_bytes(p.target_bytes);
  r.set_blocks(blocks);
  return r;
}

absl::StatusOr<ModelImage> DecodeModel(const v1::CheckpointModel& r) {
  ModelImage image;
  image.key = {r.namespace_(), r.model_id()};
  if (r.dtype() < 1 || r.dtype() > 3) return Damaged(absl::StrCat("dtype ", r.dtype()));
  image.layout = {.num_layers = r.num_layers(),
                  .num_kv_heads = r.num_kv_heads(),
                  .head_dim = r.head_dim(),
                  .dtype = static_cast<DType>(r.dtype()),
                  .block_tokens = r.block_tokens()};
  if (absl::Status s = image.layout.Validate(); !s.ok()) return Damaged(s.message());
  if (r.compression_mode() > 3) {
    return Damaged(absl::StrCat("compression_mode ", r.compression_mode()));
  }
  ImportancePolicy& p = image.policy;
  p.mode = static_cast<CompressionMode>(r.compression_mode());
  p.params.alpha = r.alpha();
  p.params.beta = r.beta();
  p.params.gamma = r.gamma();
  p.params.sink_tokens = r.sink_tokens();
  p.params.recent_window = r.recent_window();
  p.params.decay_tau = r.decay_tau();
  p.params.decay = static_cast<kernels::PositionDecay>(r.position_decay());
  p.target_mass = r.target_mass();
  if (r.target_bytes() != 0) p.target_bytes = r.target_bytes();
  if (absl::Status s = p.Validate(); !s.ok()) return Damaged(s.message());
  return image;
}

v1::CheckpointBlock EncodeBlock(const BlockImage& b, const std::optional<StoredLocation>& lower) {
  v1::CheckpointBlock r;
  r.set_lookup_hash(b.lookup_hash);
  r.set_parent_lookup_hash(b.parent_lookup_hash);
  r.set_key(b.key);
  r.set_depth(b.depth);
  r.mutable_tokens()->assign(reinterpret_cast<const char*>(b.tokens.data()),
                             b.tokens.size() * sizeof(Token));
  r.set_size(b.seal.size);
  r.set_checksum(b.seal.checksum);
  r.set_raw_checksum(b.seal.raw_checksum);
  r.set_decoded_checksum(b.seal.decoded_checksum);
  r.set_compressed(b.seal.compressed);
  r.set_has_host_copy(b.host != nullptr);
  if (lower.has_value()) {
    v1::CheckpointLowerCopy* l = r.mutable_lower();
    l->set_offset(lower->offset);
    l->set_footprint(lower->footprint);
    l->set_sequence(lower->sequence);
    l->set_epoch(lower->epoch);
  }
  r.set_expires_unix_ms(ToUnixMs(b.expires));
  r.set_last_access_unix_ms(ToUnixMs(b.last_access));
  r.set_priority(b.priority);
  r.set_workload(b.workload);
  r.set_references(b.references);
  r.set_importance(b.importance);
  for (uint32_t age : b.history_age_ms) r.add_history_age_ms(age);
  const BlockTokenState& ts = b.token_state;
  r.mutable_novelty()->Add(ts.novelty.begin(), ts.novelty.end());
  r.mutable_activity()->Add(ts.activity.begin(), ts.activity.end());
  r.set_activity_updated_unix_ms(ToUnixMs(ts.activity_updated));
  r.mutable_pinned()->assign(ts.pinned.begin(), ts.pinned.end());
  r.set_num_int8(ts.num_int8);
  r.set_num_pruned(ts.num_pruned);
  r.set_int8_entries(ts.int8_entries);
  r.set_int4_entries(ts.int4_entries);
  r.set_pruned_entries(ts.pruned_entries);
  r.set_bytes_saved(ts.bytes_saved);
  r.set_token_state_compressed(ts.compressed);
  return r;
}

absl::StatusOr<BlockImage> DecodeBlock(const v1::CheckpointBlock& r, uint32_t block_tokens) {
  if (r.tokens().size() != size_t{block_tokens} * sizeof(Token)) {
    return Damaged(absl::StrCat("a block of ", r.tokens().size(), " token bytes in a model of ",
                                block_tokens, "-token blocks"));
  }
  if (r.size() == 0) return Damaged("a block of 0 bytes");
  if (!r.has_host_copy() && !r.has_lower()) return Damaged("a block with no copy");
  if (r.history_age_ms_size() != 4) return Damaged("history_age_ms must hold 4 values");
  auto per_token = [&](int n) { return n == 0 || n == static_cast<int>(block_tokens); };
  if (!per_token(r.novelty_size()) || !per_token(r.activity_size()) ||
      !per_token(static_cast<int>(r.pinned().size()))) {
    return Damaged("per-token state of the wrong length");
  }
  if (r.num_int8() + uint64_t{r.num_pruned()} > block_tokens) {
    return Damaged("more INT8 and pruned tokens than the block has");
  }
  BlockImage b;
  b.lookup_hash = r.lookup_hash();
  b.parent_lookup_hash = r.parent_lookup_hash();
  b.key = r.key();
  b.depth = r.depth();
  b.tokens.resize(block_tokens);
  std::memcpy(b.tokens.data(), r.tokens().data(), r.tokens().size());
  b.seal = {.size = r.size(),
            .checksum = r.checksum(),
            .raw_checksum = r.raw_checksum(),
            .decoded_checksum = r.decoded_checksum(),
            .compressed = r.compressed()};
  b.expires = FromUnixMs(r.expires_unix_ms(), absl::InfiniteFuture());
  b.last_access = FromUnixMs(r.last_access_unix_ms(), absl::InfinitePast());
  b.priority = r.priority();
  b.workload = static_cast<uint8_t>(std::min<uint32_t>(r.workload(), 255));
  b.references = static_cast<uint16_t>(std::min<uint32_t>(r.references(), UINT16_MAX));
  b.importance = r.importance();
  std::copy(r.history_age_ms().begin(), r.history_age_ms().end(), b.history_age_ms.begin());
  BlockTokenState& ts = b.token_state;
  ts.novelty.assign(r.novelty().begin(), r.novelty().end());
  ts.activity.assign(r.activity().begin(), r.activity().end());
  ts.activity_updated = FromUnixMs(r.activity_updated_unix_ms(), absl::InfinitePast());
  ts.pinned.assign(r.pinned().begin(), r.pinned().end());
  ts.num_int8 = r.num_int8();
  ts.num_pruned = r.num_pruned();
  ts.int8_entries = r.int8_entries();
  ts.int4_entries = r.int4_entries();
  ts.pruned_entries = r.pruned_entries();
  ts.bytes_saved = r.bytes_saved();
  ts.compressed = r.token_state_compressed();
  return b;
}

}  // namespace kvcache::checkpoint
