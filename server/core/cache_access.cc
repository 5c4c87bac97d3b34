// CacheAccess: the cache's components' one door into it (cache_access.h).
#include "server/core/cache_access.h"

#include <memory>
#include <thread>

#include "server/core/cache.h"

namespace kvcache {

// --- Held ---------------------------------------------------------------------

absl::StatusOr<const ModelState*> CacheAccess::Held::FindModel(const ModelKey& model) const {
  cache_->mu_.AssertHeld();
  absl::StatusOr<ModelState*> found = cache_->FindModelLocked(model);
  if (!found.ok()) return found.status();
  return *found;
}

const ModelState* CacheAccess::Held::ModelOf(const PrefixIndex* index) const {
  cache_->mu_.AssertHeld();
  return cache_->models_.OfIndex(index);
}

void CacheAccess::Held::ForEachModel(absl::FunctionRef<void(const ModelState& model)> visit) const {
  cache_->mu_.AssertHeld();
  for (const auto& [key, m] : cache_->models_) visit(*m);
}

absl::Time CacheAccess::Held::Now() const { return cache_->clock_->Now(); }

bool CacheAccess::Held::OnDevice(const IndexNode& node) const {
  cache_->mu_.AssertHeld();
  return cache_->device_copies_.Find(&node) != nullptr;
}

void CacheAccess::Held::ForEachLease(
    absl::FunctionRef<void(uint64_t id, const Lease& lease)> visit) const {
  cache_->mu_.AssertHeld();
  cache_->leases_.ForEachWithId(visit);
}

std::optional<uint64_t> CacheAccess::Held::DropCorrupt(const BlockMove& claimed, BlockTier level,
                                                       const char* reason,
                                                       std::vector<BlockRef>* dropped) const {
  Cache& c = *cache_;
  c.mu_.AssertHeld();
  IndexNode* n = claimed.Refind(c.models_);
  if (n == nullptr) return std::nullopt;
  ModelState& m = *c.models_.OfIndex(claimed.index());
  ++m.corrupt_blocks;
  const size_t lower = claimed.lower_level();
  if (level == BlockTier::kLower &&
      (n->payload != nullptr || n->lower.below(lower) != LowerCopies::kNone ||
       n->lower.top() < static_cast<int>(lower))) {
    // Another copy is good: the bad lower copy goes alone, if it is still
    // the one checked.
    const StoredRef& bad = n->lower.at(lower);
    if (bad == nullptr || bad != claimed.lower()) return std::nullopt;
    c.tiers_->LogMove(*n, c.lower_names_[lower].c_str(), "none", reason, bad->seal().size);
    c.DropLowerCopyLocked(n, lower);
    return 0;
  }
  c.tiers_->LogMove(*n, level == BlockTier::kLower ? c.lower_names_[lower].c_str() : "host", "none",
                    reason, n->seal().size);
  return c.RemoveSubtreeLocked(m, n, dropped).evicted_blocks;
}

ModelState* CacheAccess::Held::FindMutableModel(const ModelKey& model) const {
  cache_->mu_.AssertHeld();
  return cache_->models_.Find(model);
}

IndexNode* CacheAccess::Held::AddRestored(ModelState& model, IndexNode* parent,
                                          BlockImage image) const {
  cache_->mu_.AssertHeld();
  return cache_->AddRestoredLocked(model, parent, std::move(image));
}

void CacheAccess::Held::ForEachMutableModel(
    absl::FunctionRef<void(ModelState& model)> visit) const {
  cache_->mu_.AssertHeld();
  for (const auto& [key, m] : cache_->models_) visit(*m);
}

ModelState& CacheAccess::Held::ModelOfBlock(const IndexNode& node) const {
  cache_->mu_.AssertHeld();
  return *cache_->models_.OfIndex(node.index);
}

BlockMove CacheAccess::Held::ClaimRewrite(const IndexNode& node) const {
  cache_->mu_.AssertHeld();
  cache_->moving_.insert(node.payload.get());
  return BlockMove::Claim(node);
}

bool CacheAccess::Held::Rewriting(const IndexNode& node) const {
  cache_->mu_.AssertHeld();
  return cache_->moving_.contains(node.payload.get());
}

IndexNode* CacheAccess::Held::EndRewrite(const BlockMove& claimed) const {
  cache_->mu_.AssertHeld();
  cache_->moving_.erase(claimed.host().get());
  return claimed.Refind(cache_->models_);
}

void CacheAccess::Held::ReplaceHostCopy(IndexNode* node, BlockRef copy) const {
  Cache& c = *cache_;
  c.mu_.AssertHeld();
  const BlockSeal old = node->payload->seal();
  if (copy->seal() == old) {  // the same bytes elsewhere
    node->payload = std::move(copy);
    return;
  }
  ModelState& m = *c.models_.OfIndex(node->index);
  const uint64_t old_size = old.size;
  const uint64_t new_size = copy->size();
  node->payload = std::move(copy);
  c.DropLowerCopiesLocked(node);                                   // no longer match the seal
  c.DropDeviceCopyLocked(node, Cache::DeviceDrop::kRecompressed);  // nor does a device copy
  m.bytes = m.bytes - old_size + new_size;
  c.payload_bytes_ += new_size;
  c.payload_bytes_ -= old_size;
}

void CacheAccess::Held::RecountMetadata(IndexNode* node) const {
  cache_->mu_.AssertHeld();
  cache_->RecountMetadataLocked(node);
}

uint64_t CacheAccess::Held::EnforceBudgets(std::vector<BlockRef>* dropped) const {
  cache_->mu_.AssertHeld();
  return cache_->EnforceBudgetsLocked(dropped);
}

CompactorCounters& CacheAccess::Held::compactor_counters() const {
  cache_->mu_.AssertHeld();
  return cache_->compactor_;
}

void CacheAccess::Held::ExpireLeases() const {
  cache_->mu_.AssertHeld();
  cache_->ExpireLeasesLocked(cache_->clock_->Now());
}

IndexNode* CacheAccess::Held::ColdestHostBlock() const {
  cache_->mu_.AssertHeld();
  return cache_->PickHostVictimLocked(
      [](const IndexNode& n) { return !n.payload->pins().pinned(); });
}

void CacheAccess::Held::DropHostCopy(IndexNode* node, std::vector<BlockRef>* dropped) const {
  cache_->mu_.AssertHeld();
  cache_->DropHostCopyLocked(node, dropped);
}

IndexNode* CacheAccess::Held::ColdestLowerBlock(size_t level) const {
  cache_->mu_.AssertHeld();
  return cache_->lower_policies_[level]->PickVictim(
      [level](const IndexNode& n) { return !n.lower.at(level)->pins().pinned(); });
}

void CacheAccess::Held::AddLowerCopy(IndexNode* node, size_t level, StoredRef copy) const {
  cache_->mu_.AssertHeld();
  cache_->AddLowerCopyLocked(node, level, std::move(copy));
}

void CacheAccess::Held::DropLowerCopy(IndexNode* node, size_t level) const {
  cache_->mu_.AssertHeld();
  cache_->DropLowerCopyLocked(node, level);
}

void CacheAccess::Held::SetHostCopy(IndexNode* node, BlockRef copy) const {
  cache_->mu_.AssertHeld();
  cache_->SetHostCopyLocked(node, std::move(copy));
}

uint64_t CacheAccess::Held::RemoveBlock(IndexNode* node, std::vector<BlockRef>* dropped) const {
  Cache& c = *cache_;
  c.mu_.AssertHeld();
  return c.RemoveSubtreeLocked(*c.models_.OfIndex(node->index), node, dropped).evicted_blocks;
}

bool CacheAccess::Held::EvictHostLeaf(std::vector<BlockRef>* dropped) const {
  cache_->mu_.AssertHeld();
  return cache_->EvictHostLeafLocked(dropped);
}

bool CacheAccess::Held::FreeLowerLevel(size_t level, std::vector<BlockRef>* dropped) const {
  cache_->mu_.AssertHeld();
  return cache_->FreeLowerLevelLocked(level, dropped);
}

void CacheAccess::Held::CountCapacityEviction() const {
  cache_->mu_.AssertHeld();
  ++cache_->capacity_evictions_;
}

absl::StatusOr<CacheAccess::Held::ExactMatch> CacheAccess::Held::MatchExact(
    const ModelKey& model, std::span<const Token> tokens, const BlockHashes& hashes,
    std::vector<BlockRef>* expired) const {
  Cache& c = *cache_;
  c.mu_.AssertHeld();
  absl::StatusOr<ModelState*> state = c.FindModelLocked(model);
  if (!state.ok()) return state.status();
  ModelState& m = **state;
  ExactMatch out{.index = &m.index, .block_tokens = m.layout.block_tokens};
  c.MatchLocked(m, tokens, hashes, &out.path, expired);
  const size_t exact = Cache::ReadableBlocks(out.path, /*accept_lossy=*/false);
  out.withheld_blocks = out.path.size() - exact;
  out.path.resize(exact);
  const uint64_t bt = out.block_tokens;
  m.hit_tokens += exact * bt;
  m.miss_tokens += (tokens.size() / bt) * bt - exact * bt;
  return out;
}

const StoredRef* CacheAccess::Held::UseDeviceCopy(IndexNode* node) const {
  Cache& c = *cache_;
  c.mu_.AssertHeld();
  const StoredRef* copy = c.device_copies_.Find(node);
  if (copy != nullptr) c.device_copies_.Touch(node);
  return copy;
}

bool CacheAccess::Held::AddDeviceCopy(IndexNode* node, StoredRef copy) const {
  Cache& c = *cache_;
  c.mu_.AssertHeld();
  if (c.device_copies_.Find(node) != nullptr) return false;
  const uint64_t size = copy->seal().size;
  c.device_copies_.Put(node, std::move(copy));
  ++c.tier_.device_blocks;
  c.tier_.device_payload_bytes += size;
  const int top = node->lower.top();
  c.tiers_->LogMove(*node,
                    node->in_host()             ? "host"
                    : top == LowerCopies::kNone ? "none"
                                                : c.lower_names_[static_cast<size_t>(top)].c_str(),
                    "gpu", "place", size);
  return true;
}

bool CacheAccess::Held::DropDeviceVictim(DeviceDrop why) const {
  cache_->mu_.AssertHeld();
  return cache_->DropDeviceVictimLocked(why);
}

IndexNode* CacheAccess::Held::RefindSealed(const BlockMove& claimed) const {
  cache_->mu_.AssertHeld();
  return claimed.RefindSealed(cache_->models_);
}

absl::StatusOr<std::pair<uint64_t, absl::Time>> CacheAccess::Held::CreateLease(
    const ModelKey& model, const PrefixIndex* index, std::vector<Token> tokens,
    uint64_t matched_tokens, std::vector<TieredBlock> blocks, absl::Duration ttl) const {
  cache_->mu_.AssertHeld();
  return cache_->CreateLeaseLocked(model, index, std::move(tokens), matched_tokens,
                                   std::move(blocks), ttl);
}

IndexNode* CacheAccess::Held::Refind(const BlockMove& claimed) const {
  cache_->mu_.AssertHeld();
  return claimed.Refind(cache_->models_);
}

TierCounters& CacheAccess::Held::tier_counters() const {
  cache_->mu_.AssertHeld();
  return cache_->tier_;
}

// --- Locked -------------------------------------------------------------------

CacheAccess::Locked::Locked(const CacheAccess& access) ABSL_NO_THREAD_SAFETY_ANALYSIS
    : Held(access.cache_) {
  Cache& c = *access.cache_;
  c.mu_.Lock();
  c.ApplyTouchesLocked();  // as every exclusive section does (Cache::WriteLock)
}

CacheAccess::Locked::~Locked() ABSL_NO_THREAD_SAFETY_ANALYSIS { Held::cache_->mu_.Unlock(); }

// --- Walks --------------------------------------------------------------------

bool CacheAccess::Walk(
    const ModelKey& model, const WalkScope& scope,
    absl::FunctionRef<void(const Held&, const ModelState&, const IndexNode&)> visit) const {
  // The cursor is created, stepped and destroyed under the lock only; the
  // index tells it of every removal in between, and detaches it when the
  // model goes.
  std::unique_ptr<PrefixIndex::Cursor> cursor;
  {
    Locked locked(*this);
    cache_->mu_.AssertHeld();
    const ModelState* m = cache_->models_.Find(model);
    if (m == nullptr) return false;
    const IndexNode* top = nullptr;
    if (scope.top_lookup_hash.has_value()) {
      top = m->index.FindByLookupHash(*scope.top_lookup_hash);
      if (top == nullptr) return false;
    }
    cursor = std::make_unique<PrefixIndex::Cursor>(&m->index, top, scope.max_depth);
  }
  while (true) {
    const auto start = std::chrono::steady_clock::now();
    {
      Locked locked(*this);
      cache_->mu_.AssertHeld();
      const ModelState* m = cache_->models_.Find(model);
      // Gone, or registered anew (a new index): the walk ends short.
      if (m == nullptr || cursor->index() != &m->index) {
        cursor.reset();
        return false;
      }
      cursor->Step(kWalkStepNodes, [&](IndexNode* n) { visit(locked, *m, *n); });
      if (cursor->done()) {
        cursor.reset();
        return true;
      }
    }
    GiveWayAfterStep(start);
  }
}

void CacheAccess::GiveWayAfterStep(std::chrono::steady_clock::time_point step_start) {
  std::this_thread::sleep_for(std::chrono::steady_clock::now() - step_start);
}

// --- Without the lock -----------------------------------------------------------

absl::StatusOr<BlockHashes> CacheAccess::HashBlocks(const ModelKey& model,
                                                    std::span<const Token> tokens) const {
  return cache_->HashBlocks(model, tokens);
}

size_t CacheAccess::lower_levels() const { return cache_->lower_.size(); }

Tier& CacheAccess::lower_tier(size_t level) const { return *cache_->lower_[level]; }

const char* CacheAccess::lower_name(size_t level) const {
  return cache_->lower_names_[level].c_str();
}

std::vector<SlabClassStats> CacheAccess::PoolClasses() const {
  return cache_->pool_->GetClassStats();
}

SlabPool& CacheAccess::pool() const { return *cache_->pool_; }

uint64_t CacheAccess::CommittedHostBytes() const { return cache_->CommittedHostBytes(); }

DeviceTier* CacheAccess::device_tier() const { return cache_->device_.get(); }

absl::Status CacheAccess::CheckTokenCount(size_t n) const { return cache_->CheckTokenCount(n); }

absl::Status CacheAccess::CheckLeaseTtl(absl::Duration ttl) const {
  return cache_->CheckLeaseTtl(ttl);
}

absl::Time CacheAccess::Now() const { return cache_->clock_->Now(); }

absl::StatusOr<FetchPlan> CacheAccess::PlanPromotion(const ModelKey& model,
                                                     std::span<const Token> tokens,
                                                     bool accept_lossy) const {
  return cache_->PlanFetch(model, tokens, accept_lossy, /*max_blocks=*/0,
                           TierManager::ReadFor::kPromotion);
}

const CacheOptions& CacheAccess::options() const { return cache_->options_; }

}  // namespace kvcache
