// Compactor::CompactPool: host pool compaction, the cache's side of it.
//
// The pool decides which spans to drain and names their live chunks
// (SlabPool::PlanCompaction); the cache knows which block each chunk holds.
// Each block is a BlockMove (block_move.h): claimed under the lock, copied
// and verified outside it, swapped in under it only if it did not change
// meanwhile. Unlike the other moves it also moves blocks readers hold (their
// old chunk is freed when they let go); a block claimed for a rewrite
// (CacheAccess::Held::ClaimRewrite) is skipped, so a compression pass and
// this one never claim the same block.
#include <cstring>
#include <memory>
#include <utility>
#include <vector>

#include "server/core/block_move.h"
#include "server/core/compactor.h"

namespace kvcache {
namespace {

struct MoveJob {
  BlockMove move;
  BlockRef copy;         // null: not copied, or the copy did not verify
  bool corrupt = false;  // the stored bytes do not match their checksum
};

}  // namespace

PoolCompactionResult Compactor::CompactPool(const PoolCompactionOptions& options) const {
  PoolCompactionResult result;
  SlabPool& pool = access_.pool();
  absl::StatusOr<CompactionPlan> plan = pool.PlanCompaction(options.plan);
  {
    CacheAccess::Locked locked(access_);
    ++locked.compactor_counters().pool.passes;
  }
  if (!plan.ok() || plan->moves.empty()) return result;
  result.draining_spans = plan->spans;

  std::vector<MoveJob> jobs;  // destroyed after the lock: old payloads free there
  {
    CacheAccess::Locked locked(access_);
    locked.ForEachModel([&](const ModelState& m) {
      m.index.VisitPostOrder([&](IndexNode* n) {
        if (n->payload == nullptr || locked.Rewriting(*n) ||
            !plan->Contains(n->payload->allocation().data)) {
          return;
        }
        jobs.push_back({.move = locked.ClaimRewrite(*n)});
      });
    });
  }
  result.planned_blocks = jobs.size();

  // Outside the lock: copy into a chunk of a fuller span, and verify.
  for (MoveJob& job : jobs) {
    const BlockPayload& old = *job.move.host();
    absl::StatusOr<Allocation> target = pool.AllocateMoveTarget(old.allocation());
    if (!target.ok()) {
      result.out_of_targets = true;
      break;
    }
    StagingBlock copy(&pool, *target, old.size());
    std::memcpy(copy.data().data(), old.data().data(), old.size());
    // Install only a copy that matches the seal: a block whose stored bytes
    // fail their checksum is dropped below, never served.
    if (Checksum(copy.data()) != old.checksum()) {
      ++result.mismatched_blocks;
      job.corrupt = true;
      continue;  // the copy's chunk returns to the pool here
    }
    job.copy = std::move(copy).Seal(old.key(), old.seal());
  }

  if (options.on_copied) options.on_copied();
  std::vector<BlockRef> dropped;  // freed after the lock
  {
    CacheAccess::Locked locked(access_);
    for (MoveJob& job : jobs) {
      const BlockPayload& old = *job.move.host();
      IndexNode* node = locked.EndRewrite(job.move);
      if (job.corrupt && node != nullptr) {
        // As Compact() does: the block (and what hangs below it) leaves the
        // cache, counted in its model's corrupt_blocks.
        locked.DropCorrupt(job.move, BlockTier::kHost, "checksum", &dropped);
        continue;
      }
      if (job.copy == nullptr) continue;
      if (node == nullptr) {
        ++result.changed_blocks;
        continue;
      }
      locked.ReplaceHostCopy(node, std::move(job.copy));
      ++result.moved_blocks;
      result.moved_bytes += old.size();
    }
    PoolCompactionCounters& counters = locked.compactor_counters().pool;
    counters.moved_blocks += result.moved_blocks;
    counters.moved_bytes += result.moved_bytes;
    counters.changed_blocks += result.changed_blocks;
    counters.mismatched_blocks += result.mismatched_blocks;
  }
  return result;  // jobs go here: old payloads nothing else holds return to the pool
}

}  // namespace kvcache
