// TierManager: the migrator, the lower tier's admission and the move log
// (tier_manager.h, docs/tiers.md).
#include "server/core/tier_manager.h"

#include <algorithm>
#include <utility>

#include "server/core/block_move.h"
#include "server/core/slab_pool.h"
#include "server/core/tier.h"

namespace kvcache {
namespace {

// Evictions from the lower tier one write may cause before it gives up
// (its size class may need several).
constexpr int kMaxLowerEvictionsPerWrite = 32;

}  // namespace

TierManager::TierManager(CacheAccess access, const TierOptions& options, bool log_moves)
    : access_(access),
      options_(options),
      log_moves_(log_moves),
      lower_writes_(options.lower_write_bytes_per_second) {
  if (access_.lower_levels() != 0) {
    prefetcher_ = std::make_unique<TierWorkers>(std::max(1u, options_.prefetch_threads),
                                                std::max(1u, options_.prefetch_queue));
    fetch_readers_ = std::make_unique<TierWorkers>(std::max(1u, options_.fetch_read_threads),
                                                   std::max(1u, options_.fetch_read_queue));
  }
}

TierManager::~TierManager() { StopWorkers(); }

void TierManager::StopWorkers() {
  prefetcher_.reset();
  fetch_readers_.reset();
}

// --- The move log ---------------------------------------------------------------

void TierManager::LogMove(const IndexNode& node, const char* from, const char* to,
                          const char* reason, uint64_t bytes, absl::Duration took) {
  if (!log_moves_) return;  // one level: nothing moves, nothing drains the log
  const absl::Time now = access_.Now();
  MutexLock lock(&mu_);
  if (pending_moves_.size() >= kMaxPendingMoves) {
    pending_moves_.erase(pending_moves_.begin(),
                         pending_moves_.begin() + static_cast<ptrdiff_t>(kMaxPendingMoves / 2));
    moves_unlogged_ += kMaxPendingMoves / 2;
  }
  pending_moves_.push_back({.when = now,
                            .key = node.key,
                            .from = from,
                            .to = to,
                            .reason = reason,
                            .bytes = bytes,
                            .took = took});
}

std::vector<MoveRecord> TierManager::DrainMoves() {
  std::vector<MoveRecord> out;
  MutexLock lock(&mu_);
  out.swap(pending_moves_);
  return out;
}

uint64_t TierManager::moves_unlogged() const {
  MutexLock lock(&mu_);
  return moves_unlogged_;
}

// --- Demotion -------------------------------------------------------------------

bool TierManager::Admit(const IndexNode& node, uint64_t bytes, absl::Time now) {
  if (node.references < options_.lower_admit_min_references) return false;
  MutexLock lock(&mu_);
  return lower_writes_.TryTake(bytes, now);
}

absl::StatusOr<StoredRef> TierManager::WriteLower(size_t level, uint64_t key,
                                                  const BlockPayload& payload) {
  Tier& lower = access_.lower_tier(level);
  for (int attempt = 0;; ++attempt) {
    absl::StatusOr<StoredRef> copy = lower.Write(key, payload);
    if (copy.ok() || !absl::IsResourceExhausted(copy.status()) ||
        attempt == kMaxLowerEvictionsPerWrite) {
      return copy;
    }
    // Room by demotion to the next level, when there is one and it takes a
    // block; else by dropping copies (or blocks) from this one.
    if (level + 1 < access_.lower_levels()) {
      uint64_t bytes = 0;
      if (DemoteLowerOne(level, &bytes) != DemoteOutcome::kNothing) continue;
    }
    std::vector<BlockRef> dropped;  // freed after the lock
    CacheAccess::Locked locked(access_);
    if (!locked.FreeLowerLevel(level, &dropped)) return copy;
  }
}

TierManager::DemoteOutcome TierManager::DemoteOne(uint64_t* bytes, bool* refused,
                                                  const char* reason) {
  *refused = false;
  BlockMove move;  // its claim keeps the victim from being picked (or compacted) twice
  {
    std::vector<BlockRef> dropped;  // freed after the lock
    CacheAccess::Locked locked(access_);
    locked.ExpireLeases();
    IndexNode* victim = locked.ColdestHostBlock();
    if (victim == nullptr) return DemoteOutcome::kNothing;
    LowerLevelCounters& counters = locked.tier_counters().lower[0];
    if (const int top = victim->lower.top(); top != LowerCopies::kNone) {
      // Clean: a lower level has it already.
      *bytes = victim->payload->size();
      LogMove(*victim, "host", access_.lower_name(static_cast<size_t>(top)), "clean", *bytes);
      locked.DropHostCopy(victim, &dropped);
      ++locked.tier_counters().lower[static_cast<size_t>(top)].clean_drops;
      return DemoteOutcome::kCleanDrop;
    }
    if (!Admit(*victim, victim->payload->size(), locked.Now())) {
      *refused = true;
      ++counters.admissions_refused;
      // Not worth an SSD write: evict it, or the host's coldest leaf when it
      // has children (they stay, below it).
      if (victim->is_leaf()) {
        LogMove(*victim, "host", "none", "not_admitted", victim->payload->size());
        locked.RemoveBlock(victim, &dropped);
      } else if (!locked.EvictHostLeaf(&dropped)) {
        return DemoteOutcome::kNothing;
      }
      ++counters.not_admitted_evictions;
      locked.CountCapacityEviction();
      return DemoteOutcome::kEvicted;
    }
    move = BlockMove::Claim(*victim);
  }
  // The write, outside the lock.
  const BlockPayload& payload = *move.host();
  const absl::Time start = absl::Now();
  absl::StatusOr<StoredRef> copy = WriteLower(0, move.key(), payload);
  const absl::Duration took = absl::Now() - start;

  std::vector<BlockRef> dropped;
  CacheAccess::Locked locked(access_);
  IndexNode* node = locked.Refind(move);
  if (node == nullptr || node->lower.at(0) != nullptr) return DemoteOutcome::kRaced;
  LowerLevelCounters& counters = locked.tier_counters().lower[0];
  if (!copy.ok()) {
    ++counters.write_failures;
    // The lower tier cannot take it: evict it instead, if it is still a
    // leaf nothing but this move pins.
    if (node->is_leaf() && node->payload->pins().only(PinReason::kMove, 1)) {
      LogMove(*node, "host", "none", "write_failed", payload.size(), took);
      locked.RemoveBlock(node, &dropped);
      ++counters.not_admitted_evictions;
      locked.CountCapacityEviction();
      return DemoteOutcome::kEvicted;
    }
    return DemoteOutcome::kRaced;
  }
  locked.AddLowerCopy(node, 0, *std::move(copy));
  ++counters.demotions;
  counters.demoted_bytes += payload.size();
  *bytes = payload.size();
  LogMove(*node, "host", access_.lower_name(0), reason, payload.size(), took);
  locked.DropHostCopy(node, &dropped);
  return DemoteOutcome::kDemoted;
}

TierManager::DemoteOutcome TierManager::DemoteLowerOne(size_t level, uint64_t* bytes) {
  const size_t next = level + 1;
  BlockMove move;
  {
    CacheAccess::Locked locked(access_);
    locked.ExpireLeases();
    IndexNode* victim = locked.ColdestLowerBlock(level);
    if (victim == nullptr) return DemoteOutcome::kNothing;
    const StoredRef& copy = victim->lower.at(level);
    *bytes = copy->seal().size;
    if (const int below = victim->lower.below(level); below != LowerCopies::kNone) {
      // Clean: a deeper level has it already.
      LogMove(*victim, access_.lower_name(level), access_.lower_name(static_cast<size_t>(below)),
              "clean", *bytes);
      ++locked.tier_counters().lower[static_cast<size_t>(below)].clean_drops;
      locked.DropLowerCopy(victim, level);
      return DemoteOutcome::kCleanDrop;
    }
    move = BlockMove::Claim(*victim, level);
  }
  // The read and the write, outside the lock. The read verifies the copy
  // against its seal, which the new copy is written under.
  const BlockSeal& seal = move.seal();
  const absl::Time start = absl::Now();
  StagingBlock staging = StagingBlock::OnHeap(seal.size);
  const absl::Status read = access_.lower_tier(level).Read(*move.lower(), staging.data());
  absl::StatusOr<StoredRef> copy =
      read.ok() ? WriteLower(next, move.key(), *std::move(staging).Seal(move.key(), seal))
                : absl::StatusOr<StoredRef>(read);
  const absl::Duration took = absl::Now() - start;

  std::vector<BlockRef> dropped;
  CacheAccess::Locked locked(access_);
  if (absl::IsDataLoss(read)) {  // never written anywhere: the copy goes
    ++locked.tier_counters().lower[level].checksum_failures;
    locked.DropCorrupt(move, BlockTier::kLower, "checksum", &dropped);
    return DemoteOutcome::kRaced;
  }
  IndexNode* node = locked.Refind(move);
  if (node == nullptr || node->lower.at(next) != nullptr) return DemoteOutcome::kRaced;
  LowerLevelCounters& counters = locked.tier_counters().lower[next];
  if (!copy.ok()) {
    ++counters.write_failures;
    return DemoteOutcome::kRaced;  // it stays where it is
  }
  locked.AddLowerCopy(node, next, *std::move(copy));
  ++counters.demotions;
  counters.demoted_bytes += seal.size;
  LogMove(*node, access_.lower_name(level), access_.lower_name(next), "pressure", seal.size, took);
  locked.DropLowerCopy(node, level);
  return DemoteOutcome::kDemoted;
}

// --- The migrator -----------------------------------------------------------------

bool TierManager::NeedsMigration() const {
  if (DeviceNeedsMigration() || HostNeedsMigration()) return true;
  for (size_t level = 0; level + 1 < access_.lower_levels(); ++level) {
    if (LowerNeedsMigration(level, options_.lower_high_watermark)) return true;
  }
  return false;
}

bool TierManager::LowerNeedsMigration(size_t level, double watermark) const {
  const TierStats stats = access_.lower_tier(level).GetStats();
  return static_cast<double>(stats.allocated_bytes) >
         watermark * static_cast<double>(stats.capacity_bytes);
}

bool TierManager::HostNeedsMigration() const {
  if (access_.lower_levels() == 0) return false;
  const double capacity = static_cast<double>(access_.pool().GetStats().capacity_bytes);
  return static_cast<double>(access_.CommittedHostBytes()) >
         options_.host_high_watermark * capacity;
}

Tier* TierManager::lower_tier() const {
  return access_.lower_levels() == 0 ? nullptr : &access_.lower_tier(0);
}

MigrationResult TierManager::Migrate() {
  MigrationResult result;
  if (DeviceNeedsMigration()) result.device_drops = MigrateDevice();
  // The deepest levels first: each makes room for what the one above sends.
  for (size_t level = access_.lower_levels(); level-- > 1;) MigrateLower(level - 1, &result);
  if (HostNeedsMigration()) MigrateHost(&result);
  CacheAccess::Locked locked(access_);
  ++locked.tier_counters().migrate_passes;
  return result;
}

void TierManager::MigrateLower(size_t level, MigrationResult* result) {
  if (!LowerNeedsMigration(level, options_.lower_high_watermark)) return;
  for (uint32_t i = 0; i < options_.max_demotions_per_pass &&
                       LowerNeedsMigration(level, options_.lower_low_watermark);
       ++i) {
    uint64_t bytes = 0;
    const DemoteOutcome outcome = DemoteLowerOne(level, &bytes);
    if (outcome == DemoteOutcome::kNothing) break;
    if (outcome == DemoteOutcome::kDemoted) {
      ++result->demoted_blocks;
      result->demoted_bytes += bytes;
    } else if (outcome == DemoteOutcome::kCleanDrop) {
      ++result->clean_drops;
    }
  }
}

void TierManager::MigrateHost(MigrationResult* result_out) {
  MigrationResult& result = *result_out;
  const uint64_t capacity = access_.pool().GetStats().capacity_bytes;
  uint64_t target =
      static_cast<uint64_t>(options_.host_low_watermark * static_cast<double>(capacity));
  target = std::min(target, capacity - std::min(capacity, access_.options().append_staging_bytes));
  for (uint32_t i = 0; i < options_.max_demotions_per_pass && access_.CommittedHostBytes() > target;
       ++i) {
    uint64_t bytes = 0;
    bool refused = false;
    const DemoteOutcome outcome = DemoteOne(&bytes, &refused, "pressure");
    if (outcome == DemoteOutcome::kNothing) break;
    switch (outcome) {
      case DemoteOutcome::kDemoted:
        ++result.demoted_blocks;
        result.demoted_bytes += bytes;
        break;
      case DemoteOutcome::kCleanDrop:
        ++result.clean_drops;
        break;
      case DemoteOutcome::kEvicted:
        ++result.evicted_blocks;
        if (refused) ++result.refused_blocks;
        break;
      default:
        break;
    }
  }
}

// --- Read-back and prefetch -------------------------------------------------------

size_t TierManager::ReadBack(const PrefixIndex* index, std::vector<TieredBlock>& blocks,
                             ReadFor read_for) {
  // Read into pool memory (to promote) while the pool has room; else into
  // the heap, for this request only, up to max_fetch_heap_bytes (the plan
  // ends before the block that would pass it). A promotion may pass the high
  // watermark: the block was just asked for, and the migrator demotes colder
  // ones.
  SlabPool& pool = access_.pool();
  const uint64_t max_heap_bytes = access_.options().max_fetch_heap_bytes;
  const bool promote = options_.promote_on_fetch || read_for == ReadFor::kPromotion;
  std::vector<StoredRead> reads;
  std::vector<size_t> which;
  std::vector<bool> pooled;
  std::vector<BlockMove> moves;      // lower -> host, committed below
  std::vector<StagingBlock> staged;  // what each read lands in
  uint64_t heap_bytes = 0;
  size_t limit = blocks.size();  // blocks past it are not read
  for (size_t i = 0; i < limit; ++i) {
    TieredBlock& b = blocks[i];
    if (b.host != nullptr) continue;
    // A block a placement holds on the device needs no read-back to be
    // placed; a fetch serves host bytes, so it reads it all the same.
    if (read_for == ReadFor::kDevice && b.device != nullptr) continue;
    const uint64_t size = b.lower->seal().size;
    StagingBlock into;
    if (promote) {
      absl::StatusOr<Allocation> a = pool.Allocate(size);
      if (a.ok()) into = StagingBlock(&pool, *a, size);
    }
    if (into.empty()) {
      const bool over = heap_bytes + size > max_heap_bytes && !reads.empty();
      if (read_for == ReadFor::kPromotion || over) {
        limit = i;
        break;
      }
      heap_bytes += size;
      into = StagingBlock::OnHeap(size);
      pooled.push_back(false);
    } else {
      pooled.push_back(true);
    }
    moves.push_back(BlockMove::Claim(index, b));
    reads.push_back({.copy = b.lower.get(), .out = into.data()});
    which.push_back(i);
    staged.push_back(std::move(into));
  }
  const absl::Time start = absl::Now();
  ReadEachLevel(blocks, which, reads);
  const absl::Duration took = absl::Now() - start;

  size_t readable = limit;
  std::vector<BlockRef> dropped;  // freed after the lock
  CacheAccess::Locked locked(access_);
  if (limit < blocks.size() && read_for != ReadFor::kPromotion) {
    ++locked.tier_counters().heap_bounded_fetches;
  }
  for (size_t k = 0; k < reads.size(); ++k) {
    TieredBlock& b = blocks[which[k]];
    LowerLevelCounters& counters = locked.tier_counters().lower[b.lower_level];
    if (!reads[k].status.ok()) {
      readable = std::min(readable, which[k]);
      // Never served: the copy goes (with the blocks below it when it was
      // the block's last).
      if (absl::IsDataLoss(reads[k].status)) {
        ++counters.checksum_failures;
        locked.DropCorrupt(moves[k], BlockTier::kLower, "checksum", &dropped);
      }
      continue;
    }
    // Read and verified against the seal it is now born with.
    b.host =
        PinnedBlock(std::move(staged[k]).Seal(b.lower->key(), b.lower->seal()), b.lower.reason());
    ++counters.reads;
    counters.read_bytes += b.host->size();
    if (IndexNode* node = locked.Refind(moves[k]); pooled[k] && node != nullptr) {
      counters.promoted_bytes += b.host->size();
      ++counters.promotions;
      LogMove(*node, access_.lower_name(b.lower_level), "host", "fetch", b.host->size(), took);
      locked.SetHostCopy(node, b.host.ref());
    }
  }
  return readable;
}

void TierManager::ReadEachLevel(const std::vector<TieredBlock>& blocks,
                                const std::vector<size_t>& which, std::vector<StoredRead>& reads) {
  for (size_t level = 0; level < access_.lower_levels(); ++level) {
    std::vector<StoredRead> batch;
    std::vector<size_t> of;  // each one's place in `reads`
    for (size_t k = 0; k < reads.size(); ++k) {
      if (blocks[which[k]].lower_level != level) continue;
      batch.push_back(reads[k]);
      of.push_back(k);
    }
    if (batch.empty()) continue;
    access_.lower_tier(level).ReadBatch(std::span<StoredRead>(batch));
    for (size_t j = 0; j < batch.size(); ++j) reads[of[j]].status = std::move(batch[j].status);
  }
}

std::shared_ptr<WorkTicket> TierManager::StartPrefetch(const ModelKey& model,
                                                       std::span<const Token> tokens,
                                                       bool accept_lossy) {
  if (prefetcher_ == nullptr) return nullptr;
  auto job = [this, model, tokens = std::vector<Token>(tokens.begin(), tokens.end()),
              accept_lossy] {
    // The plan is dropped at once: what matters is the promotion on the way.
    // Into pool memory only: a prefetch that cannot promote has nothing to
    // keep, so it reads nothing into the heap.
    (void)access_.PlanPromotion(model, tokens, accept_lossy);
  };
  return prefetcher_->Submit(std::move(job));
}

void TierManager::CountLatePrefetch() {
  if (prefetcher_ != nullptr) prefetcher_->CountLate();
}

bool TierManager::Prefetch(const ModelKey& model, std::span<const Token> tokens, bool accept_lossy,
                           PrefetchMode mode, absl::Duration timeout) {
  if (prefetcher_ == nullptr || mode == PrefetchMode::kNone) return true;
  std::shared_ptr<WorkTicket> ticket = StartPrefetch(model, tokens, accept_lossy);
  if (ticket == nullptr || mode == PrefetchMode::kBestEffort) return false;
  if (ticket->WaitFor(timeout == absl::ZeroDuration() ? absl::InfiniteDuration() : timeout)) {
    return true;
  }
  CountLatePrefetch();
  return false;
}

void TierManager::RunRead(TierWorkers::Job run, TierWorkers::Job drop) {
  if (fetch_readers_ == nullptr || fetch_readers_->TrySubmit(run, drop) == nullptr) {
    std::move(run)();
  }
}

WorkStats TierManager::prefetch_stats() const {
  return prefetcher_ != nullptr ? prefetcher_->GetStats() : WorkStats{};
}

WorkStats TierManager::fetch_read_stats() const {
  return fetch_readers_ != nullptr ? fetch_readers_->GetStats() : WorkStats{};
}

}  // namespace kvcache
