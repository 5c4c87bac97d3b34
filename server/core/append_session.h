// AppendSession: one append's stream of KV bytes into a Cache, from
// Cache::BeginAppend to Commit() (append_session.cc, which says what each
// step does under which lock).
#ifndef KVCACHE_SERVER_CORE_APPEND_SESSION_H_
#define KVCACHE_SERVER_CORE_APPEND_SESSION_H_

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <vector>

#include "absl/status/statusor.h"
#include "server/core/cache.h"

namespace kvcache {

// Receives one append's KV bytes and stores its new blocks on Commit().
// Bytes are copied and hashed outside the cache lock; every block is hashed,
// also one already cached, so that Commit() can tell when the cached copy
// holds other bytes (a conflict: reported, the cached copy kept) and can
// make a block stored lossy exact again from bytes that match its original
// checksum. Blocks another append in flight is storing are not stored twice
// (pending_blocks). Destroying a session without a successful Commit()
// stores nothing and frees what it allocated.
// Not thread-safe: one stream feeds one session.
class AppendSession {
 public:
  ~AppendSession();

  // Copies the next bytes of the KV stream. INVALID_ARGUMENT past the expected
  // total; DATA_LOSS when a completed block does not match its checksum;
  // RESOURCE_EXHAUSTED when no room can be made. After an error the session
  // is dead and Commit() returns that error.
  absl::Status Write(std::span<const std::byte> bytes);

  // INVALID_ARGUMENT when fewer bytes than expected arrived; ABORTED when the
  // prefix the append extends was explicitly evicted meanwhile.
  absl::StatusOr<AppendResult> Commit();

  uint64_t expected_bytes() const { return expected_bytes_; }
  uint64_t received_bytes() const { return received_bytes_; }

 private:
  friend class Cache;
  // What the session does with each block it receives.
  enum class BlockPlan : uint8_t {
    kStore,    // new: store it (this session holds the block's claim)
    kCached,   // cached raw: only hash it, to compare with the cached copy
    kRestore,  // cached lossy: store it, to replace the lossy copy if it matches
    kPending,  // another append in flight is storing it: only hash it
  };
  struct HashState;
  AppendSession(Cache* cache, ModelKey model, ModelLayout layout, std::vector<Token> tokens,
                uint64_t start_block, AppendHints hints, std::vector<uint64_t> checksums,
                std::vector<uint64_t> keys, BlockHashes hashes, std::vector<TieredBlock> pinned,
                std::vector<BlockPlan> plan, std::vector<uint32_t> novelty_layers);
  absl::Status Fail(absl::Status status);
  // The pinned flags of block `index` of the sequence; empty when none.
  // hints_.protected_ranges is sorted and disjoint.
  std::vector<uint8_t> PinnedFlags(uint64_t index) const;
  // Gives back the claims and the staged pool memory this session holds
  // (needs no lock of the cache's).
  void ReleaseClaimsAndStaging();
  // Whether Commit() would store nothing: every block cached or pending.
  bool StoresNothing() const;
  // Whether Commit() would only add blocks to the index: no pinned tokens
  // (`pins`, per block) to record, no lossy block to make exact.
  bool OnlyAddsBlocks(const std::vector<std::vector<uint8_t>>& pins) const;
  // Commit() of a session that only adds blocks, with the cache's lock
  // shared and the model's index_lock shared (stores nothing) or exclusive.
  // Nullopt, with nothing changed, when a block on the path has expired or
  // a cached block turned lossy meanwhile (the caller commits exclusively).
  // `expires` is the new blocks' expiry; the duplicates go to `unused` and
  // the stored blocks' pins to `storing`, for the caller to let go of
  // after the budgets are enforced.
  std::optional<absl::StatusOr<AppendResult>> CommitShared(absl::Time expires,
                                                           std::vector<BlockRef>* unused,
                                                           std::vector<PinnedBlock>* storing)
      ABSL_LOCKS_EXCLUDED(cache_->mu_);
  // Adds the session's blocks from block `from` on under `node` (the last
  // block of the path so far) to the model's index, with their hints and
  // token state (`pins`, per block: moved from; null: none), up to the first
  // block another append is storing; counts them in `result`, the model and
  // the cache. Returns the path's new last block. The new nodes are appended
  // to `path` (the matched path, `from` blocks long), their pins to
  // `storing`. REQUIRES: the cache's lock exclusively, or shared with
  // m.index_lock exclusively.
  IndexNode* AddNewBlocks(ModelState& m, IndexNode* node, uint64_t from, absl::Time expires,
                          std::vector<std::vector<uint8_t>>* pins, std::vector<IndexNode*>* path,
                          std::vector<PinnedBlock>* storing, AppendResult* result)
      ABSL_SHARED_LOCKS_REQUIRED(cache_->mu_);
  // The session's model, ABORTED when it was registered anew meanwhile.
  absl::StatusOr<ModelState*> FindModelOfSession() const ABSL_SHARED_LOCKS_REQUIRED(cache_->mu_);
  // ABORTED when a block the session found cached (or the prefix before
  // start_block_) is not among the `present` first blocks of the path now.
  absl::Status CheckStillCached(uint64_t present) const;
  // Counts block `i`, cached as `cached`, as deduplicated (and conflicting
  // when the bytes that arrived differ); true when they are the same.
  bool CountCached(uint64_t i, const BlockSeal& cached, AppendResult* result) const;
  // Commit() of a session that stores nothing, with the lock shared; `path`
  // is the cached path matched (and touched) under this hold.
  absl::StatusOr<AppendResult> CommitDeduplicated(ModelState& m,
                                                  const std::vector<IndexNode*>& path)
      ABSL_SHARED_LOCKS_REQUIRED(cache_->mu_);
  // Ends a successful Commit() ending its path at `node` (null: empty):
  // the model's counters, result->cached_tokens, the session spent.
  AppendResult Committed(ModelState& m, const IndexNode* node, AppendResult result)
      ABSL_SHARED_LOCKS_REQUIRED(cache_->mu_);

  Cache* const cache_;
  const ModelKey model_;
  const ModelLayout layout_;
  const std::vector<Token> tokens_;
  const uint64_t start_block_;
  const uint64_t num_blocks_;
  const AppendHints hints_;
  const std::vector<uint64_t> checksums_;
  const uint64_t block_bytes_;
  const uint64_t expected_bytes_;
  const std::vector<uint64_t> keys_;  // chain key of each new block (claims)
  const BlockHashes hashes_;          // lookup hashes of every whole block (the re-walk)
  // The model's incarnation when the session began: claims are keyed by it,
  // and a commit into another incarnation (the model registered anew, whose
  // state may even sit at the old one's address) aborts.
  uint64_t incarnation_ = 0;
  // References to the blocks that were cached when the session began (the
  // prefix and blocks to deduplicate): they cannot be evicted for space.
  std::vector<TieredBlock> pinned_;
  std::vector<BlockPlan> plan_;                 // per new block
  std::vector<StagingBlock> staging_;           // per new block: its bytes while they arrive
  std::vector<BlockRef> new_blocks_;            // per new block: the payload written, or null
  std::vector<uint64_t> digests_;               // per new block, once complete
  const std::vector<uint32_t> novelty_layers_;  // empty: novelty not computed here
  std::vector<std::vector<float>> novelty_;     // per new block, once complete
  std::unique_ptr<HashState> hash_;             // running checksum of the current block
  uint64_t staged_bytes_ = 0;  // pool memory of new_blocks_, counted as staged by the cache
  std::vector<bool> claimed_;  // per new block: this session holds its claim (empty: none)
  uint64_t received_bytes_ = 0;
  absl::Status status_;
};

}  // namespace kvcache

#endif  // KVCACHE_SERVER_CORE_APPEND_SESSION_H_
