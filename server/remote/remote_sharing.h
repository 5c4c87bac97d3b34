// RemoteSharing: a cache's blocks shared with every daemon of a deployment
// through a RemoteStore, using nothing but the cache's request contract.
//
//   Share     after an append stored blocks of a prompt (SharedTier::Stored
//             from a front door), queues them; a
//             thread of its own fetches them from the cache (pinned, as a
//             worker's fetch would), and puts each exact block (a lossy
//             form stays local) into the store under its RemoteKeyChain
//             key. Nothing waits for Redis but that thread.
//   Discover  the blocks of a prompt past the cache's own prefix that the
//             store holds, from the first one on until the first miss,
//             adopted into the cache by an append with each block's
//             checksum: the same checks as a worker's append, so a block
//             that does not match its checksum (or is the wrong size) is
//             not adopted, and nothing already cached changes.
//             A front door's short lookup (SharedTier::Missed) queues one
//             for a thread of its own (DiscoverLater).
//
// Why through the contract and not as a level of the cache: a level's copy
// is addressed by the block's chain key, which every daemon keys with its
// own secret, while the store's keys must be the same on every daemon and
// come from the tokens; and the store's view of what exists is a hint
// (Redis evicts on its own), so nothing in the index needs to track it.
// docs/scale-out.md.
//
// Thread-safe.
#ifndef KVCACHE_SERVER_REMOTE_REMOTE_SHARING_H_
#define KVCACHE_SERVER_REMOTE_REMOTE_SHARING_H_

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <span>
#include <thread>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "server/common/counter_visitor.h"
#include "server/common/mutex.h"
#include "server/core/cache.h"
#include "server/frontdoor/shared_tier.h"
#include "server/remote/remote_store.h"

namespace kvcache {

struct RemoteSharingOptions {
  uint32_t share_queue = 256;          // prompts waiting to be shared; past it, dropped (counted)
  uint32_t max_discover_blocks = 256;  // blocks one Discover asks the store for
  uint32_t discover_queue = 64;        // prompts waiting for DiscoverLater; past it, dropped
};

class RemoteSharing final : public SharedTier {
 public:
  struct Stats {
    uint64_t shares_queued = 0;
    uint64_t shares_dropped = 0;  // the queue was full
    uint64_t blocks_put = 0;      // handed to the store
    uint64_t blocks_skipped = 0;  // lossy, or evicted before the thread read them
    uint64_t discoveries = 0;     // Discovers that asked the store (some block not cached here)
    uint64_t discoveries_dropped = 0;  // DiscoverLater's queue was full
    uint64_t blocks_adopted = 0;
    uint64_t adoptions_failed = 0;  // the append refused them (logged)
    absl::Duration discover_time;   // spent in Discover, summed
  };

  // REQUIRES: `cache` and `store` outlive this. `shared`: the secret every
  // daemon of the deployment holds (the store keys' and the seals').
  RemoteSharing(Cache* cache, RemoteStore* store, const DaemonSecret& shared,
                const RemoteSharingOptions& options = {});
  ~RemoteSharing() override;  // the threads stop; prompts still queued are dropped
  RemoteSharing(const RemoteSharing&) = delete;
  RemoteSharing& operator=(const RemoteSharing&) = delete;

  // Queues the whole blocks of `tokens` of `model` from the one that holds
  // `first_token` on to be shared. False (counted) when the queue is full.
  bool Share(const ModelKey& model, std::vector<Token> tokens, uint64_t first_token);
  // Waits until every prompt queued before the call (to share or to
  // discover) was done or dropped, and the store wrote what it was given
  // (tests).
  void Flush();

  // Adopts what the store holds of `tokens` past the cached prefix (at most
  // max_discover_blocks blocks); returns the tokens adopted (0 when the store
  // has nothing, or is unreachable). NOT_FOUND for an unknown model; the
  // append's own errors when it refused the blocks (nothing changed).
  absl::StatusOr<uint64_t> Discover(const ModelKey& model, std::span<const Token> tokens);
  // Discover on a thread of its own, for a caller that must not wait on
  // Redis (a lookup's front door): a later lookup or fetch finds what it
  // adopted. Returns the ticket done once it ran, or null (counted) when its
  // queue (discover_queue) is full.
  std::shared_ptr<WorkTicket> DiscoverLater(const ModelKey& model, std::vector<Token> tokens);

  // SharedTier: Share, and DiscoverLater unless the match already covers the
  // prompt's whole blocks (of the model's block size when known here).
  void Stored(const ModelKey& model, std::span<const Token> tokens, uint64_t start_token) override;
  std::shared_ptr<WorkTicket> Missed(const ModelKey& model, std::span<const Token> tokens,
                                     uint64_t matched_tokens) override;

  Stats stats() const;
  // kvcached_remote_* samples of these and of the store's stats.
  void VisitCounters(CounterVisitor& visitor) const;
  static void VisitCounters(const Stats& sharing, const RemoteStore::Stats& store,
                            CounterVisitor& visitor);

 private:
  struct Job {
    ModelKey model;
    std::vector<Token> tokens;
    uint64_t first_token = 0;
    std::shared_ptr<WorkTicket> ticket;  // notified once it ran or was dropped; may be null
  };
  // A queue of jobs and the thread that runs them.
  struct Worker {
    std::deque<Job> queue;
    bool busy = false;
    std::thread thread;
  };
  void Loop(Worker* worker, void (RemoteSharing::*run)(const Job&));
  // Queues `job` for `worker`, counting it in `queued` (none: null) or, past
  // `limit`, in `dropped`.
  bool Queue(Worker* worker, Job job, uint32_t limit, uint64_t Stats::*queued,
             uint64_t Stats::*dropped);
  void ShareNow(const Job& job);
  void DiscoverNow(const Job& job);
  // Discover, untimed and uncounted; `*searched`: whether it asked the store
  // (not when every whole block is cached here).
  absl::StatusOr<uint64_t> Search(const ModelKey& model, std::span<const Token> tokens,
                                  bool* searched);
  // Remembers `model`'s block size, for Missed.
  void NoteLayout(const ModelKey& model, const ModelLayout& layout);

  Cache* const cache_;
  RemoteStore* const store_;
  const DaemonSecret shared_;
  const RemoteSharingOptions options_;

  mutable Mutex mu_;
  std::condition_variable_any changed_;
  Worker sharer_ ABSL_GUARDED_BY(mu_);  // its thread is set once, joined at the end
  Worker discoverer_ ABSL_GUARDED_BY(mu_);
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  Stats stats_ ABSL_GUARDED_BY(mu_);
  // The block size of each model seen here: a hint (a model registered again
  // with another layout is learnt again on its next share or discovery).
  absl::flat_hash_map<ModelKey, uint32_t> block_tokens_ ABSL_GUARDED_BY(mu_);
};

}  // namespace kvcache

#endif  // KVCACHE_SERVER_REMOTE_REMOTE_SHARING_H_
