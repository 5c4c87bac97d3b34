// CacheService (cache_service.h): admission of unary calls and the unary
// handlers (RegisterModel, Lookup, BatchLookup, ReleaseLease, PlaceOnDevice,
// GetDeviceArenas, Evict, ReportAttention). The Append and Fetch stream
// reactors are in cache_service_append.cc and cache_service_fetch.cc.
#include "server/rpc/cache_service.h"

#include <algorithm>
#include <functional>
#include <memory>
#include <span>
#include <utility>
#include <vector>

#include "absl/time/clock.h"
#include "server/frontdoor/cache_calls.h"
#include "server/frontdoor/call_scope.h"
#include "server/frontdoor/proto_convert.h"
#include "server/rpc/await_prefetches.h"
#include "server/rpc/call_auth.h"
#include "server/rpc/grpc_call.h"

namespace kvcache {

CacheService::CacheService(const CacheServiceOptions& options, Cache* cache, RpcObserver* observer)
    : options_(options),
      cache_(cache),
      observer_(observer),
      streams_(options.max_concurrent_streams, options.max_streams_per_client),
      unary_(options.max_concurrent_unary),
      watchdog_(options.stream_idle_timeout, options.clock) {}

absl::Status CacheService::RunLimited(grpc::CallbackServerContext& ctx, std::string_view method,
                                      absl::FunctionRef<absl::Status(const Caller&)> body) {
  if (absl::Status admitted = unary_.Acquire(); !admitted.ok()) {
    observer_->OnLimitReached(method, "max_concurrent_unary");
    return admitted;
  }
  absl::Status status = [&]() -> absl::Status {
    absl::StatusOr<Caller> caller = AdmitCall(options_.access, ctx, method);
    if (!caller.ok()) return caller.status();
    absl::StatusOr<TenantStreamSlot> slot = OpenTenantUnary(*caller, method);
    if (!slot.ok()) return slot.status();
    return body(*caller);
  }();
  unary_.Release();
  return status;
}

absl::StatusOr<TenantStreamSlot> CacheService::OpenTenantUnary(const Caller& caller,
                                                               std::string_view method) {
  if (options_.access == nullptr) return TenantStreamSlot();
  absl::StatusOr<TenantStreamSlot> slot = options_.access->OpenUnaryCall(caller);
  if (!slot.ok()) observer_->OnLimitReached(method, "tenant share of max_concurrent_unary");
  return slot;
}

grpc::ServerUnaryReactor* CacheService::FinishUnary(grpc::CallbackServerContext* ctx,
                                                    std::string_view method, absl::Time start,
                                                    const absl::Status& status,
                                                    const ModelRef& model) {
  grpc::ServerUnaryReactor* reactor = ctx->DefaultReactor();
  FinishUnaryCall(ctx, reactor, observer_, method, start, status, model);
  return reactor;
}

grpc::ServerUnaryReactor* CacheService::RegisterModel(grpc::CallbackServerContext* ctx,
                                                      const v1::RegisterModelRequest* request,
                                                      v1::RegisterModelResponse* response) {
  const absl::Time start = absl::Now();
  absl::Status status = [&]() -> absl::Status {
    absl::StatusOr<Caller> caller = AdmitCall(options_.access, *ctx, "RegisterModel");
    if (!caller.ok()) return caller.status();
    auto key = ScopedModelKey(*caller, request->namespace_(), request->model_id());
    if (!key.ok()) return key.status();
    auto layout = FromProto(request->layout());
    if (!layout.ok()) return layout.status();
    auto result = cache_->RegisterModel(*key, *layout);
    if (!result.ok()) return result.status();
    response->set_created(result->created);
    *response->mutable_layout() = ToProto(result->layout);
    response->set_block_bytes(result->layout.BlockBytes());
    return absl::OkStatus();
  }();
  return FinishUnary(ctx, "RegisterModel", start, status,
                     {request->namespace_(), request->model_id()});
}

grpc::ServerUnaryReactor* CacheService::Lookup(grpc::CallbackServerContext* ctx,
                                               const v1::LookupRequest* request,
                                               v1::LookupResponse* response) {
  const absl::Time start = absl::Now();
  const ModelRef model{request->namespace_(), request->model_id()};
  if (request->prefetch() == v1::PREFETCH_WAIT && MayPrefetch()) {
    const v1::LookupRequest* const lookups[] = {request};
    return AnswerAfterPrefetches(ctx, "Lookup", start, model, lookups,
                                 [this, request, response](const Caller& caller) {
                                   return RunLookup(*cache_, options_.shared, caller, *request,
                                                    response, PrefetchWait::kStarted);
                                 });
  }
  absl::Status status = RunLimited(*ctx, "Lookup", [&](const Caller& caller) -> absl::Status {
    return RunLookup(*cache_, options_.shared, caller, *request, response, PrefetchWait::kStarted);
  });
  return FinishUnary(ctx, "Lookup", start, status, model);
}

grpc::ServerUnaryReactor* CacheService::BatchLookup(grpc::CallbackServerContext* ctx,
                                                    const v1::BatchLookupRequest* request,
                                                    v1::BatchLookupResponse* response) {
  const absl::Time start = absl::Now();
  const bool waits =
      std::any_of(request->lookups().begin(), request->lookups().end(),
                  [](const v1::LookupRequest& l) { return l.prefetch() == v1::PREFETCH_WAIT; });
  if (waits && MayPrefetch() && request->lookups_size() <= kMaxBatchLookups) {
    std::vector<const v1::LookupRequest*> lookups;
    lookups.reserve(request->lookups_size());
    for (const v1::LookupRequest& l : request->lookups()) lookups.push_back(&l);
    return AnswerAfterPrefetches(ctx, "BatchLookup", start, {}, lookups,
                                 [this, request, response](const Caller& caller) {
                                   return RunBatchLookup(*cache_, options_.shared, caller, *request,
                                                         response, PrefetchWait::kStarted);
                                 });
  }
  absl::Status status = RunLimited(*ctx, "BatchLookup", [&](const Caller& caller) -> absl::Status {
    return RunBatchLookup(*cache_, options_.shared, caller, *request, response,
                          PrefetchWait::kStarted);
  });
  return FinishUnary(ctx, "BatchLookup", start, status);
}

grpc::ServerUnaryReactor* CacheService::AnswerAfterPrefetches(
    grpc::CallbackServerContext* ctx, std::string_view method, absl::Time start,
    const ModelRef& model, std::span<const v1::LookupRequest* const> lookups,
    std::function<absl::Status(const Caller&)> answer) {
  // The call keeps its max_concurrent_unary slot until it is answered, but
  // no thread: the answer runs where the last prefetch finishes, or on the
  // timer's thread at the deadline.
  if (absl::Status admitted = unary_.Acquire(); !admitted.ok()) {
    observer_->OnLimitReached(method, "max_concurrent_unary");
    return FinishUnary(ctx, method, start, admitted, model);
  }
  absl::StatusOr<Caller> caller = AdmitCall(options_.access, *ctx, method);
  if (!caller.ok()) {
    unary_.Release();
    return FinishUnary(ctx, method, start, caller.status(), model);
  }
  // The tenant's slot is held, as the call's, until it is answered.
  absl::StatusOr<TenantStreamSlot> tenant_slot = OpenTenantUnary(*caller, method);
  if (!tenant_slot.ok()) {
    unary_.Release();
    return FinishUnary(ctx, method, start, tenant_slot.status(), model);
  }
  auto held = std::make_shared<TenantStreamSlot>(*std::move(tenant_slot));
  StartedPrefetches started = StartWaitedPrefetches(*cache_, options_.shared, *caller, lookups);
  grpc::ServerUnaryReactor* reactor = ctx->DefaultReactor();
  // The model's strings live in the request, which outlives the reactor's Finish.
  AwaitPrefetches(prefetch_timer_, std::move(started.tickets), started.timeout,
                  [this, ctx, reactor, method, start, model, caller = *std::move(caller),
                   held = std::move(held), answer = std::move(answer)](bool in_time) {
                    if (!in_time) cache_->tiers().CountLatePrefetch();
                    const absl::Status status = answer(caller);
                    *held = TenantStreamSlot();
                    unary_.Release();
                    FinishUnaryCall(ctx, reactor, observer_, method, start, status, model);
                  });
  return reactor;
}

grpc::ServerUnaryReactor* CacheService::ReleaseLease(grpc::CallbackServerContext* ctx,
                                                     const v1::ReleaseLeaseRequest* request,
                                                     v1::ReleaseLeaseResponse* response) {
  const absl::Time start = absl::Now();
  absl::StatusOr<Caller> caller = AdmitCall(options_.access, *ctx, "ReleaseLease");
  if (!caller.ok()) return FinishUnary(ctx, "ReleaseLease", start, caller.status());
  // Another tenant's lease reads as unknown: it is neither released nor
  // confirmed to exist.
  response->set_released(cache_->ReleaseLease(
      request->lease_id(), [&](const ModelKey& model) { return caller->MaySee(model.ns); }));
  return FinishUnary(ctx, "ReleaseLease", start, absl::OkStatus());
}

grpc::ServerUnaryReactor* CacheService::PlaceOnDevice(grpc::CallbackServerContext* ctx,
                                                      const v1::PlaceOnDeviceRequest* request,
                                                      v1::PlaceOnDeviceResponse* response) {
  const absl::Time start = absl::Now();
  absl::Status status =
      RunLimited(*ctx, "PlaceOnDevice", [&](const Caller& caller) -> absl::Status {
        return RunPlaceOnDevice(*cache_, caller, *request, response);
      });
  return FinishUnary(ctx, "PlaceOnDevice", start, status,
                     {request->namespace_(), request->model_id()});
}

grpc::ServerUnaryReactor* CacheService::GetDeviceArenas(grpc::CallbackServerContext* ctx,
                                                        const v1::GetDeviceArenasRequest*,
                                                        v1::GetDeviceArenasResponse* response) {
  const absl::Time start = absl::Now();
  absl::StatusOr<Caller> caller = AdmitCall(options_.access, *ctx, "GetDeviceArenas");
  if (!caller.ok()) return FinishUnary(ctx, "GetDeviceArenas", start, caller.status());
  if (DeviceTier* device = cache_->tiers().device_tier(); device != nullptr) {
    response->set_device_kind(std::string(device->device_kind()));
    for (const DeviceArena& a : device->Arenas()) {
      v1::DeviceArena* out = response->add_arenas();
      out->set_arena(a.arena);
      out->set_bytes(a.bytes);
      out->set_ipc_handle(a.ipc_handle);
    }
  }
  return FinishUnary(ctx, "GetDeviceArenas", start, absl::OkStatus());
}

grpc::ServerUnaryReactor* CacheService::Evict(grpc::CallbackServerContext* ctx,
                                              const v1::EvictRequest* request,
                                              v1::EvictResponse* response) {
  const absl::Time start = absl::Now();
  absl::Status status = RunLimited(*ctx, "Evict", [&](const Caller& caller) -> absl::Status {
    auto key = ScopedModelKey(caller, request->namespace_(), request->model_id());
    if (!key.ok()) return key.status();
    absl::StatusOr<EvictResult> result;
    switch (request->target_case()) {
      case v1::EvictRequest::kPrefix:
        result = cache_->EvictPrefix(*key, TokensOf(request->prefix().tokens()));
        break;
      case v1::EvictRequest::kWholeModel:
        if (!request->whole_model()) {
          return absl::InvalidArgumentError("whole_model must be true when it is the target");
        }
        result = cache_->EvictModel(*key);
        break;
      default:
        return absl::InvalidArgumentError("target must be set: prefix or whole_model");
    }
    if (!result.ok()) return result.status();
    response->set_evicted_blocks(result->evicted_blocks);
    response->set_evicted_bytes(result->evicted_bytes);
    return absl::OkStatus();
  });
  return FinishUnary(ctx, "Evict", start, status, {request->namespace_(), request->model_id()});
}

grpc::ServerUnaryReactor* CacheService::ReportAttention(grpc::CallbackServerContext* ctx,
                                                        const v1::ReportAttentionRequest* request,
                                                        v1::ReportAttentionResponse* response) {
  const absl::Time start = absl::Now();
  absl::Status status =
      RunLimited(*ctx, "ReportAttention", [&](const Caller& caller) -> absl::Status {
        auto key = ScopedModelKey(caller, request->namespace_(), request->model_id());
        if (!key.ok()) return key.status();
        if (request->lease_id() != 0 && !request->tokens().empty()) {
          return absl::InvalidArgumentError("set either tokens or lease_id, not both");
        }
        absl::StatusOr<ReportResult> result = cache_->ReportAttention(
            *key, TokensOf(request->tokens()), request->lease_id(),
            std::span<const float>(request->attention().data(), request->attention().size()),
            request->num_layers());
        if (!result.ok()) return result.status();
        response->set_matched_tokens(result->matched_tokens);
        response->set_updated_tokens(result->updated_tokens);
        return absl::OkStatus();
      });
  return FinishUnary(ctx, "ReportAttention", start, status,
                     {request->namespace_(), request->model_id()});
}

}  // namespace kvcache
