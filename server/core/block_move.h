// BlockMove: the one "move a block" step of the cache. Every copy of a
// block's bytes that runs outside the cache lock goes through it: pool
// compaction (host -> host), compression (host -> host, re-encoded),
// demotion (host -> SSD, one lower level to the next), promotion (a lower
// level -> host) and GPU placement (host or a lower level -> GPU).
//
// A move has three steps:
//
//   // 1. Claim, under the lock: remember the block and take references to
//   //    the copies it has now.
//   BlockMove move = BlockMove::Claim(*node);
//   // 2. Copy, outside the lock: read move.host() or move.lower(), write
//   //    the new copy, verify it against move.seal().
//   // 3. Commit, under the lock: find the block again; install the new
//   //    copy only if it did not change meanwhile.
//   if (IndexNode* n = move.Refind(models)) { ... install ... }
//
// The claim's references keep the source alive while the copy runs (a
// payload returns to the pool, and an SSD extent is freed, only when its
// last reference drops), and they mark the block as claimed: the cache's
// pickers (eviction, demotion, compression, compaction) skip a copy
// anything but the index references, so two moves of one block do not
// overlap and no move's source is evicted under it.
//
// The claim keeps no pointer to the node: a node may be removed while the
// copy runs. Refind() finds it again by its lookup hash in its index, and
// only while the model that owns the index is registered.
//
// Not thread-safe: Claim and Refind run under the owning cache's lock; the
// copy step reads the claimed copies, which are immutable once sealed.
#ifndef KVCACHE_SERVER_CORE_BLOCK_MOVE_H_
#define KVCACHE_SERVER_CORE_BLOCK_MOVE_H_

#include <cstdint>

#include "server/core/block.h"
#include "server/core/model_registry.h"
#include "server/core/prefix_index.h"
#include "server/core/tier.h"
#include "server/core/tiered_block.h"

namespace kvcache {

class BlockMove {
 public:
  BlockMove() = default;

  // Claims `node`'s copies as they are now: its host copy and its top
  // lower copy, each possibly null (not both).
  static BlockMove Claim(const IndexNode& node, PinReason why = PinReason::kMove) {
    const int top = node.lower.top();
    return Claim(node, top == LowerCopies::kNone ? 0 : static_cast<size_t>(top), why);
  }
  // Claims `node`'s host copy and its copy at lower level `level` (either
  // possibly null, not both).
  static BlockMove Claim(const IndexNode& node, size_t level, PinReason why = PinReason::kMove) {
    BlockMove m;
    m.index_ = node.index;
    m.lookup_hash_ = node.lookup_hash;
    m.key_ = node.key;
    m.host_ = PinnedBlock(node.payload, why);
    m.lower_ = PinnedCopy(node.lower.at(level), why);
    m.lower_level_ = static_cast<uint8_t>(level);
    m.seal_ = node.seal();
    return m;
  }
  // Claims the copy a reader took (a lease's or a fetch's block): the host
  // copy, or the lower copy when it had none.
  static BlockMove Claim(const PrefixIndex* index, const TieredBlock& block,
                         PinReason why = PinReason::kMove) {
    BlockMove m;
    m.index_ = index;
    m.lookup_hash_ = block.lookup_hash;
    m.key_ = block.key;
    m.host_ = PinnedBlock(block.host.ref(), why);
    m.lower_ = PinnedCopy(block.host == nullptr ? block.lower.ref() : nullptr, why);
    m.lower_level_ = block.lower_level;
    m.seal_ = block.seal();
    return m;
  }

  // The node, if it still has exactly the copies claimed: the same host
  // copy and, when the claim was of a lower-only block, the same copy at the
  // claimed level and still no host copy. nullptr when it was removed, its model
  // unregistered, or its bytes were replaced, re-encoded, demoted or
  // promoted meanwhile: the move's copy must then be discarded.
  IndexNode* Refind(const ModelRegistry& models) const {
    IndexNode* n = Find(models);
    if (n == nullptr || !(host_ == n->payload)) return nullptr;
    if (host_ == nullptr && !(lower_ == n->lower.at(lower_level_))) return nullptr;
    return n;
  }
  // The node, if it still holds the claimed bytes (the same seal) in some
  // tier, uncompressed or as claimed: for a move that adds a copy next to
  // the others (GPU placement), which stays right when the block moved
  // between host and SSD meanwhile. nullptr otherwise.
  IndexNode* RefindSealed(const ModelRegistry& models) const {
    IndexNode* n = Find(models);
    if (n == nullptr) return nullptr;
    const BlockSeal now = n->seal();
    if (now.checksum != seal_.checksum || now.size != seal_.size ||
        now.compressed != seal_.compressed) {
      return nullptr;
    }
    return n;
  }

  bool claimed() const { return index_ != nullptr; }
  const PrefixIndex* index() const { return index_; }
  uint64_t key() const { return key_; }
  const PinnedBlock& host() const { return host_; }   // null: the block was lower-only
  const PinnedCopy& lower() const { return lower_; }  // the copy at lower_level(), or null
  size_t lower_level() const { return lower_level_; }
  const BlockSeal& seal() const { return seal_; }

  // Lets go of the claimed copies (the ones the index no longer holds are
  // freed here). Call it after the lock is released when that frees memory.
  void Release() { *this = BlockMove(); }

 private:
  IndexNode* Find(const ModelRegistry& models) const {
    if (index_ == nullptr || models.OfIndex(index_) == nullptr) return nullptr;
    return index_->FindByLookupHash(lookup_hash_);
  }

  const PrefixIndex* index_ = nullptr;
  uint64_t lookup_hash_ = 0;
  uint64_t key_ = 0;
  PinnedBlock host_;
  PinnedCopy lower_;
  uint8_t lower_level_ = 0;
  BlockSeal seal_;
};

}  // namespace kvcache

#endif  // KVCACHE_SERVER_CORE_BLOCK_MOVE_H_
