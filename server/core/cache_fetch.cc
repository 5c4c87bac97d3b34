// Cache's fetch planning: the blocks of a prefix (or of a lease) matched and
// pinned under the lock, then made readable (lower-tier copies read back,
// promoted where there is room) without it; synchronously (PrepareFetch) or
// with the reads on the fetch-read threads (PrepareFetchAsync).
#include <algorithm>
#include <memory>
#include <utility>

#include "absl/strings/str_cat.h"
#include "server/common/status_macros.h"
#include "server/core/cache.h"

namespace kvcache {

absl::StatusOr<FetchPlan> Cache::PrepareFetch(const ModelKey& model, const FetchQuery& query) {
  absl::StatusOr<MatchedFetch> matched = MatchQuery(model, query);
  if (!matched.ok()) return matched.status();
  return FinishPlan(std::move(matched->plan), matched->index, std::move(matched->blocks));
}

absl::StatusOr<Cache::MatchedFetch> Cache::MatchQuery(const ModelKey& model,
                                                      const FetchQuery& query) {
  return query.lease_id != 0
             ? MatchLeaseFetch(model, query.lease_id, query.accept_lossy, query.max_blocks)
             : MatchFetch(model, query.tokens, query.accept_lossy, query.max_blocks);
}

absl::StatusOr<FetchPlan> Cache::PlanFetch(const ModelKey& model, std::span<const Token> tokens,
                                           bool accept_lossy, size_t max_blocks,
                                           TierManager::ReadFor read_for) {
  absl::StatusOr<MatchedFetch> matched = MatchFetch(model, tokens, accept_lossy, max_blocks);
  if (!matched.ok()) return matched.status();
  return FinishPlan(std::move(matched->plan), matched->index, std::move(matched->blocks), read_for);
}

absl::StatusOr<Cache::MatchedFetch> Cache::MatchFetch(const ModelKey& model,
                                                      std::span<const Token> tokens,
                                                      bool accept_lossy, size_t max_blocks) {
  KVCACHE_RETURN_IF_ERROR(CheckTokenCount(tokens.size()));
  absl::StatusOr<BlockHashes> hashes = HashBlocks(model, tokens);
  if (!hashes.ok()) return hashes.status();
  std::vector<IndexNode*> path;
  {
    // Matching and pinning change nothing but recency: the lock is shared.
    ReaderMutexLock lock(&mu_);
    auto state = FindModelLocked(model);
    if (!state.ok()) return state.status();
    ReaderMutexLock index_lock(&(*state)->index_lock);
    if (MatchSharedLocked(**state, tokens, *hashes, &path)) {
      return PinFetch(**state, path, accept_lossy, max_blocks);
    }
  }
  std::vector<BlockRef> expired;  // released after the lock
  WriteLock lock(this);
  auto state = FindModelLocked(model);
  if (!state.ok()) return state.status();
  MatchLocked(**state, tokens, *hashes, &path, &expired);
  return PinFetch(**state, path, accept_lossy, max_blocks);
}

Cache::MatchedFetch Cache::PinFetch(const ModelState& m, const std::vector<IndexNode*>& path,
                                    bool accept_lossy, size_t max_blocks) {
  MatchedFetch matched;
  matched.blocks.reserve(path.size());
  for (const IndexNode* n : path) matched.blocks.push_back(TakeBlock(*n, PinReason::kFetch));
  matched.plan = MakePlan(m, &matched.blocks, accept_lossy, max_blocks);
  matched.index = &m.index;
  return matched;
}

FetchPlan Cache::MakePlan(const ModelState& m, std::vector<TieredBlock>* blocks, bool accept_lossy,
                          size_t max_blocks) {
  const size_t readable = accept_lossy ? blocks->size() : ExactBlocks(*blocks);
  const uint32_t bt = m.layout.block_tokens;
  FetchPlan plan{.layout = m.layout,
                 .matched_tokens = readable * bt,
                 .withheld_tokens = (blocks->size() - readable) * bt,
                 .lossless_epoch = m.lossless_epoch,
                 .epoch = m.lossless_epoch->load()};
  blocks->resize(readable);
  // Blocks past max_blocks are neither read back nor counted as matched.
  if (max_blocks != 0 && blocks->size() > max_blocks) {
    blocks->resize(max_blocks);
    plan.matched_tokens = max_blocks * bt;
  }
  return plan;
}

bool Cache::NeedsLowerReads(std::span<const TieredBlock> blocks) {
  return std::any_of(blocks.begin(), blocks.end(),
                     [](const TieredBlock& b) { return b.host == nullptr; });
}

FetchPlan Cache::FinishPlan(FetchPlan plan, const PrefixIndex* index,
                            std::vector<TieredBlock> blocks, TierManager::ReadFor read_for) {
  if (NeedsLowerReads(blocks)) {
    const size_t readable = tiers_->ReadBack(index, blocks, read_for);
    if (readable < blocks.size()) {
      blocks.resize(readable);
      plan.matched_tokens = readable * plan.layout.block_tokens;
    }
  }
  plan.blocks.reserve(blocks.size());
  for (TieredBlock& b : blocks) {
    // A lease's blocks are pinned for the lease; the plan's, for the fetch.
    plan.blocks.push_back(b.host.reason() == PinReason::kFetch
                              ? std::move(b.host)
                              : PinnedBlock(b.host.ref(), PinReason::kFetch));
  }
  return plan;
}

absl::StatusOr<Cache::MatchedFetch> Cache::MatchLeaseFetch(const ModelKey& model, uint64_t lease_id,
                                                           bool accept_lossy, size_t max_blocks) {
  MatchedFetch matched;
  WriteLock lock(this);
  auto state = FindModelLocked(model);
  if (!state.ok()) return state.status();
  ExpireLeasesLocked(clock_->Now());
  const Lease* lease = leases_.Find(lease_id);
  // Another namespace's (tenant's) lease reads exactly as no lease.
  if (lease == nullptr || lease->model.ns != model.ns) {
    return absl::NotFoundError(absl::StrCat("lease_id ", lease_id, " is unknown or expired"));
  }
  if (lease->model != model) {
    return absl::InvalidArgumentError(absl::StrCat("lease_id ", lease_id, " belongs to model \"",
                                                   lease->model.model_id, "\", not \"",
                                                   model.model_id, "\""));
  }
  matched.blocks = lease->blocks;
  matched.plan = MakePlan(**state, &matched.blocks, accept_lossy, max_blocks);
  matched.index = lease->index;
  return matched;
}

void Cache::PrepareFetchAsync(const ModelKey& model, const FetchQuery& query, FetchDone done) {
  absl::StatusOr<MatchedFetch> matched = MatchQuery(model, query);
  if (!matched.ok()) return std::move(done)(matched.status());
  if (!NeedsLowerReads(matched->blocks)) {
    return std::move(done)(
        FinishPlan(std::move(matched->plan), matched->index, std::move(matched->blocks)));
  }
  // What the read job and its drop share: whichever runs answers `done`.
  struct Reads {
    MatchedFetch matched;
    FetchDone done;
  };
  auto reads = std::make_shared<Reads>(Reads{*std::move(matched), std::move(done)});
  TierWorkers::Job run = [this, reads] {
    MatchedFetch& m = reads->matched;
    std::move(reads->done)(FinishPlan(std::move(m.plan), m.index, std::move(m.blocks)));
  };
  TierWorkers::Job drop = [reads] {
    std::move(reads->done)(absl::UnavailableError(
        "the daemon is shutting down: the fetch's reads from the lower tier were not done"));
  };
  tiers_->RunRead(std::move(run), std::move(drop));
}

}  // namespace kvcache
