// CacheInspector: the operator's view of a Cache (docs/operations.md). It
// reads the cache through CacheAccess, in walks that hold the cache's lock
// for bounded steps, so that requests go on while it looks; its results are
// the plain values of cache_inspection.h.
//
//   VerifyBlocks       reads stored copies back and checks each against its
//                      seal; with drop_bad, removes the bad ones
//   SnapshotMemory     blocks and bytes per model by tier and stored form,
//                      the pool's size classes, the live leases
//   InspectSequence    per token of a cached prefix: importance and its
//   InspectHottestPath inputs, protection, stored precision
//   TopPrefixes        cached sequences grouped by their first block
//
// Thread-safety: every method is thread-safe (the cache's lock orders them
// with requests); none holds the lock while it hashes or reads a tier.
#ifndef KVCACHE_SERVER_CORE_CACHE_INSPECTOR_H_
#define KVCACHE_SERVER_CORE_CACHE_INSPECTOR_H_

#include <cstdint>
#include <span>
#include <vector>

#include "absl/functional/function_ref.h"
#include "absl/status/statusor.h"
#include "server/core/cache_access.h"
#include "server/core/cache_inspection.h"

namespace kvcache {

class CacheInspector {
 public:
  // REQUIRES: `cache` outlives the inspector.
  explicit CacheInspector(Cache* cache) : access_(cache) {}

  // The registered models and their layouts, in the registry's order.
  std::vector<std::pair<ModelKey, ModelLayout>> ListModels() const;
  // Reads back the chosen copies and checks each; NOT_FOUND for an unknown
  // model, INVALID_ARGUMENT for a prefix without a model. Returns the totals
  // with every bad block found. Stops early (the result not done) when
  // on_progress returns false.
  absl::StatusOr<VerifyProgress> VerifyBlocks(const VerifyOptions& options) const;
  // At most `max_leases` leases are listed (the oldest); leases_total counts all.
  MemorySnapshot SnapshotMemory(size_t max_leases = 1000) const;
  // The cached prefix of `tokens`: NOT_FOUND for an unknown model; an empty
  // inspection (matched_tokens 0) when nothing is cached.
  absl::StatusOr<SequenceInspection> InspectSequence(const ModelKey& model,
                                                     std::span<const Token> tokens,
                                                     bool include_heads) const;
  // The same for the most used cached sequence that begins with the block of
  // chain key `first_block_key` (at each block, the child used most; a block's
  // uses count every use of the sequences below it).
  absl::StatusOr<SequenceInspection> InspectHottestPath(const ModelKey& model,
                                                        uint64_t first_block_key,
                                                        bool include_heads) const;
  // The `limit` first blocks used most, each with the totals of the cached
  // sequences below it (ties: the lower key first).
  std::vector<PrefixSummary> TopPrefixes(size_t limit) const;

 private:
  // Inspects the path `find_path` picks in the model's index (under the lock).
  absl::StatusOr<SequenceInspection> InspectPath(
      const ModelKey& model, bool include_heads,
      absl::FunctionRef<void(const ModelState&, std::vector<IndexNode*>*)> find_path) const;

  CacheAccess access_;
};

}  // namespace kvcache

#endif  // KVCACHE_SERVER_CORE_CACHE_INSPECTOR_H_
