// Cache::BeginAppend and AppendSession: the write path.
//
// Begin (under the lock) validates the request, matches the cached prefix,
// and pins (holds references to) every block that is already cached, so
// capacity eviction cannot take the prefix the append extends. Write (no
// lock) allocates each new block when its first byte arrives, copies and
// hashes. Commit (under the lock) re-checks the path and inserts every new
// block, or none.
#include <xxhash.h>

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "server/core/cache.h"

namespace kvcache {

struct AppendSession::HashState {
  HashState() : state(XXH3_createState()) { XXH3_64bits_reset(state); }
  ~HashState() { XXH3_freeState(state); }
  XXH3_state_t* state;
};

absl::StatusOr<std::unique_ptr<AppendSession>> Cache::BeginAppend(
    const ModelKey& model, std::vector<Token> tokens, uint64_t start_token,
    const AppendHints& hints, std::vector<uint64_t> block_checksums) {
  if (auto s = CheckTokenCount(tokens.size()); !s.ok()) return s;
  if (hints.ttl < absl::ZeroDuration()) {
    return absl::InvalidArgumentError("hints.ttl_seconds must not be negative");
  }
  for (const TokenRange& r : hints.protected_ranges) {
    if (r.begin >= r.end || r.end > tokens.size()) {
      return absl::InvalidArgumentError(absl::StrCat("protected range [", r.begin, ", ", r.end,
                                                     ") is empty or past the end of ", "tokens (",
                                                     tokens.size(), " tokens)"));
    }
  }
  MutexLock lock(&mu_);
  auto state = FindModelLocked(model);
  if (!state.ok()) return state.status();
  ModelState& m = **state;
  const uint32_t bt = m.layout.block_tokens;
  if (start_token % bt != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("start_token ", start_token, " is not a multiple of block_tokens (", bt, ")"));
  }
  if (start_token > tokens.size()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "start_token ", start_token, " is past the end of tokens (", tokens.size(), " tokens)"));
  }
  const uint64_t start_block = start_token / bt;
  const uint64_t num_blocks = (tokens.size() - start_token) / bt;
  if (!block_checksums.empty() && block_checksums.size() != num_blocks) {
    return absl::InvalidArgumentError(absl::StrCat("block_checksums has ", block_checksums.size(),
                                                   " entries; the append carries ", num_blocks,
                                                   " blocks"));
  }
  std::vector<IndexNode*> path;
  MatchLocked(m, tokens, &path);
  if (path.size() < start_block) {
    return absl::FailedPreconditionError(
        absl::StrCat("start_token ", start_token, " is beyond the cached prefix of ",
                     path.size() * bt, " tokens; resend from token ", path.size() * bt));
  }
  std::vector<BlockRef> pinned;
  pinned.reserve(path.size());
  for (IndexNode* n : path) pinned.push_back(n->payload);
  std::vector<bool> cached(num_blocks);
  for (uint64_t i = 0; i < num_blocks; ++i) cached[i] = start_block + i < path.size();
  return std::unique_ptr<AppendSession>(new AppendSession(
      this, model, m.layout, std::move(tokens), start_block, num_blocks, hints,
      std::move(block_checksums), std::move(pinned), std::move(cached),
      // Novelty is computed as blocks arrive only when the model
      // compresses; otherwise compaction computes it if it ever must.
      m.policy.mode == CompressionMode::kOff
          ? std::vector<uint32_t>{}
          : NoveltyLayers(options_.importance.novelty_layers, m.layout.num_layers)));
}

AppendSession::AppendSession(Cache* cache, ModelKey model, ModelLayout layout,
                             std::vector<Token> tokens, uint64_t start_block, uint64_t num_blocks,
                             AppendHints hints, std::vector<uint64_t> checksums,
                             std::vector<BlockRef> pinned, std::vector<bool> cached,
                             std::vector<uint32_t> novelty_layers)
    : cache_(cache),
      model_(std::move(model)),
      layout_(layout),
      tokens_(std::move(tokens)),
      start_block_(start_block),
      num_blocks_(num_blocks),
      hints_(hints),
      checksums_(std::move(checksums)),
      block_bytes_(layout.BlockBytes()),
      expected_bytes_(num_blocks * layout.BlockBytes()),
      pinned_(std::move(pinned)),
      cached_(std::move(cached)),
      new_blocks_(num_blocks),
      novelty_layers_(std::move(novelty_layers)),
      novelty_(num_blocks),
      hash_(std::make_unique<HashState>()) {}

AppendSession::~AppendSession() = default;

absl::Status AppendSession::Fail(absl::Status status) {
  status_ = status;
  new_blocks_.clear();  // frees what was written
  return status;
}

absl::Status AppendSession::Write(std::span<const std::byte> bytes) {
  if (!status_.ok()) return status_;
  if (bytes.size() > expected_bytes_ - received_bytes_) {
    return Fail(absl::InvalidArgumentError(absl::StrCat("kv bytes exceed the expected ",
                                                        expected_bytes_, " (", num_blocks_,
                                                        " blocks of ", block_bytes_, " bytes)")));
  }
  while (!bytes.empty()) {
    const uint64_t block = received_bytes_ / block_bytes_;
    const uint64_t offset = received_bytes_ % block_bytes_;
    const uint64_t n = std::min<uint64_t>(bytes.size(), block_bytes_ - offset);
    if (!cached_[block]) {
      if (offset == 0) {
        absl::StatusOr<BlockRef> payload = cache_->AllocatePayload(block_bytes_);
        if (!payload.ok()) return Fail(payload.status());
        new_blocks_[block] = *std::move(payload);
        XXH3_64bits_reset(hash_->state);
      }
      std::memcpy(new_blocks_[block]->mutable_data().data() + offset, bytes.data(), n);
      XXH3_64bits_update(hash_->state, bytes.data(), n);
      if (offset + n == block_bytes_) {
        const uint64_t checksum = XXH3_64bits_digest(hash_->state);
        if (!checksums_.empty() && checksums_[block] != checksum) {
          return Fail(absl::DataLossError(absl::StrCat(
              "block ", start_block_ + block, " does not match its block_checksums entry (got ",
              checksum, ", expected ", checksums_[block], ")")));
        }
        new_blocks_[block]->Seal(checksum);
        if (!novelty_layers_.empty()) {
          novelty_[block] = BlockKeyNovelty(layout_, new_blocks_[block]->data(), novelty_layers_);
        }
      }
    }
    received_bytes_ += n;
    bytes = bytes.subspan(n);
  }
  return absl::OkStatus();
}

std::vector<uint8_t> AppendSession::PinnedFlags(uint64_t index) const {
  const uint64_t bt = layout_.block_tokens;
  const uint64_t first = index * bt;
  std::vector<uint8_t> flags;
  for (const TokenRange& r : hints_.protected_ranges) {
    const uint64_t begin = std::max(r.begin, first);
    const uint64_t end = std::min(r.end, first + bt);
    if (begin >= end) continue;
    if (flags.empty()) flags.assign(bt, 0);
    for (uint64_t t = begin; t < end; ++t) flags[t - first] = 1;
  }
  return flags;
}

absl::StatusOr<AppendResult> AppendSession::Commit() {
  if (!status_.ok()) return status_;
  if (received_bytes_ != expected_bytes_) {
    return Fail(absl::InvalidArgumentError(
        absl::StrCat("kv carried ", received_bytes_, " bytes; expected ", expected_bytes_, " (",
                     num_blocks_, " blocks of ", block_bytes_, " bytes)")));
  }
  const uint32_t bt = layout_.block_tokens;
  const std::span<const Token> tokens(tokens_);

  AppendResult result;
  std::vector<BlockRef> unused;  // duplicates that lost a race; freed after the lock
  MutexLock lock(&cache_->mu_);
  auto state = cache_->FindModelLocked(model_);
  if (!state.ok()) return Fail(state.status());
  Cache::ModelState& m = **state;
  if (m.layout != layout_) {
    return Fail(absl::AbortedError(
        absl::StrCat("model \"", model_.model_id, "\" was registered anew with another layout (",
                     m.layout.ToString(), ") while the append streamed; retry the append")));
  }

  // First pass: the prefix must still be there, and so must every block we
  // skipped because it was cached (MatchLocked also drops expired blocks).
  std::vector<IndexNode*> path;
  cache_->MatchLocked(m, tokens.first((start_block_ + num_blocks_) * bt), &path);
  const uint64_t present = path.size();
  IndexNode* node = path.empty() ? nullptr : path.back();
  for (uint64_t i = present; i < start_block_ + num_blocks_; ++i) {
    if (i < start_block_ || cached_[i - start_block_]) {
      return Fail(absl::AbortedError(absl::StrCat(
          "block ", i, " of the prefix was evicted while the append streamed; retry the append")));
    }
  }
  // Second pass: insert what is missing.
  const absl::Time expires = hints_.ttl == absl::ZeroDuration()
                                 ? absl::InfiniteFuture()
                                 : cache_->clock_->Now() + hints_.ttl;
  for (uint64_t i = start_block_; i < start_block_ + num_blocks_; ++i) {
    BlockRef& payload = new_blocks_[i - start_block_];
    if (i < present) {
      ++result.deduplicated_blocks;
      if (payload != nullptr) unused.push_back(std::move(payload));
      // A worker's pins apply to the cached copy too.
      std::vector<uint8_t> pins = PinnedFlags(i);
      if (!pins.empty()) {
        std::vector<uint8_t>& have = path[i]->tokens_state.pinned;
        if (have.empty()) have.assign(bt, 0);
        for (uint32_t t = 0; t < bt; ++t) have[t] |= pins[t];
      }
      continue;
    }
    IndexNode* child = m.index.AddChild(node, tokens.subspan(i * bt, bt), payload);
    if (child == nullptr) break;  // a token-hash collision: stop caching here
    child->expires = expires;
    child->priority = hints_.priority;
    child->workload = static_cast<uint8_t>(hints_.workload);
    child->tokens_state.novelty = std::move(novelty_[i - start_block_]);
    child->tokens_state.pinned = PinnedFlags(i);
    cache_->policy_->Insert(child);
    ++result.stored_blocks;
    result.stored_bytes += payload->size();
    node = child;
  }
  // Touch the whole path leaf-first (a parent is never colder than its child).
  const absl::Time now = cache_->clock_->Now();
  for (IndexNode* n = node; n != nullptr; n = n->parent) {
    cache_->policy_->Touch(n);
    n->last_access = now;
  }
  m.bytes += result.stored_bytes;
  m.appended_blocks += result.stored_blocks;
  m.deduplicated_blocks += result.deduplicated_blocks;
  cache_->payload_bytes_ += result.stored_bytes;
  result.cached_tokens = node == nullptr ? 0 : uint64_t{node->depth + 1} * bt;
  new_blocks_.clear();
  status_ = absl::FailedPreconditionError("append already committed");
  return result;
}

}  // namespace kvcache
