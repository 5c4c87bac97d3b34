// The Cache's side of its tier moves: a block's copies changing level, the
// lower tier's eviction, reading lower blocks back for a fetch, promotion
// and prefetch. The migrator and demotion are TierManager's
// (tier_manager.h). See cache.h ("Tiers") and docs/tiers.md.
#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "server/core/block_move.h"
#include "server/core/cache.h"

namespace kvcache {
void Cache::DropHostCopyLocked(IndexNode* node, std::vector<BlockRef>* dropped) {
  policy_->Release(node);
  payload_bytes_ -= node->payload->size();
  dropped->push_back(std::move(node->payload));
  lower_policy_->Adopt(node);
  ++tier_.lower_only_blocks;
}

void Cache::SetHostCopyLocked(IndexNode* node, BlockRef payload) {
  lower_policy_->Release(node);
  payload_bytes_ += payload->size();
  node->payload = std::move(payload);
  policy_->Adopt(node);
  --tier_.lower_only_blocks;
}

void Cache::DropLowerCopyLocked(IndexNode* node) {
  if (node->lower == nullptr) return;
  --tier_.lower_blocks;
  tier_.lower_payload_bytes -= node->lower->seal().size;
  node->lower.reset();
}

bool Cache::EvictLowerOneLocked(std::vector<BlockRef>* dropped) {
  // A lower-only leaf that nothing pins (leases and reads in flight do).
  IndexNode* victim = lower_policy_->PickVictim(
      [](const IndexNode& n) { return n.is_leaf() && !n.lower->pins().pinned(); });
  if (victim == nullptr) return false;
  tiers_->LogMove(*victim, "ssd", "none", "capacity", victim->lower->seal().size);
  RemoveSubtreeLocked(*models_.OfIndex(victim->index), victim, dropped);
  ++tier_.lower_evictions;
  return true;
}

uint64_t Cache::CommittedHostBytes() const {
  const uint64_t allocated = pool_->GetStats().allocated_bytes;
  return allocated - std::min(allocated, staged_bytes_.load(std::memory_order_relaxed));
}

std::shared_ptr<WorkTicket> Cache::StartPrefetch(const ModelKey& model,
                                                 std::span<const Token> tokens, bool accept_lossy) {
  if (lower_ == nullptr) return nullptr;
  auto job = [this, model, tokens = std::vector<Token>(tokens.begin(), tokens.end()),
              accept_lossy] {
    // The plan is dropped at once: what matters is the promotion on the way.
    // Into pool memory only: a prefetch that cannot promote has nothing to
    // keep, so it reads nothing into the heap.
    (void)PlanFetch(model, tokens, accept_lossy, /*max_blocks=*/0, LoadFor::kPromotion);
  };
  return prefetcher_->Submit(std::move(job));
}

void Cache::CountLatePrefetch() { prefetcher_->CountLate(); }

bool Cache::Prefetch(const ModelKey& model, std::span<const Token> tokens, bool accept_lossy,
                     PrefetchMode mode, absl::Duration timeout) {
  if (lower_ == nullptr || mode == PrefetchMode::kNone) return true;
  std::shared_ptr<WorkTicket> ticket = StartPrefetch(model, tokens, accept_lossy);
  if (ticket == nullptr || mode == PrefetchMode::kBestEffort) return false;
  if (ticket->WaitFor(timeout == absl::ZeroDuration() ? absl::InfiniteDuration() : timeout)) {
    return true;
  }
  CountLatePrefetch();
  return false;
}

size_t Cache::LoadLowerBlocks(const PrefixIndex* index, std::vector<TieredBlock>& blocks,
                              LoadFor load_for) {
  // Read into pool memory (to promote) while the pool has room; else into
  // the heap, for this request only, up to max_fetch_heap_bytes (the plan
  // ends before the block that would pass it). A promotion may pass the high
  // watermark: the block was just asked for, and the migrator demotes colder
  // ones.
  const bool promote = options_.tiers.promote_on_fetch || load_for == LoadFor::kPromotion;
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
    if (load_for == LoadFor::kDevice && b.device != nullptr) continue;
    const uint64_t size = b.lower->seal().size;
    StagingBlock into;
    if (promote) {
      absl::StatusOr<Allocation> a = pool_->Allocate(size);
      if (a.ok()) into = StagingBlock(pool_.get(), *a, size);
    }
    if (into.empty()) {
      const bool over = heap_bytes + size > options_.max_fetch_heap_bytes && !reads.empty();
      if (load_for == LoadFor::kPromotion || over) {
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
  lower_->ReadBatch(std::span<StoredRead>(reads));
  const absl::Duration took = absl::Now() - start;

  size_t readable = limit;
  std::vector<BlockRef> dropped;  // freed after the lock
  WriteLock lock(this);
  if (limit < blocks.size() && load_for != LoadFor::kPromotion) ++tier_.heap_bounded_fetches;
  for (size_t k = 0; k < reads.size(); ++k) {
    TieredBlock& b = blocks[which[k]];
    IndexNode* node = moves[k].Refind(models_);
    const bool same = node != nullptr;
    if (!reads[k].status.ok()) {
      readable = std::min(readable, which[k]);
      if (absl::IsDataLoss(reads[k].status)) {
        // Never served: the block leaves the cache (with what hangs below it).
        ++tier_.checksum_failures;
        if (same) {
          tiers_->LogMove(*node, "ssd", "none", "checksum", b.lower->seal().size, took);
          ModelState& m = *models_.OfIndex(index);
          ++m.corrupt_blocks;
          RemoveSubtreeLocked(m, node, &dropped);
        }
      }
      continue;
    }
    // Read and verified against the seal it is now born with.
    b.host =
        PinnedBlock(std::move(staged[k]).Seal(b.lower->key(), b.lower->seal()), b.lower.reason());
    ++tier_.lower_reads;
    tier_.lower_read_bytes += b.host->size();
    if (pooled[k] && same) {
      tier_.promoted_bytes += b.host->size();
      ++tier_.promotions;
      tiers_->LogMove(*node, "ssd", "host", "fetch", b.host->size(), took);
      SetHostCopyLocked(node, b.host.ref());
    }
  }
  return readable;
}

}  // namespace kvcache
