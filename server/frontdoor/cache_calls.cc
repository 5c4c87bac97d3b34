#include "server/frontdoor/cache_calls.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "server/frontdoor/call_scope.h"
#include "server/frontdoor/proto_convert.h"

namespace kvcache {

absl::Status RunLookup(Cache& cache, SharedTier* shared, const Caller& caller,
                       const v1::LookupRequest& request, v1::LookupResponse* response,
                       PrefetchWait wait) {
  auto key = ScopedModelKey(caller, request.namespace_(), request.model_id());
  if (!key.ok()) return key.status();
  LeaseRequest lease{.acquire = request.acquire_lease(),
                     .ttl = absl::Milliseconds(request.lease_ttl_ms())};
  if (request.prefetch_timeout_ms() > kMaxPrefetchTimeoutMs) {
    return absl::InvalidArgumentError(absl::StrCat("prefetch_timeout_ms is ",
                                                   request.prefetch_timeout_ms(), "; at most ",
                                                   kMaxPrefetchTimeoutMs));
  }
  const bool waits = request.prefetch() == v1::PREFETCH_WAIT;
  if (waits && wait == PrefetchWait::kBlock) {
    const absl::Time deadline =
        request.prefetch_timeout_ms() == 0
            ? absl::InfiniteFuture()
            : absl::Now() + absl::Milliseconds(request.prefetch_timeout_ms());
    cache.tiers().Prefetch(*key, TokensOf(request.tokens()), request.accept_lossy(),
                           PrefetchMode::kWait, absl::Milliseconds(request.prefetch_timeout_ms()));
    if (shared != nullptr) {
      std::shared_ptr<WorkTicket> ticket =
          shared->Missed(*key, TokensOf(request.tokens()), SharedTier::kUnknownMatch);
      if (ticket != nullptr) ticket->WaitFor(deadline - absl::Now());
    }
  }
  auto result = cache.Lookup(*key, TokensOf(request.tokens()), lease, request.accept_lossy());
  if (!result.ok()) return result.status();
  // A PREFETCH_WAIT lookup looked in the shared tier before (here, or in
  // StartWaitedPrefetches); any other looks now, for the next lookup.
  if (shared != nullptr && !waits &&
      result->matched_tokens + result->withheld_tokens <
          static_cast<uint64_t>(request.tokens_size())) {
    shared->Missed(*key, TokensOf(request.tokens()),
                   result->matched_tokens + result->withheld_tokens);
  }
  response->set_matched_tokens(result->matched_tokens);
  response->set_withheld_tokens(result->withheld_tokens);
  for (const BlockInfo& b : result->blocks) {
    v1::BlockDescriptor* d = response->add_blocks();
    d->set_index(b.index);
    d->set_key(b.key);
    d->set_checksum(b.checksum);
    d->set_bytes(b.bytes);
    if (b.tier == BlockTier::kLower) d->set_tier(b.lower_kind);
    if (b.lossy) {
      d->set_lossy(true);
      d->set_stored_bytes(b.stored_bytes);
      d->set_stored_checksum(b.stored_checksum);
    }
  }
  if (request.prefetch() == v1::PREFETCH_BEST_EFFORT &&
      std::any_of(result->blocks.begin(), result->blocks.end(),
                  [](const BlockInfo& b) { return b.tier == BlockTier::kLower; })) {
    cache.tiers().Prefetch(*key, TokensOf(request.tokens()), request.accept_lossy(),
                           PrefetchMode::kBestEffort, absl::ZeroDuration());
  }
  if (result->lease_id != 0) {
    response->set_lease_id(result->lease_id);
    response->set_lease_expires_unix_ms(absl::ToUnixMillis(result->lease_expires));
  }
  return absl::OkStatus();
}

absl::Status RunBatchLookup(Cache& cache, SharedTier* shared, const Caller& caller,
                            const v1::BatchLookupRequest& request,
                            v1::BatchLookupResponse* response, PrefetchWait wait) {
  if (request.lookups_size() > kMaxBatchLookups) {
    return absl::InvalidArgumentError(absl::StrCat("a batch holds ", request.lookups_size(),
                                                   " lookups; the limit is ", kMaxBatchLookups));
  }
  for (const v1::LookupRequest& lookup : request.lookups()) {
    v1::LookupOutcome* outcome = response->add_outcomes();
    absl::Status status =
        RunLookup(cache, shared, caller, lookup, outcome->mutable_response(), wait);
    if (!status.ok()) {
      outcome->clear_response();
      outcome->set_code(static_cast<int>(status.code()));
      outcome->set_message(std::string(status.message()));
    }
  }
  return absl::OkStatus();
}

StartedPrefetches StartWaitedPrefetches(Cache& cache, SharedTier* shared, const Caller& caller,
                                        std::span<const v1::LookupRequest* const> lookups) {
  StartedPrefetches started;
  bool unbounded = false;
  for (const v1::LookupRequest* lookup : lookups) {
    if (lookup->prefetch() != v1::PREFETCH_WAIT) continue;
    if (lookup->prefetch_timeout_ms() > kMaxPrefetchTimeoutMs) continue;
    auto key = ScopedModelKey(caller, lookup->namespace_(), lookup->model_id());
    if (!key.ok()) continue;
    std::shared_ptr<WorkTicket> ticket =
        cache.tiers().StartPrefetch(*key, TokensOf(lookup->tokens()), lookup->accept_lossy());
    std::shared_ptr<WorkTicket> searched =
        shared == nullptr
            ? nullptr
            : shared->Missed(*key, TokensOf(lookup->tokens()), SharedTier::kUnknownMatch);
    // Null: no lower tier, no shared one, or their queues are full: nothing to wait for.
    if (ticket == nullptr && searched == nullptr) continue;
    if (ticket != nullptr) started.tickets.push_back(std::move(ticket));
    if (searched != nullptr) started.tickets.push_back(std::move(searched));
    if (lookup->prefetch_timeout_ms() == 0) unbounded = true;
    started.timeout = std::max(started.timeout, absl::Milliseconds(lookup->prefetch_timeout_ms()));
  }
  if (unbounded) started.timeout = absl::ZeroDuration();
  return started;
}

absl::Status RunPlaceOnDevice(Cache& cache, const Caller& caller,
                              const v1::PlaceOnDeviceRequest& request,
                              v1::PlaceOnDeviceResponse* response) {
  auto key = ScopedModelKey(caller, request.namespace_(), request.model_id());
  if (!key.ok()) return key.status();
  auto placed = cache.tiers().PlaceOnDevice(*key, TokensOf(request.tokens()),
                                            absl::Milliseconds(request.lease_ttl_ms()));
  if (!placed.ok()) return placed.status();
  response->set_matched_tokens(placed->matched_tokens);
  response->set_unplaced_tokens(placed->unplaced_tokens);
  response->set_withheld_tokens(placed->withheld_tokens);
  response->set_copied_blocks(placed->copied_blocks);
  for (const DeviceBlock& b : placed->blocks) {
    v1::DeviceBlock* d = response->add_blocks();
    d->set_index(b.index);
    d->set_key(b.key);
    d->set_checksum(b.checksum);
    d->set_bytes(b.slot.bytes);
    d->set_arena(b.slot.arena);
    d->set_offset(b.slot.offset);
  }
  if (placed->lease_id != 0) {
    response->set_lease_id(placed->lease_id);
    response->set_lease_expires_unix_ms(absl::ToUnixMillis(placed->lease_expires));
  }
  return absl::OkStatus();
}

v1::AppendResponse ToProto(const AppendResult& result) {
  v1::AppendResponse response;
  response.set_stored_blocks(result.stored_blocks);
  response.set_deduplicated_blocks(result.deduplicated_blocks);
  response.set_stored_bytes(result.stored_bytes);
  response.set_cached_tokens(result.cached_tokens);
  response.set_conflicting_blocks(result.conflicting_blocks);
  response.set_first_conflicting_block(result.first_conflicting_block);
  response.set_restored_blocks(result.restored_blocks);
  response.set_pending_blocks(result.pending_blocks);
  return response;
}

}  // namespace kvcache
