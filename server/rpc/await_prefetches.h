// AwaitPrefetches: answers a call once its prefetches are done, or at its
// deadline, without holding a thread meanwhile.
//
// A gRPC callback thread must never block; a PREFETCH_WAIT lookup used to
// wait for its read-back on one (up to 60 s per lookup, 4096 lookups per
// batch), starving every other call. Now the reactor starts the prefetches,
// hands its answer to AwaitPrefetches and returns at once.
#ifndef KVCACHE_SERVER_RPC_AWAIT_PREFETCHES_H_
#define KVCACHE_SERVER_RPC_AWAIT_PREFETCHES_H_

#include <functional>
#include <memory>
#include <vector>

#include "absl/time/time.h"
#include "server/core/tier_workers.h"
#include "server/rpc/deadline_timer.h"

namespace kvcache {

// Calls `answer` exactly once: with true when every ticket is done (at once,
// on this thread, when none is pending), or with false when `timeout` passes
// first (zero: no deadline). It runs on the thread that finished the last
// ticket, on `timer`'s thread, or on this one; it must not block.
// REQUIRES: `timer` outlives every pending answer (its destruction answers
// them all).
void AwaitPrefetches(DeadlineTimer& timer, std::vector<std::shared_ptr<WorkTicket>> tickets,
                     absl::Duration timeout, std::function<void(bool in_time)> answer);

}  // namespace kvcache

#endif  // KVCACHE_SERVER_RPC_AWAIT_PREFETCHES_H_
