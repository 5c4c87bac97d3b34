// Cache: matching a prompt's cached prefix and the touches of the eviction
// policy that a match leaves, in both kinds of section: exclusive
// (WriteLock, MatchLocked, TouchLocked) and shared (MatchSharedLocked, whose
// touches go through the TouchBuffer, touch_buffer.h).
#include <algorithm>

#include "server/core/cache.h"

namespace kvcache {

Cache::WriteLock::WriteLock(const Cache* cache) ABSL_NO_THREAD_SAFETY_ANALYSIS : cache_(cache) {
  cache_->mu_.Lock();
  // A const method's exclusive section applies touches too: they change
  // only the policies and the nodes' recency, never what a reader sees.
  const_cast<Cache*>(cache_)->ApplyTouchesLocked();
}

Cache::WriteLock::~WriteLock() ABSL_NO_THREAD_SAFETY_ANALYSIS { cache_->mu_.Unlock(); }

void Cache::ApplyTouchesLocked() {
  if (touches_.empty()) return;
  touches_.Drain([this](IndexNode* node, absl::Time at) {
    mu_.AssertHeld();  // the lambda runs under the lock
    TouchLocked(node, at);
  });
}

void Cache::ApplyTouchShared(IndexNode* node, absl::Time at) const ABSL_NO_THREAD_SAFETY_ANALYSIS {
  // See the declaration. A node's copies change only under the exclusive
  // lock, so whether it is in host memory holds while mu_ is shared.
  if (node->payload == nullptr) {
    MutexLock lock(&lower_touches_);
    const_cast<Cache*>(this)->TouchLocked(node, at);
    return;
  }
  const_cast<Cache*>(this)->TouchLocked(node, at);
}

void Cache::TouchCommittedPath(const ModelState& state, std::span<IndexNode* const> path,
                               absl::Time at) {
  auto apply = [this](IndexNode* node, absl::Time when) {
    mu_.AssertReaderHeld();  // the lambda runs under the lock
    ApplyTouchShared(node, when);
  };
  // The path's touches, the new blocks' insertions among them (TouchLocked),
  // are a hit's: applied now or recorded, and in either case applied before
  // an exclusive section reads the order or removes a block, so no parent is
  // ever found colder than its new child and no block leaves the index
  // untracked. Only a path longer than a stripe waits for the turn.
  if (!touches_.Use(path, at, state.touch_turn, apply)) {
    TouchBuffer::InTurn(state.touch_turn, [&] {
      mu_.AssertReaderHeld();  // the lambda runs under the lock
      for (auto it = path.rbegin(); it != path.rend(); ++it) ApplyTouchShared(*it, at);
    });
  }
}

std::vector<IndexNode*>::iterator Cache::FirstExpired(std::vector<IndexNode*>& path,
                                                      absl::Time now) {
  return std::find_if(path.begin(), path.end(), [now](const IndexNode* n) {
    __builtin_prefetch(n->payload.get());  // callers read the seals next
    return n->expires <= now;
  });
}

void Cache::MatchLocked(ModelState& state, std::span<const Token> tokens, const BlockHashes& hashes,
                        std::vector<IndexNode*>* path, std::vector<BlockRef>* dropped) {
  state.index.Match(tokens, hashes, path);
  const absl::Time now = clock_->Now();
  auto expired = FirstExpired(*path, now);
  if (expired != path->end()) {
    RemoveSubtreeLocked(state, *expired, dropped);
    path->erase(expired, path->end());
  }
  // Leaf-first, so that a parent is never colder than its children.
  for (auto it = path->rbegin(); it != path->rend(); ++it) TouchLocked(*it, now);
}

bool Cache::MatchSharedLocked(const ModelState& state, std::span<const Token> tokens,
                              const BlockHashes& hashes, std::vector<IndexNode*>* path) const {
  state.index.Match(tokens, hashes, path);
  const absl::Time now = clock_->Now();
  const bool expired = FirstExpired(*path, now) != path->end();
  if (expired ||
      !touches_.Use(*path, now, state.touch_turn, [this](IndexNode* node, absl::Time at) {
        mu_.AssertReaderHeld();  // the lambda runs under the lock
        ApplyTouchShared(node, at);
      })) {
    path->clear();
    return false;
  }
  return true;
}

void Cache::TouchLocked(IndexNode* node, absl::Time now) {
  if (node->in_policy) {
    PolicyFor(*node)->Touch(node);
  } else {
    // A new block's first touch is its insertion (it is in host memory):
    // a commit that shares the lock leaves it to its path's touches, which
    // may be recorded and applied later, even after a reader's touch.
    node->index->host_policy()->Insert(node);
    node->in_policy = true;
  }
  // A touch recorded by a reader may be applied after a later one.
  node->last_access = std::max(node->last_access, now);
  if (node->references != UINT16_MAX) ++node->references;
}

}  // namespace kvcache
