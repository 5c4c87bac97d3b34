// AppendSession: the write path after Cache::BeginAppend (append_begin.cc).
//
// Begin validates the request, merges its protected ranges and hashes the
// blocks (no lock), then, holding the cache's lock and the model's
// index_lock shared, matches the cached prefix, pins (holds references to)
// every block already cached, so capacity eviction cannot take the prefix
// the append extends, and claims (claim_table.h) the new blocks no other
// append in flight is storing: blocks are added to the index only under
// the index_lock held exclusively (or the cache's lock), so none appears
// between finding it absent and claiming it. Write (no lock) allocates
// each block it stores when its first byte arrives, copies, and hashes
// every block. Commit re-checks the path and compares the blocks that were
// cached with what arrived. One that stores nothing does so with both
// locks shared; one that only adds blocks (no pins to record, no lossy
// block to make exact) with the cache's lock shared and the index_lock
// exclusively: its path's touches, recorded or applied as a hit's, insert
// its new blocks into the policy (Cache::TouchLocked), and it evicts for
// the budgets afterwards, exclusively, only when they are passed
// (Cache::EnforceBudgets). Otherwise, holding the
// cache's lock exclusively, it also records pins, restores lossy blocks
// that match, inserts the new blocks, and evicts to keep the pool's
// append staging free. A shared section that meets an expired block on the
// path (only a writer removes it) is done again exclusively.
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

AppendSession::AppendSession(Cache* cache, ModelKey model, ModelLayout layout,
                             std::vector<Token> tokens, uint64_t start_block, AppendHints hints,
                             std::vector<uint64_t> checksums, std::vector<uint64_t> keys,
                             BlockHashes hashes, std::vector<TieredBlock> pinned,
                             std::vector<BlockPlan> plan, std::vector<uint32_t> novelty_layers)
    : cache_(cache),
      model_(std::move(model)),
      layout_(layout),
      tokens_(std::move(tokens)),
      start_block_(start_block),
      num_blocks_(plan.size()),
      hints_(std::move(hints)),
      checksums_(std::move(checksums)),
      block_bytes_(layout.BlockBytes()),
      expected_bytes_(plan.size() * layout.BlockBytes()),
      keys_(std::move(keys)),
      hashes_(std::move(hashes)),
      pinned_(std::move(pinned)),
      plan_(std::move(plan)),
      staging_(num_blocks_),
      new_blocks_(num_blocks_),
      digests_(num_blocks_),
      novelty_layers_(std::move(novelty_layers)),
      novelty_(num_blocks_),
      hash_(std::make_unique<HashState>()) {}

AppendSession::~AppendSession() {
  ReleaseClaimsAndStaging();
  staging_.clear();
  new_blocks_.clear();
}

void AppendSession::ReleaseClaimsAndStaging() {
  if (!claimed_.empty()) {
    cache_->claims_.Release(incarnation_, keys_, claimed_, this);
    claimed_.clear();
  }
  cache_->staged_bytes_.fetch_sub(staged_bytes_, std::memory_order_relaxed);
  staged_bytes_ = 0;
}

absl::Status AppendSession::Fail(absl::Status status) {
  status_ = status;
  ReleaseClaimsAndStaging();
  staging_.clear();  // frees what was written
  new_blocks_.clear();
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
    const bool store = plan_[block] == BlockPlan::kStore || plan_[block] == BlockPlan::kRestore;
    if (offset == 0) {
      XXH3_64bits_reset(hash_->state);
      if (store) {
        if (absl::Status s = cache_->MakeRoomInNamespace(model_.ns, staged_bytes_ + block_bytes_);
            !s.ok()) {
          return Fail(s);
        }
        absl::StatusOr<StagingBlock> staged = cache_->AllocatePayload(block_bytes_);
        if (!staged.ok()) return Fail(staged.status());
        staged_bytes_ += staged->footprint();
        staging_[block] = *std::move(staged);
      }
    }
    if (store) {
      // Hash the copy, not the source: a source another process can write
      // (a worker's shared-memory region) could change between the two reads.
      std::byte* copy = staging_[block].data().data() + offset;
      std::memcpy(copy, bytes.data(), n);
      XXH3_64bits_update(hash_->state, copy, n);
    } else {
      XXH3_64bits_update(hash_->state, bytes.data(), n);
    }
    if (offset + n == block_bytes_) {
      const uint64_t checksum = XXH3_64bits_digest(hash_->state);
      if (!checksums_.empty() && checksums_[block] != checksum) {
        return Fail(absl::DataLossError(absl::StrCat(
            "block ", start_block_ + block, " does not match its block_checksums entry (got ",
            checksum, ", expected ", checksums_[block], ")")));
      }
      digests_[block] = checksum;
      if (store) {
        new_blocks_[block] =
            std::move(staging_[block]).Seal(keys_[block], BlockSeal::Raw(block_bytes_, checksum));
        if (!novelty_layers_.empty() && plan_[block] == BlockPlan::kStore) {
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
  const std::vector<TokenRange>& ranges = hints_.protected_ranges;
  std::vector<uint8_t> flags;
  // The first range that ends after the block starts; ranges are disjoint.
  auto it = std::upper_bound(ranges.begin(), ranges.end(), first,
                             [](uint64_t t, const TokenRange& r) { return t < r.end; });
  for (; it != ranges.end() && it->begin < first + bt; ++it) {
    const uint64_t begin = std::max(it->begin, first);
    const uint64_t end = std::min(it->end, first + bt);
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
  // Pin flags are built before taking the lock.
  std::vector<std::vector<uint8_t>> pins(start_block_ + num_blocks_);
  if (!hints_.protected_ranges.empty()) {
    for (uint64_t i = 0; i < pins.size(); ++i) pins[i] = PinnedFlags(i);
  }
  const absl::Time expires = hints_.ttl == absl::ZeroDuration()
                                 ? absl::InfiniteFuture()
                                 : cache_->clock_->Now() + hints_.ttl;
  // Duplicates and replaced copies, and this commit's new blocks pinned
  // until the budgets are enforced: let go of after the locks.
  std::vector<BlockRef> unused;
  std::vector<PinnedBlock> storing;

  if (OnlyAddsBlocks(pins)) {
    // Nothing to record on cached blocks, nothing to make exact: the commit
    // shares the cache's lock and takes its model's (shared when it stores
    // nothing, exclusively to add blocks), and goes on exclusively below
    // only when a block on the path has expired or a cached block turned
    // lossy meanwhile.
    std::optional<absl::StatusOr<AppendResult>> shared = CommitShared(expires, &unused, &storing);
    if (shared.has_value()) {
      if (shared->ok() && shared->value().stored_blocks > 0) cache_->EnforceBudgets();
      return *std::move(shared);
    }
  }

  AppendResult result;
  Cache::WriteLock lock(cache_);
  auto fail = [&](absl::Status status) {  // Fail() for when the lock is held
    unused.insert(unused.end(), std::make_move_iterator(new_blocks_.begin()),
                  std::make_move_iterator(new_blocks_.end()));
    return Fail(status);
  };
  absl::StatusOr<ModelState*> state = FindModelOfSession();
  if (!state.ok()) return fail(state.status());
  ModelState& m = **state;

  // First pass: the prefix must still be there, and so must every block we
  // found cached (MatchLocked also drops expired blocks).
  std::vector<IndexNode*> path;
  cache_->MatchLocked(m, tokens.first((start_block_ + num_blocks_) * bt), hashes_, &path, &unused);
  const uint64_t present = path.size();
  if (absl::Status s = CheckStillCached(present); !s.ok()) return fail(s);
  // Second pass: compare what is cached, insert what is missing.
  for (uint64_t i = 0; i < start_block_; ++i) {
    if (!pins[i].empty()) {
      std::vector<uint8_t>& have = path[i]->mutable_tokens_state().pinned;
      if (have.empty()) have.assign(bt, 0);
      for (uint32_t t = 0; t < bt; ++t) have[t] |= pins[i][t];
      cache_->RecountMetadataLocked(path[i]);
    }
  }
  IndexNode* node = start_block_ == 0 ? nullptr : path[start_block_ - 1];
  const uint64_t cached_end = std::min(present, start_block_ + num_blocks_);
  for (uint64_t i = start_block_; i < cached_end; ++i) {
    const uint64_t j = i - start_block_;
    BlockRef& payload = new_blocks_[j];
    IndexNode* cached = path[i];
    const BlockSeal cached_seal = cached->seal();
    if (CountCached(i, cached_seal, &result) && cached_seal.compressed && payload != nullptr) {
      // The exact bytes of a block stored lossy: make it exact again (in
      // host memory; a lossy copy in a lower level is stale now).
      const uint64_t old_size = cached_seal.size;
      cache_->ForgetCompressionLocked(m, cached);
      m.bytes = m.bytes - old_size + payload->size();
      storing.emplace_back(payload, PinReason::kAppend);
      if (cached->payload != nullptr) {
        cache_->payload_bytes_ += payload->size() - old_size;  // mod 2^64
        unused.push_back(std::exchange(cached->payload, std::move(payload)));
      } else {
        cache_->SetHostCopyLocked(cached, std::move(payload));
      }
      cache_->DropLowerCopiesLocked(cached);
      cache_->DropDeviceCopyLocked(cached, Cache::DeviceDrop::kRestored);
      ++result.restored_blocks;
    }
    if (payload != nullptr) unused.push_back(std::move(payload));
    // A worker's pins apply to the cached copy too.
    if (!pins[i].empty()) {
      std::vector<uint8_t>& have = cached->mutable_tokens_state().pinned;
      if (have.empty()) have.assign(bt, 0);
      for (uint32_t t = 0; t < bt; ++t) have[t] |= pins[i][t];
      cache_->RecountMetadataLocked(cached);
    }
    node = cached;
  }
  node = AddNewBlocks(m, node, cached_end, expires, &pins, &path, &storing, &result);
  // Touch the whole path leaf-first (a parent is never colder than its
  // child); the first touch of a new block inserts it into the policy.
  const absl::Time now = cache_->clock_->Now();
  for (IndexNode* n = node; n != nullptr; n = n->parent) cache_->TouchLocked(n, now);
  m.restored_blocks += result.restored_blocks;
  // The new blocks are committed: their memory is no longer staging. Evict
  // what keeps the staging free (never this append's blocks: `storing` pins them).
  ReleaseClaimsAndStaging();
  cache_->EnforceBudgetsLocked(&unused);
  storing.clear();
  new_blocks_.clear();
  return Committed(m, node, std::move(result));
}

std::optional<absl::StatusOr<AppendResult>> AppendSession::CommitShared(
    absl::Time expires, std::vector<BlockRef>* unused, std::vector<PinnedBlock>* storing) {
  const std::span<const Token> tokens =
      std::span<const Token>(tokens_).first((start_block_ + num_blocks_) * layout_.block_tokens);
  ReaderMutexLock lock(&cache_->mu_);
  absl::StatusOr<ModelState*> state = FindModelOfSession();
  if (!state.ok()) return Fail(state.status());
  ModelState& m = **state;
  std::vector<IndexNode*> path;
  if (StoresNothing()) {
    ReaderMutexLock index_lock(&m.index_lock);
    if (!cache_->MatchSharedLocked(m, tokens, hashes_, &path)) return std::nullopt;
    return CommitDeduplicated(m, path);
  }
  WriterMutexLock index_lock(&m.index_lock);
  m.index.Match(tokens, hashes_, &path);
  const absl::Time now = cache_->clock_->Now();
  // Only a writer removes an expired block.
  if (Cache::FirstExpired(path, now) != path.end()) return std::nullopt;
  const uint64_t present = path.size();
  if (absl::Status s = CheckStillCached(present); !s.ok()) {
    unused->insert(unused->end(), std::make_move_iterator(new_blocks_.begin()),
                   std::make_move_iterator(new_blocks_.end()));
    return Fail(s);
  }
  const uint64_t cached_end = std::min(present, start_block_ + num_blocks_);
  for (uint64_t i = start_block_; i < cached_end; ++i) {
    // Bytes that would make a block stored lossy exact again: a writer's
    // work (the block's copies change).
    if (new_blocks_[i - start_block_] != nullptr && path[i]->seal().compressed) return std::nullopt;
  }
  AppendResult result;
  IndexNode* node = start_block_ == 0 ? nullptr : path[start_block_ - 1];
  for (uint64_t i = start_block_; i < cached_end; ++i) {
    CountCached(i, path[i]->seal(), &result);
    if (new_blocks_[i - start_block_] != nullptr) {
      unused->push_back(std::move(new_blocks_[i - start_block_]));
    }
    node = path[i];
  }
  node = AddNewBlocks(m, node, cached_end, expires, nullptr, &path, storing, &result);
  cache_->TouchCommittedPath(m, path, now);  // the path up to `node`
  ReleaseClaimsAndStaging();
  new_blocks_.clear();
  return Committed(m, node, std::move(result));
}

IndexNode* AppendSession::AddNewBlocks(ModelState& m, IndexNode* node, uint64_t from,
                                       absl::Time expires, std::vector<std::vector<uint8_t>>* pins,
                                       std::vector<IndexNode*>* path,
                                       std::vector<PinnedBlock>* storing, AppendResult* result) {
  const uint32_t bt = layout_.block_tokens;
  const std::span<const Token> tokens(tokens_);
  for (uint64_t i = from; i < start_block_ + num_blocks_; ++i) {
    const uint64_t j = i - start_block_;
    BlockRef& payload = new_blocks_[j];
    if (payload == nullptr) {  // another append in flight is storing it
      result->pending_blocks = static_cast<uint32_t>(start_block_ + num_blocks_ - i);
      break;
    }
    IndexNode* child = m.index.AddChild(node, tokens.subspan(i * bt, bt), payload);
    if (child == nullptr) break;  // a token-hash collision: stop caching here
    storing->emplace_back(payload, PinReason::kAppend);
    child->expires = expires;
    child->priority = hints_.priority;
    child->workload = static_cast<uint8_t>(hints_.workload);
    const bool pinned = pins != nullptr && !(*pins)[i].empty();
    if (!novelty_[j].empty() || pinned) {
      BlockTokenState& ts = child->mutable_tokens_state();
      ts.novelty = std::move(novelty_[j]);
      if (pinned) ts.pinned = std::move((*pins)[i]);
    }
    cache_->RecountMetadataLocked(child);
    path->push_back(child);
    ++result->stored_blocks;
    result->stored_bytes += payload->size();
    node = child;
  }
  m.bytes += result->stored_bytes;
  m.appended_blocks += result->stored_blocks;
  cache_->payload_bytes_ += result->stored_bytes;
  return node;
}

bool AppendSession::OnlyAddsBlocks(const std::vector<std::vector<uint8_t>>& pins) const {
  for (const std::vector<uint8_t>& p : pins) {
    if (!p.empty()) return false;
  }
  for (BlockPlan p : plan_) {
    if (p == BlockPlan::kRestore) return false;
  }
  return true;
}

bool AppendSession::StoresNothing() const {
  for (BlockPlan p : plan_) {
    if (p == BlockPlan::kStore || p == BlockPlan::kRestore) return false;
  }
  return true;
}

absl::StatusOr<ModelState*> AppendSession::FindModelOfSession() const {
  absl::StatusOr<ModelState*> state = cache_->FindModelLocked(model_);
  if (!state.ok()) return state.status();
  const ModelState& m = **state;
  if (m.layout != layout_ || m.incarnation != incarnation_) {
    return absl::AbortedError(absl::StrCat(
        "model \"", model_.model_id, "\" was registered anew",
        m.layout != layout_ ? absl::StrCat(" with another layout (", m.layout.ToString(), ")") : "",
        " while the append streamed; retry the append"));
  }
  return state;
}

absl::Status AppendSession::CheckStillCached(uint64_t present) const {
  for (uint64_t i = present; i < start_block_ + num_blocks_; ++i) {
    if (i < start_block_ || plan_[i - start_block_] == BlockPlan::kCached ||
        plan_[i - start_block_] == BlockPlan::kRestore) {
      return absl::AbortedError(absl::StrCat(
          "block ", i, " of the prefix was evicted while the append streamed; retry the append"));
    }
  }
  return absl::OkStatus();
}

bool AppendSession::CountCached(uint64_t i, const BlockSeal& cached, AppendResult* result) const {
  ++result->deduplicated_blocks;
  if (digests_[i - start_block_] == cached.raw_checksum) return true;
  // Same tokens, other bytes: keep what every reader has been served.
  ++result->conflicting_blocks;
  if (result->first_conflicting_block < 0) {
    result->first_conflicting_block = static_cast<int64_t>(i);
  }
  return false;
}

absl::StatusOr<AppendResult> AppendSession::CommitDeduplicated(
    ModelState& m, const std::vector<IndexNode*>& path) {
  if (absl::Status s = CheckStillCached(path.size()); !s.ok()) return Fail(s);
  AppendResult result;
  IndexNode* node = start_block_ == 0 ? nullptr : path[start_block_ - 1];
  for (uint64_t i = start_block_; i < start_block_ + num_blocks_; ++i) {
    if (i >= path.size()) {  // another append in flight is storing it
      result.pending_blocks = static_cast<uint32_t>(start_block_ + num_blocks_ - i);
      break;
    }
    CountCached(i, path[i]->seal(), &result);
    node = path[i];
  }
  // MatchSharedLocked touched the path (node and its parents) already.
  ReleaseClaimsAndStaging();
  return Committed(m, node, std::move(result));
}

AppendResult AppendSession::Committed(ModelState& m, const IndexNode* node, AppendResult result) {
  m.deduplicated_blocks += result.deduplicated_blocks;
  m.conflicting_blocks += result.conflicting_blocks;
  if (result.conflicting_blocks > 0) ++cache_->conflicting_appends_;
  result.cached_tokens = node == nullptr ? 0 : uint64_t{node->depth + 1} * layout_.block_tokens;
  status_ = absl::FailedPreconditionError("append already committed");
  return result;
}

}  // namespace kvcache
