#include "server/core/cache.h"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <tuple>
#include <utility>

#include "absl/strings/str_cat.h"
#include "server/common/status_macros.h"
#include "server/core/cache_access.h"

namespace kvcache {

namespace {

std::vector<Cache::LowerLevel> OneLevel(std::shared_ptr<Tier> lower,
                                        std::unique_ptr<EvictionPolicy> policy) {
  std::vector<Cache::LowerLevel> levels;
  if (lower != nullptr) levels.push_back({std::move(lower), std::move(policy)});
  return levels;
}

std::vector<std::shared_ptr<Tier>> TiersOf(const std::vector<Cache::LowerLevel>& levels) {
  std::vector<std::shared_ptr<Tier>> tiers;
  for (const Cache::LowerLevel& l : levels) tiers.push_back(l.tier);
  return tiers;
}

std::vector<std::string> KindsOf(const std::vector<Cache::LowerLevel>& levels) {
  std::vector<std::string> kinds;
  for (const Cache::LowerLevel& l : levels) {
    std::string kind = l.tier->GetStats().kind;
    kinds.push_back(kind.empty() ? absl::StrCat("level", kinds.size()) : std::move(kind));
  }
  return kinds;
}

}  // namespace

Cache::Cache(const CacheOptions& options, std::unique_ptr<SlabPool> pool,
             std::unique_ptr<EvictionPolicy> policy, Clock* clock, std::shared_ptr<Tier> lower,
             std::unique_ptr<EvictionPolicy> lower_policy, std::shared_ptr<DeviceTier> device)
    : Cache(options, std::move(pool), std::move(policy), clock,
            OneLevel(std::move(lower), std::move(lower_policy)), std::move(device)) {}

Cache::Cache(const CacheOptions& options, std::unique_ptr<SlabPool> pool,
             std::unique_ptr<EvictionPolicy> policy, Clock* clock, std::vector<LowerLevel> lower,
             std::shared_ptr<DeviceTier> device)
    : options_(options),
      pool_(std::move(pool)),
      pool_capacity_bytes_(pool_->GetStats().capacity_bytes),
      eviction_batch_bytes_(pool_capacity_bytes_ / kEvictionBatchFraction),
      clock_(clock),
      lower_(TiersOf(lower)),
      lower_names_(KindsOf(lower)),
      device_(std::move(device)),
      policy_(std::move(policy)),
      models_(options.max_models, options.namespace_share),
      leases_(options.max_leases, options.max_lease_tokens, options.namespace_share) {
  if (lower.size() > kMaxLowerLevels) {
    std::fprintf(stderr, "Cache: %zu levels below host memory; a block has %zu slots\n",
                 lower.size(), kMaxLowerLevels);
    std::abort();
  }
  for (LowerLevel& l : lower) {
    lower_policies_.push_back(l.policy != nullptr ? std::move(l.policy) : NewLruPolicy());
  }
  tiers_ = std::make_unique<TierManager>(CacheAccess(this), options_.tiers,
                                         /*log_moves=*/!lower_.empty() || device_ != nullptr);
}

Cache::~Cache() {
  tiers_->StopWorkers();  // their jobs use the cache
  WriteLock lock(this);
  leases_.Clear();
  for (auto& entry : models_) {
    ModelState& state = *entry.second;
    state.index.Clear([&](IndexNode* n) {
      mu_.AssertHeld();  // the lambda runs under the lock
      ForgetNodeLocked(state, n);
    });
  }
}

absl::Status Cache::CheckTokenCount(size_t n) const {
  if (n > options_.max_tokens_per_request) {
    return absl::InvalidArgumentError(
        absl::StrCat("tokens has ", n, " entries; the limit (max_tokens_per_request) is ",
                     options_.max_tokens_per_request));
  }
  return absl::OkStatus();
}

absl::StatusOr<ModelState*> Cache::FindModelLocked(const ModelKey& model) const {
  ModelState* state = models_.Find(model);
  if (state == nullptr) {
    return absl::NotFoundError(absl::StrCat(
        "model \"", model.model_id, "\" is not registered in namespace \"", model.ns, "\""));
  }
  return state;
}

absl::StatusOr<RegisterResult> Cache::RegisterModel(const ModelKey& model, ModelLayout layout) {
  KVCACHE_RETURN_IF_ERROR(ValidateIdentifier("namespace", model.ns));
  KVCACHE_RETURN_IF_ERROR(ValidateIdentifier("model_id", model.model_id));
  if (layout.block_tokens == 0) layout.block_tokens = kDefaultBlockTokens;
  KVCACHE_RETURN_IF_ERROR(layout.Validate());
  const SlabPoolStats pool = pool_->GetStats();
  if (pool_->RoundedSize(layout.BlockBytes()) > pool.capacity_bytes) {
    return absl::ResourceExhaustedError(
        absl::StrCat("one block of this layout takes ", layout.BlockBytes(),
                     " bytes, more than the host tier's capacity of ", pool.capacity_bytes));
  }
  WriteLock lock(this);
  if (const ModelState* known = models_.Find(model); known != nullptr) {
    if (known->layout != layout) {
      return absl::AlreadyExistsError(
          absl::StrCat("model \"", model.model_id, "\" is registered with another layout (",
                       known->layout.ToString(), "); requested ", layout.ToString()));
    }
    return RegisterResult{.created = false, .layout = layout};
  }
  auto state = std::make_unique<ModelState>(
      model, layout, options_.importance.default_policy, options_.importance.calibration_samples,
      options_.block_hash_keys
          ? std::make_shared<const BlockHasher>(options_.block_hash_keys(model))
          : BlockHasher::Unkeyed());
  if (auto w = options_.importance.initial_weights.find(model);
      w != options_.importance.initial_weights.end()) {
    state->policy.params.alpha = w->second.alpha;
    state->policy.params.beta = w->second.beta;
    state->policy.params.gamma = w->second.gamma;
  }
  state->host_policy = policy_->NewSibling();
  state->index.set_host_policy(state->host_policy.get());
  EvictionPolicy* host_policy = state->host_policy.get();
  if (auto added = models_.Add(std::move(state)); !added.ok()) return added.status();
  host_policies_.push_back(host_policy);
  return RegisterResult{.created = true, .layout = layout};
}

absl::StatusOr<BlockHashes> Cache::HashBlocks(const ModelKey& model,
                                              std::span<const Token> tokens) const {
  uint32_t block_tokens;
  std::shared_ptr<const BlockHasher> hasher;
  {
    ReaderMutexLock lock(&mu_);
    auto state = FindModelLocked(model);
    if (!state.ok()) return state.status();
    block_tokens = (*state)->layout.block_tokens;
    hasher = (*state)->index.hasher();
  }
  return BlockHashes::Of(std::move(hasher), block_tokens, tokens);
}

void Cache::ForgetNodeLocked(ModelState& state, IndexNode* node) {
  PolicyFor(*node)->Erase(node);
  if (node->payload == nullptr) --tier_.lower[static_cast<size_t>(node->lower.top())].only_blocks;
  for (size_t level = 0; level < lower_.size(); ++level) {
    if (node->lower.at(level) == nullptr) continue;
    --tier_.lower[level].blocks;
    tier_.lower[level].payload_bytes -= node->lower.at(level)->seal().size;
  }
  if (StoredRef device = device_copies_.Take(node); device != nullptr) {
    --tier_.device_blocks;
    tier_.device_payload_bytes -= device->seal().size;
  }
  ForgetCompressionLocked(state, node);
  metadata_bytes_ -= node->metadata_bytes;
  state.metadata_bytes -= std::min(state.metadata_bytes, node->metadata_bytes);
  node->metadata_bytes = 0;
}

void Cache::ForgetCompressionLocked(ModelState& state, IndexNode* node) {
  if (!node->tokens_state().compressed) return;
  BlockTokenState& ts = node->mutable_tokens_state();
  state.UncountCompressed(ts);
  ts.compressed = false;
  ts.num_int8 = ts.num_pruned = 0;
  ts.int8_entries = ts.int4_entries = ts.pruned_entries = 0;
  ts.bytes_saved = 0;
}

uint64_t Cache::NodeMetadataBytes(const IndexNode& node) {
  uint64_t bytes = sizeof(IndexNode) + node.tokens().size_bytes() + kNodeAllocationOverhead;
  if (node.has_tokens_state()) {
    const BlockTokenState& ts = node.tokens_state();
    bytes += sizeof(BlockTokenState) + kTokenStateAllocationOverhead +
             ts.novelty.capacity() * sizeof(float) + ts.activity.capacity() * sizeof(float) +
             ts.head_activity.capacity() * sizeof(float) + ts.pinned.capacity();
  }
  return bytes;
}

void Cache::RecountMetadataLocked(IndexNode* node) {
  const uint64_t now = NodeMetadataBytes(*node);
  metadata_bytes_.fetch_add(now - node->metadata_bytes, std::memory_order_relaxed);  // mod 2^64
  if (ModelState* owner = models_.OfIndex(node->index); owner != nullptr) {
    owner->metadata_bytes =
        owner->metadata_bytes - std::min(owner->metadata_bytes, node->metadata_bytes) + now;
  }
  node->metadata_bytes = now;
}

void Cache::DropNodeLocked(ModelState& state, IndexNode* n, std::vector<BlockRef>* dropped,
                           EvictResult* result) {
  ForgetNodeLocked(state, n);
  const uint64_t size = n->seal().size;
  ++result->evicted_blocks;
  result->evicted_bytes += size;
  if (n->payload != nullptr) {
    payload_bytes_ -= size;
    dropped->push_back(std::move(n->payload));
  }
}

EvictResult Cache::RemoveSubtreeLocked(ModelState& state, IndexNode* node,
                                       std::vector<BlockRef>* dropped) {
  EvictResult result;
  if (eviction_round_ != nullptr) eviction_round_->Forget(state.host_policy.get());
  state.index.RemoveSubtree(node, [&](IndexNode* n) {
    mu_.AssertHeld();  // the lambda runs under the lock
    DropNodeLocked(state, n, dropped, &result);
  });
  state.bytes -= result.evicted_bytes;
  state.evicted_blocks += result.evicted_blocks;
  return result;
}

size_t Cache::ReadableBlocks(const std::vector<IndexNode*>& path, bool accept_lossy) {
  if (accept_lossy) return path.size();
  auto lossy = std::find_if(path.begin(), path.end(),
                            [](const IndexNode* n) { return n->seal().compressed; });
  return static_cast<size_t>(lossy - path.begin());
}

size_t Cache::ExactBlocks(std::span<const TieredBlock> blocks) {
  auto lossy = std::find_if(blocks.begin(), blocks.end(),
                            [](const TieredBlock& b) { return b.seal().compressed; });
  return static_cast<size_t>(lossy - blocks.begin());
}

absl::StatusOr<LookupResult> Cache::Lookup(const ModelKey& model, std::span<const Token> tokens,
                                           const LeaseRequest& lease, bool accept_lossy) {
  KVCACHE_RETURN_IF_ERROR(CheckTokenCount(tokens.size()));
  KVCACHE_RETURN_IF_ERROR(CheckLeaseTtl(lease.ttl));
  // Hashing, and copying the tokens a lease keeps, need no lock.
  absl::StatusOr<BlockHashes> hashes = HashBlocks(model, tokens);
  if (!hashes.ok()) return hashes.status();
  std::vector<IndexNode*> path;
  LookupResult result;
  if (!lease.acquire) {
    // A hit without a lease changes nothing but recency: it shares the lock.
    ReaderMutexLock lock(&mu_);
    auto state = FindModelLocked(model);
    if (!state.ok()) return state.status();
    ReaderMutexLock index_lock(&(*state)->index_lock);
    if (MatchSharedLocked(**state, tokens, *hashes, &path)) {
      WithholdLossy(**state, accept_lossy, &path, &result);
      FillLookupResult(**state, tokens.size(), path, &result);
      return result;
    }
  }
  std::vector<Token> lease_tokens;
  if (lease.acquire) lease_tokens.assign(tokens.begin(), tokens.end());
  std::vector<BlockRef> expired;  // released after the lock
  WriteLock lock(this);
  auto state = FindModelLocked(model);
  if (!state.ok()) return state.status();
  ModelState& m = **state;
  MatchLocked(m, tokens, *hashes, &path, &expired);
  WithholdLossy(m, accept_lossy, &path, &result);
  if (lease.acquire && !path.empty()) {
    std::vector<TieredBlock> leased;
    leased.reserve(path.size());
    for (IndexNode* n : path) leased.push_back(TakeBlock(*n, PinReason::kLease));
    auto made =
        CreateLeaseLocked(model, &m.index, std::move(lease_tokens),
                          path.size() * m.layout.block_tokens, std::move(leased), lease.ttl);
    if (!made.ok()) return made.status();
    std::tie(result.lease_id, result.lease_expires) = *made;
  }
  FillLookupResult(m, tokens.size(), path, &result);
  return result;
}

void Cache::WithholdLossy(const ModelState& m, bool accept_lossy, std::vector<IndexNode*>* path,
                          LookupResult* result) {
  const size_t readable = ReadableBlocks(*path, accept_lossy);
  result->withheld_tokens = (path->size() - readable) * m.layout.block_tokens;
  path->resize(readable);
}

void Cache::FillLookupResult(ModelState& m, size_t num_tokens, const std::vector<IndexNode*>& path,
                             LookupResult* result) const {
  const uint32_t bt = m.layout.block_tokens;
  result->matched_tokens = path.size() * bt;
  m.hit_tokens.fetch_add(result->matched_tokens, std::memory_order_relaxed);
  m.miss_tokens.fetch_add((num_tokens / bt) * bt - result->matched_tokens,
                          std::memory_order_relaxed);
  result->blocks.reserve(path.size());
  const uint64_t block_bytes = m.layout.BlockBytes();
  for (const IndexNode* n : path) {
    const BlockSeal& seal = n->seal();
    const int top = n->in_host() ? LowerCopies::kNone : n->lower.top();
    result->blocks.push_back(
        {.index = n->depth,
         .tier = top == LowerCopies::kNone ? BlockTier::kHost : BlockTier::kLower,
         .lower_kind =
             top == LowerCopies::kNone ? "" : lower_names_[static_cast<size_t>(top)].c_str(),
         .key = n->key,
         .checksum = seal.fetch_checksum(),
         .bytes = block_bytes,
         .lossy = seal.compressed,
         .stored_bytes = seal.size,
         .stored_checksum = seal.checksum});
  }
}

absl::Status Cache::CheckLeaseTtl(absl::Duration ttl) const {
  if (ttl < absl::ZeroDuration() || ttl > options_.max_lease_ttl) {
    return absl::InvalidArgumentError(
        absl::StrCat("lease_ttl_ms must be at most ",
                     absl::ToInt64Milliseconds(options_.max_lease_ttl), " (max_lease_ttl_ms)"));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::pair<uint64_t, absl::Time>> Cache::CreateLeaseLocked(
    const ModelKey& model, const PrefixIndex* index, std::vector<Token> tokens,
    uint64_t matched_tokens, std::vector<TieredBlock> blocks, absl::Duration ttl) {
  const absl::Time now = clock_->Now();
  ExpireLeasesLocked(now);
  tokens.resize(matched_tokens);  // a prefix of the request's tokens: shrinks
  const absl::Time expires = now + (ttl == absl::ZeroDuration() ? options_.default_lease_ttl : ttl);
  absl::StatusOr<uint64_t> id = leases_.Add({.model = model,
                                             .index = index,
                                             .matched_tokens = matched_tokens,
                                             .tokens = std::move(tokens),
                                             .blocks = std::move(blocks),
                                             .expires = expires,
                                             .created = now});
  if (!id.ok()) return id.status();
  return std::make_pair(*id, expires);
}

bool Cache::ReleaseLease(uint64_t lease_id, absl::FunctionRef<bool(const ModelKey&)> may_release) {
  Lease released;  // its references drop after the lock
  WriteLock lock(this);
  ExpireLeasesLocked(clock_->Now());
  const Lease* lease = leases_.Find(lease_id);
  if (lease == nullptr || !may_release(lease->model)) return false;
  return leases_.Remove(lease_id, &released);
}

void Cache::ExpireLeasesLocked(absl::Time now) {
  // Expired leases' references drop here, under the lock; that only frees
  // pool memory and slots (no payload copies).
  leases_.Expire(now);
}

absl::StatusOr<EvictResult> Cache::EvictPrefix(const ModelKey& model,
                                               std::span<const Token> tokens) {
  KVCACHE_RETURN_IF_ERROR(CheckTokenCount(tokens.size()));
  absl::StatusOr<BlockHashes> hashes = HashBlocks(model, tokens);
  if (!hashes.ok()) return hashes.status();
  std::vector<BlockRef> dropped;
  WriteLock lock(this);
  auto state = FindModelLocked(model);
  if (!state.ok()) return state.status();
  const uint32_t bt = (*state)->layout.block_tokens;
  if (tokens.empty() || tokens.size() % bt != 0) {
    return absl::InvalidArgumentError(absl::StrCat("prefix has ", tokens.size(),
                                                   " tokens; it must be a non-zero multiple of ",
                                                   "the model's block_tokens (", bt, ")"));
  }
  std::vector<IndexNode*> path;
  (*state)->index.Match(tokens, *hashes, &path);
  if (path.size() * bt != tokens.size()) return EvictResult{};
  return RemoveSubtreeLocked(**state, path.back(), &dropped);
}

EvictResult Cache::ClearModelLocked(ModelState& m, std::vector<BlockRef>* dropped) {
  EvictResult result;
  m.index.Clear([&](IndexNode* n) {
    mu_.AssertHeld();  // the lambda runs under the lock
    DropNodeLocked(m, n, dropped, &result);
  });
  m.bytes -= result.evicted_bytes;
  m.evicted_blocks += result.evicted_blocks;
  return result;
}

namespace {

// Returns the pool's per-CPU cached chunks to their spans when it leaves
// scope. Declared before a bulk removal's `dropped`, it runs after they are
// freed, so the spans they empty are released at once (and no longer
// reported reserved) instead of staying held by chunks parked in the stripes.
class FlushPoolCachesOnExit {
 public:
  explicit FlushPoolCachesOnExit(SlabPool* pool) : pool_(pool) {}
  ~FlushPoolCachesOnExit() { pool_->FlushThreadCaches(); }
  FlushPoolCachesOnExit(const FlushPoolCachesOnExit&) = delete;
  FlushPoolCachesOnExit& operator=(const FlushPoolCachesOnExit&) = delete;

 private:
  SlabPool* const pool_;
};

}  // namespace

absl::StatusOr<EvictResult> Cache::EvictModel(const ModelKey& model) {
  FlushPoolCachesOnExit flush(pool_.get());
  std::vector<BlockRef> dropped;
  WriteLock lock(this);
  auto state = FindModelLocked(model);
  if (!state.ok()) return state.status();
  return ClearModelLocked(**state, &dropped);
}

absl::StatusOr<UnregisterResult> Cache::UnregisterModel(const ModelKey& model) {
  FlushPoolCachesOnExit flush(pool_.get());
  // Released after the lock: payload references, leases, the model's state.
  std::vector<BlockRef> dropped;
  std::vector<Lease> released;
  std::unique_ptr<ModelState> removed;
  WriteLock lock(this);
  auto state = FindModelLocked(model);
  if (!state.ok()) return state.status();
  const EvictResult evicted = ClearModelLocked(**state, &dropped);
  const size_t released_leases = leases_.RemoveModel(model, &released);
  removed = models_.Remove(model);
  std::erase(host_policies_, removed->host_policy.get());
  return UnregisterResult{.evicted_blocks = evicted.evicted_blocks,
                          .evicted_bytes = evicted.evicted_bytes,
                          .released_leases = released_leases};
}

uint64_t Cache::NamespaceBytesLocked(const std::string& ns) const {
  uint64_t bytes = 0;
  for (const auto& [key, m] : models_) {
    if (key.ns == ns) bytes += m->bytes;
  }
  return bytes;
}

absl::Status Cache::MakeRoomInNamespace(const std::string& ns, uint64_t incoming) {
  const uint64_t quota = options_.max_namespace_bytes;
  if (quota == 0) return absl::OkStatus();
  std::vector<BlockRef> dropped;  // freed after the lock is released
  WriteLock lock(this);
  uint64_t used = NamespaceBytesLocked(ns);
  while (used + incoming > quota) {
    IndexNode* victim = PickHostVictimLocked(
        [](const IndexNode& n) { return n.is_leaf() && !n.payload->pins().pinned(); }, &ns);
    if (victim == nullptr) {
      ++rejected_appends_;
      return absl::ResourceExhaustedError(absl::StrCat(
          "namespace \"", ns, "\" is at its quota: ", used, " bytes cached + ", incoming,
          " incoming > max_namespace_bytes ", quota,
          " (security.tenant_limits.max_cached_bytes), and none of its blocks can be evicted "
          "(leased, being fetched, or not in host memory)"));
    }
    tiers_->LogMove(*victim, "host", "none", "quota", victim->payload->size());
    ModelState& state = *models_.OfIndex(victim->index);
    RemoveSubtreeLocked(state, victim, &dropped);
    ++quota_evictions_;
    used = NamespaceBytesLocked(ns);
  }
  return absl::OkStatus();
}

CacheStats Cache::GetStats() const {
  CacheStats stats;
  stats.host_pool = pool_->GetStats();
  WriteLock lock(this);
  for (const auto& [key, m] : models_) {
    stats.models.push_back({.model = key,
                            .layout = m->layout,
                            .blocks = m->index.num_blocks(),
                            .tokens = m->index.num_blocks() * m->layout.block_tokens,
                            .bytes = m->bytes,
                            .hit_tokens = m->hit_tokens,
                            .miss_tokens = m->miss_tokens,
                            .appended_blocks = m->appended_blocks,
                            .deduplicated_blocks = m->deduplicated_blocks,
                            .evicted_blocks = m->evicted_blocks,
                            .policy = m->policy,
                            .compressed_blocks = m->compressed_blocks,
                            .full_tokens = m->index.num_blocks() * m->layout.block_tokens -
                                           m->int8_tokens - m->pruned_tokens,
                            .int8_tokens = m->int8_tokens,
                            .pruned_tokens = m->pruned_tokens,
                            .int8_entries = m->int8_entries,
                            .int4_entries = m->int4_entries,
                            .pruned_entries = m->pruned_entries,
                            .budget_overruns = m->budget_overruns,
                            .bytes_saved = m->bytes_saved,
                            .attention_reports = m->attention_reports,
                            .calibrations = m->calibrations,
                            .conflicting_blocks = m->conflicting_blocks,
                            .restored_blocks = m->restored_blocks,
                            .corrupt_blocks = m->corrupt_blocks});
    stats.blocks += m->index.num_blocks();
  }
  stats.payload_bytes = payload_bytes_;
  stats.active_leases = leases_.size();
  stats.capacity_evictions = capacity_evictions_;
  stats.quota_evictions = quota_evictions_;
  stats.namespace_metadata_evictions = namespace_metadata_evictions_;
  stats.rejected_appends = rejected_appends_;
  stats.scores = compactor_.scores;
  stats.compaction_passes = compactor_.passes;
  stats.pool_compaction = compactor_.pool;
  stats.conflicting_appends = conflicting_appends_.load(std::memory_order_relaxed);
  stats.metadata_evictions = metadata_evictions_;
  stats.metadata_bytes = MetadataBytesLocked();
  stats.staged_bytes = staged_bytes_.load(std::memory_order_relaxed);
  stats.lease_tokens = leases_.tokens();
  stats.tiers = tier_;
  stats.tiers.moves_unlogged = tiers_->moves_unlogged();
  for (const std::shared_ptr<Tier>& level : lower_) stats.lower_stores.push_back(level->GetStats());
  if (!lower_.empty()) {
    stats.prefetch = tiers_->prefetch_stats();
    stats.fetch_reads = tiers_->fetch_read_stats();
  }
  if (device_ != nullptr) {
    stats.has_device = true;
    stats.device_store = device_->GetStats();
  }
  return stats;
}

}  // namespace kvcache
