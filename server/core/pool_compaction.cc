// Cache::CompactPool: host pool compaction, the cache's side of it.
//
// The pool decides which spans to drain and names their live chunks
// (SlabPool::PlanCompaction); the cache knows which block each chunk holds.
// A pass follows the pattern of Compact(): plan under the lock, copy and
// verify outside it, swap under it only what did not change meanwhile.
// Blocks being moved sit in compacting_, so a compression pass leaves them
// alone, and a block removed meanwhile leaves the set (ForgetNodeLocked).
#include <cstring>
#include <memory>
#include <utility>
#include <vector>

#include "server/core/cache.h"

namespace kvcache {
namespace {

struct MoveJob {
  IndexNode* node = nullptr;
  BlockRef old;
  BlockRef copy;         // null: not copied, or the copy did not verify
  bool corrupt = false;  // the stored bytes do not match their checksum
};

}  // namespace

PoolCompactionResult Cache::CompactPool(const PoolCompactionOptions& options) {
  PoolCompactionResult result;
  absl::StatusOr<CompactionPlan> plan = pool_->PlanCompaction(options.plan);
  {
    MutexLock lock(&mu_);
    ++pool_compaction_.passes;
  }
  if (!plan.ok() || plan->moves.empty()) return result;
  result.draining_spans = plan->spans;

  std::vector<MoveJob> jobs;  // destroyed after the lock: old payloads free there
  {
    MutexLock lock(&mu_);
    for (auto& [key, mp] : models_) {
      mp->index.VisitPostOrder([&](IndexNode* n) {
        mu_.AssertHeld();  // the lambda runs under the lock
        if (n->payload == nullptr || compacting_.contains(n) ||
            !plan->Contains(n->payload->allocation().data)) {
          return;
        }
        compacting_.insert(n);
        jobs.push_back({.node = n, .old = n->payload});
      });
    }
  }
  result.planned_blocks = jobs.size();

  // Outside the lock: copy into a chunk of a fuller span, and verify.
  for (MoveJob& job : jobs) {
    absl::StatusOr<Allocation> target = pool_->AllocateMoveTarget(job.old->allocation());
    if (!target.ok()) {
      result.out_of_targets = true;
      break;
    }
    auto copy = std::make_shared<BlockPayload>(pool_.get(), *target, job.old->size());
    std::memcpy(copy->mutable_data().data(), job.old->data().data(), job.old->size());
    // Install only a copy that matches the seal: a block whose stored bytes
    // fail their checksum is dropped below, never served.
    if (Checksum(copy->data()) != job.old->checksum()) {
      ++result.mismatched_blocks;
      job.corrupt = true;
      continue;  // the copy's chunk returns to the pool here
    }
    copy->SealAs(job.old->seal());
    job.copy = std::move(copy);
  }

  if (options.on_copied) options.on_copied();
  std::vector<BlockRef> dropped;  // freed after the lock
  {
    MutexLock lock(&mu_);
    for (MoveJob& job : jobs) {
      const bool alive = compacting_.erase(job.node) == 1;
      if (job.corrupt && alive && job.node->payload == job.old) {
        // As Compact() does: the block (and what hangs below it) leaves the
        // cache, counted in its model's corrupt_blocks.
        ModelState& m = *models_.OfIndex(job.node->index);
        ++m.corrupt_blocks;
        LogMoveLocked(*job.node, "host", "none", "checksum", job.old->size());
        RemoveSubtreeLocked(m, job.node, &dropped);
        continue;
      }
      if (job.copy == nullptr) continue;
      if (!alive || job.node->payload != job.old) {
        ++result.changed_blocks;
        continue;
      }
      job.node->payload = std::move(job.copy);
      ++result.moved_blocks;
      result.moved_bytes += job.old->size();
    }
    pool_compaction_.moved_blocks += result.moved_blocks;
    pool_compaction_.moved_bytes += result.moved_bytes;
    pool_compaction_.changed_blocks += result.changed_blocks;
    pool_compaction_.mismatched_blocks += result.mismatched_blocks;
  }
  return result;  // jobs go here: old payloads nothing else holds return to the pool
}

}  // namespace kvcache
