// SharedTier: what the front doors tell a tier this daemon shares with the
// other daemons of a deployment (the remote tier, server/remote), so that
// neither front door depends on how it is built.
//
//   Stored  an append stored new blocks: the tier may share them.
//   Missed  a lookup found less of a prompt cached here than its whole
//           blocks: the tier may look for the rest and adopt it into the
//           cache, where a later lookup or fetch finds it.
//
// Neither may make its caller wait on the network: both queue work (bounded,
// dropping what does not fit) and return at once.
#ifndef KVCACHE_SERVER_FRONTDOOR_SHARED_TIER_H_
#define KVCACHE_SERVER_FRONTDOOR_SHARED_TIER_H_

#include <cstdint>
#include <memory>
#include <span>

#include "server/core/cache_types.h"
#include "server/core/tier_workers.h"

namespace kvcache {

class SharedTier {
 public:
  // Matched tokens a caller does not know (Missed before its lookup).
  static constexpr uint64_t kUnknownMatch = ~uint64_t{0};

  virtual ~SharedTier() = default;

  // An append of `tokens` of `model` from `start_token` on committed and
  // stored at least one new block.
  virtual void Stored(const ModelKey& model, std::span<const Token> tokens,
                      uint64_t start_token) = 0;

  // A lookup of `tokens` of `model` matched `matched_tokens` here (cached
  // lossy blocks included; kUnknownMatch: not looked up yet). Returns the
  // ticket of the search it queued, done once what it found is cached, or
  // null when it queued none (nothing past the match to look for, or its
  // queue is full).
  virtual std::shared_ptr<WorkTicket> Missed(const ModelKey& model, std::span<const Token> tokens,
                                             uint64_t matched_tokens) = 0;
};

}  // namespace kvcache

#endif  // KVCACHE_SERVER_FRONTDOOR_SHARED_TIER_H_
