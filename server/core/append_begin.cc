// Cache::BeginAppend: the first step of the write path (append_session.cc
// has the rest and says what each step does under which lock). It
// validates the request, merges its protected ranges, hashes the blocks
// without a lock, then matches the cached prefix, pins it and claims the
// new blocks (OpenAppendLocked), with the cache's lock and the model's
// index_lock shared, or exclusively when a block on the path has expired.
#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "server/common/status_macros.h"
#include "server/core/cache.h"

namespace kvcache {
namespace {

// Sorted, disjoint ranges covering the same tokens.
std::vector<TokenRange> MergeRanges(std::vector<TokenRange> ranges) {
  std::sort(ranges.begin(), ranges.end(),
            [](const TokenRange& a, const TokenRange& b) { return a.begin < b.begin; });
  std::vector<TokenRange> merged;
  for (const TokenRange& r : ranges) {
    if (!merged.empty() && r.begin <= merged.back().end) {
      merged.back().end = std::max(merged.back().end, r.end);
    } else {
      merged.push_back(r);
    }
  }
  return merged;
}

// True when one of the sorted, disjoint `ranges` overlaps [begin, end).
bool Overlaps(const std::vector<TokenRange>& ranges, uint64_t begin, uint64_t end) {
  auto it = std::upper_bound(ranges.begin(), ranges.end(), begin,
                             [](uint64_t t, const TokenRange& r) { return t < r.end; });
  return it != ranges.end() && it->begin < end;
}

}  // namespace

absl::StatusOr<std::unique_ptr<AppendSession>> Cache::BeginAppend(
    const ModelKey& model, std::vector<Token> tokens, uint64_t start_token,
    const AppendHints& request_hints, std::vector<uint64_t> block_checksums) {
  KVCACHE_RETURN_IF_ERROR(CheckTokenCount(tokens.size()));
  if (request_hints.ttl < absl::ZeroDuration()) {
    return absl::InvalidArgumentError("hints.ttl_seconds must not be negative");
  }
  if (request_hints.protected_ranges.size() > options_.max_protected_ranges) {
    return absl::InvalidArgumentError(absl::StrCat(
        "hints.protected_ranges has ", request_hints.protected_ranges.size(),
        " ranges; the limit (max_protected_ranges) is ", options_.max_protected_ranges));
  }
  for (const TokenRange& r : request_hints.protected_ranges) {
    if (r.begin >= r.end || r.end > tokens.size()) {
      return absl::InvalidArgumentError(absl::StrCat("protected range [", r.begin, ", ", r.end,
                                                     ") is empty or past the end of ", "tokens (",
                                                     tokens.size(), " tokens)"));
    }
  }
  AppendHints hints = request_hints;
  hints.protected_ranges = MergeRanges(std::move(hints.protected_ranges));

  // Chain keys and lookup hashes of every whole block, before taking the lock.
  ModelLayout layout;
  std::shared_ptr<const BlockHasher> hasher;
  {
    ReaderMutexLock lock(&mu_);
    auto state = FindModelLocked(model);
    if (!state.ok()) return state.status();
    layout = (*state)->layout;
    hasher = (*state)->index.hasher();
  }
  const uint32_t bt = layout.block_tokens;
  std::vector<uint64_t> chain(tokens.size() / bt);
  for (size_t b = 0; b < chain.size(); ++b) {
    chain[b] = hasher->ChainKey(b == 0 ? 0 : chain[b - 1],
                                std::span<const Token>(tokens).subspan(b * bt, bt));
  }
  BlockHashes hashes = BlockHashes::Of(std::move(hasher), bt, tokens);

  if (start_token % bt != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("start_token ", start_token, " is not a multiple of block_tokens (", bt, ")"));
  }
  if (start_token > tokens.size()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "start_token ", start_token, " is past the end of tokens (", tokens.size(), " tokens)"));
  }
  const uint64_t num_blocks = (tokens.size() - start_token) / bt;
  if (!block_checksums.empty() && block_checksums.size() != num_blocks) {
    return absl::InvalidArgumentError(absl::StrCat("block_checksums has ", block_checksums.size(),
                                                   " entries; the append carries ", num_blocks,
                                                   " blocks"));
  }
  if (block_checksums.empty() && num_blocks > 0 && options_.require_block_checksums) {
    return absl::InvalidArgumentError(
        absl::StrCat("block_checksums is empty; the append carries ", num_blocks,
                     " blocks and this daemon requires the XXH3-64 checksum of each "
                     "(security.require_block_checksums)"));
  }
  AppendRequest request{.model = model,
                        .tokens = std::move(tokens),
                        .start_block = start_token / bt,
                        .hints = std::move(hints),
                        .block_checksums = std::move(block_checksums),
                        .chain = std::move(chain),
                        .hashes = std::move(hashes)};
  // Matching and claiming only read the index: shared, unless a block on
  // the path has expired (only a writer removes it) or the path is longer
  // than a touch stripe; then again under the exclusive lock.
  {
    ReaderMutexLock lock(&mu_);
    auto state = FindModelLocked(model);
    if (!state.ok()) return state.status();
    if ((*state)->layout != layout) return absl::AbortedError("the model was re-registered; retry");
    // Shared: no commit adds to the index between finding a block absent
    // and claiming it.
    ReaderMutexLock index_lock(&(*state)->index_lock);
    std::vector<IndexNode*> path;
    if (MatchSharedLocked(**state, request.tokens, request.hashes, &path)) {
      return OpenAppendLocked(**state, std::move(request), path);
    }
  }
  std::vector<BlockRef> expired;  // released after the lock
  WriteLock lock(this);
  auto state = FindModelLocked(model);
  if (!state.ok()) return state.status();
  if ((*state)->layout != layout) return absl::AbortedError("the model was re-registered; retry");
  std::vector<IndexNode*> path;
  MatchLocked(**state, request.tokens, request.hashes, &path, &expired);
  return OpenAppendLocked(**state, std::move(request), path);
}

absl::StatusOr<std::unique_ptr<AppendSession>> Cache::OpenAppendLocked(
    const ModelState& m, AppendRequest request, const std::vector<IndexNode*>& path) {
  const uint32_t bt = m.layout.block_tokens;
  const uint64_t start_block = request.start_block;
  const uint64_t num_blocks = request.tokens.size() / bt - start_block;
  if (path.size() < start_block) {
    return absl::FailedPreconditionError(
        absl::StrCat("start_token ", start_block * bt, " is beyond the cached prefix of ",
                     path.size() * bt, " tokens; resend from token ", path.size() * bt));
  }
  // A protected token must be exact; one stored lossy can only be made exact
  // again by its bytes, so the append must carry them.
  for (uint64_t i = 0; i < start_block; ++i) {
    if (path[i]->seal().compressed &&
        Overlaps(request.hints.protected_ranges, i * uint64_t{bt}, (i + 1) * uint64_t{bt})) {
      return absl::FailedPreconditionError(absl::StrCat(
          "block ", i, " holds protected tokens but is stored lossy; resend its KV (start_token ",
          i * uint64_t{bt}, " or less) so it can be stored exactly"));
    }
  }
  std::vector<TieredBlock> pinned;
  pinned.reserve(path.size());
  for (IndexNode* n : path) pinned.push_back(TakeBlock(*n, PinReason::kAppend));
  using Plan = AppendSession::BlockPlan;
  std::vector<Plan> plan(num_blocks);
  std::vector<uint64_t> keys(num_blocks);
  std::vector<bool> wanted(num_blocks, false);
  for (uint64_t j = 0; j < num_blocks; ++j) {
    const uint64_t i = start_block + j;
    keys[j] = request.chain[i];
    if (i < path.size()) {
      plan[j] = path[i]->seal().compressed ? Plan::kRestore : Plan::kCached;
    } else {
      plan[j] = Plan::kStore;  // unless another append claimed it (below)
      wanted[j] = true;
    }
  }
  auto session = std::unique_ptr<AppendSession>(new AppendSession(
      this, request.model, m.layout, std::move(request.tokens), start_block,
      std::move(request.hints), std::move(request.block_checksums), std::move(keys),
      std::move(request.hashes), std::move(pinned), std::move(plan),
      // Novelty is computed as blocks arrive only when the model
      // compresses; otherwise compaction computes it if it ever must.
      m.policy.mode == CompressionMode::kOff
          ? std::vector<uint32_t>{}
          : NoveltyLayers(options_.importance.novelty_layers, m.layout.num_layers)));
  session->incarnation_ = m.incarnation;
  if (path.size() < start_block + num_blocks) {
    session->claimed_ = claims_.Claim(m.incarnation, session->keys_, wanted, session.get());
    for (uint64_t j = 0; j < num_blocks; ++j) {
      if (wanted[j] && !session->claimed_[j]) session->plan_[j] = Plan::kPending;
    }
  }
  return session;
}

}  // namespace kvcache
