// RemoteSharing: a cache's blocks shared with every daemon of a deployment
// through a RemoteStore, using nothing but the cache's request contract.
//
//   Share     after an append stored blocks of a prompt, queues them; a
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

#include "absl/status/statusor.h"
#include "server/common/mutex.h"
#include "server/core/cache.h"
#include "server/remote/remote_store.h"

namespace kvcache {

struct RemoteSharingOptions {
  uint32_t share_queue = 256;          // prompts waiting to be shared; past it, dropped (counted)
  uint32_t max_discover_blocks = 256;  // blocks one Discover asks the store for
  uint32_t discover_queue = 64;        // prompts waiting for DiscoverLater; past it, dropped
};

class RemoteSharing {
 public:
  struct Stats {
    uint64_t shares_queued = 0;
    uint64_t shares_dropped = 0;  // the queue was full
    uint64_t blocks_put = 0;      // handed to the store
    uint64_t blocks_skipped = 0;  // lossy, or evicted before the thread read them
    uint64_t discoveries = 0;
    uint64_t discoveries_dropped = 0;  // DiscoverLater's queue was full
    uint64_t blocks_adopted = 0;
    uint64_t adoptions_failed = 0;  // the append refused them (logged)
  };

  // REQUIRES: `cache` and `store` outlive this. `shared`: the secret every
  // daemon of the deployment holds (the store keys' and the seals').
  RemoteSharing(Cache* cache, RemoteStore* store, const DaemonSecret& shared,
                const RemoteSharingOptions& options = {});
  ~RemoteSharing();  // the thread stops; prompts still queued are dropped
  RemoteSharing(const RemoteSharing&) = delete;
  RemoteSharing& operator=(const RemoteSharing&) = delete;

  // Queues blocks [first_block, tokens.size() / block_tokens) of `tokens`
  // of `model` to be shared. False (counted) when the queue is full.
  bool Share(const ModelKey& model, std::vector<Token> tokens, uint64_t first_block);
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
  // adopted. False (counted) when its queue (discover_queue) is full.
  bool DiscoverLater(const ModelKey& model, std::vector<Token> tokens);

  Stats stats() const;

 private:
  struct Job {
    ModelKey model;
    std::vector<Token> tokens;
    uint64_t first_block = 0;
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
};

}  // namespace kvcache

#endif  // KVCACHE_SERVER_REMOTE_REMOTE_SHARING_H_
