#include "server/rpc/cache_service.h"

#include <grpc/grpc.h>

#include <algorithm>
#include <atomic>
#include <functional>
#include <memory>
#include <thread>
#include <utility>
#include <vector>

#include "absl/container/inlined_vector.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "server/common/mutex.h"
#include "server/core/fetch_block.h"
#include "server/frontdoor/cache_calls.h"
#include "server/frontdoor/call_scope.h"
#include "server/frontdoor/proto_convert.h"
#include "server/rpc/append_decoder.h"
#include "server/rpc/await_prefetches.h"
#include "server/rpc/call_auth.h"
#include "server/rpc/grpc_call.h"
#include "server/rpc/status_convert.h"

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

// What an Append or Fetch reactor shares: its stream slot and its watch for
// idleness. The watchdog cancels an idle call from its own thread, with a
// status naming the setting; the reactor then sees its read or write fail
// and finishes as usual, reporting DEADLINE_EXCEEDED.
class StreamLifecycle {
 public:
  StreamLifecycle(CacheService* service, grpc::CallbackServerContext* ctx, std::string_view method,
                  std::string_view stalled)
      : service_(service), ctx_(ctx), method_(method), stalled_(stalled) {}

  // Takes a stream slot and starts the idle timer; RESOURCE_EXHAUSTED when
  // a stream limit is reached. `release`, when set, runs on the watchdog
  // thread as an idle stream is cancelled, to free what the reactor holds.
  absl::Status Begin(std::function<void()> release = nullptr) {
    release_ = std::move(release);
    peer_ = ctx_->peer();
    absl::StatusOr<Caller> caller = AdmitCall(service_->options_.access, *ctx_, method_);
    if (!caller.ok()) return caller.status();
    caller_ = *std::move(caller);
    if (service_->options_.access != nullptr) {
      absl::StatusOr<TenantStreamSlot> slot = service_->options_.access->OpenStream(caller_);
      if (!slot.ok()) {
        service_->observer_->OnLimitReached(method_, "tenant max_concurrent_streams");
        return slot.status();
      }
      tenant_slot_ = *std::move(slot);
    }
    std::string_view limit;
    if (absl::Status s = service_->streams_.Acquire(peer_, &limit); !s.ok()) {
      service_->observer_->OnLimitReached(method_, limit);
      return s;
    }
    holds_slot_ = true;
    watch_ = service_->watchdog_.Watch([this] { OnIdle(); });
    return absl::OkStatus();
  }
  // The stream moved: restart the idle timer.
  void Progress() {
    if (watch_ != 0) service_->watchdog_.Touch(watch_);
  }
  bool timed_out() const { return timed_out_.load(); }
  // The peer, once Begin() ran.
  const std::string& peer() const { return peer_; }
  // Who is calling, once Begin() succeeded.
  const Caller& caller() const { return caller_; }
  // What a failed read or write means: the idle timeout, or `otherwise`.
  absl::Status BrokeOff(absl::Status otherwise) const {
    return timed_out() ? TimeoutError() : otherwise;
  }
  // Gives the slot back; called as the reactor finishes, so a client that
  // has seen the status finds the slot free. Idempotent.
  void ReleaseSlot() {
    tenant_slot_ = TenantStreamSlot();
    if (!holds_slot_) return;
    holds_slot_ = false;
    service_->streams_.Release(peer_);
  }
  // Runs `step` as one data-path step of this stream's connection: now, on
  // this thread, when the FairScheduler has a slot free (or there is none),
  // else on a kv-fair thread once admitted, with UNAVAILABLE at shutdown.
  // Never blocks. The slot is given back as `step` returns.
  // Every step after the stream's first continues its operation
  // (FairScheduler::Submit): it waits only for a free slot, not for a turn.
  void RunStep(absl::AnyInvocable<void(absl::Status) &&> step) {
    FairScheduler* fair = service_->options_.fair;
    if (fair == nullptr) return std::move(step)(absl::OkStatus());
    if (flow_ == nullptr) {
      flow_ = fair->Join(caller_.principal().tenant, peer_, DataPathKind::kGrpc);
    }
    // Set before Submit: once the step starts a read or write, the next
    // reaction (even OnDone, deleting this) may run on another thread.
    const bool continues = std::exchange(ran_step_, true);
    fair->Submit(
        flow_,
        [step = std::move(step)](absl::StatusOr<FairScheduler::Slot> slot) mutable {
          std::move(step)(slot.status());
        },
        continues);
  }
  // From OnDone: stops the timer (waiting out a running OnIdle) and gives
  // the slot back if Finish did not.
  void End() {
    if (ran_step_) service_->options_.fair->EndOperation(flow_);
    if (watch_ != 0) service_->watchdog_.Unwatch(watch_);
    ReleaseSlot();
  }

 private:
  absl::Status TimeoutError() const {
    return absl::DeadlineExceededError(
        absl::StrCat(std::string(method_), " stream cancelled: ", std::string(stalled_),
                     " for stream_idle_timeout_ms (",
                     absl::ToInt64Milliseconds(service_->watchdog_.idle_timeout()), " ms)"));
  }
  // On the watchdog thread; the reactor is alive until End() returns.
  void OnIdle() {
    timed_out_.store(true);
    service_->observer_->OnStreamTimeout(method_);
    if (release_) release_();
    const std::string message(TimeoutError().message());
    // ServerContext::TryCancel() would tell the client only "Cancelled";
    // this sends the reason (as trailers, even past a full flow-control
    // window) and fails the pending read or write.
    grpc_call_cancel_with_status(ctx_->c_call(), GRPC_STATUS_DEADLINE_EXCEEDED, message.c_str(),
                                 nullptr);
  }

  CacheService* const service_;
  grpc::CallbackServerContext* const ctx_;
  const std::string_view method_;
  const std::string_view stalled_;  // what "no progress" means for this stream
  std::string peer_;
  Caller caller_ = Caller::Anonymous();
  TenantStreamSlot tenant_slot_;
  std::shared_ptr<FairScheduler::Flow> flow_;  // once a step ran
  bool ran_step_ = false;
  std::function<void()> release_;
  bool holds_slot_ = false;
  StreamWatchdog::Id watch_ = 0;
  std::atomic<bool> timed_out_{false};
};

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
  if (request->prefetch() == v1::PREFETCH_WAIT && cache_->HasLowerTier()) {
    const v1::LookupRequest* const lookups[] = {request};
    return AnswerAfterPrefetches(
        ctx, "Lookup", start, model, lookups, [this, request, response](const Caller& caller) {
          return RunLookup(*cache_, caller, *request, response, PrefetchWait::kStarted);
        });
  }
  absl::Status status = RunLimited(*ctx, "Lookup", [&](const Caller& caller) -> absl::Status {
    return RunLookup(*cache_, caller, *request, response, PrefetchWait::kStarted);
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
  if (waits && cache_->HasLowerTier() && request->lookups_size() <= kMaxBatchLookups) {
    std::vector<const v1::LookupRequest*> lookups;
    lookups.reserve(request->lookups_size());
    for (const v1::LookupRequest& l : request->lookups()) lookups.push_back(&l);
    return AnswerAfterPrefetches(
        ctx, "BatchLookup", start, {}, lookups, [this, request, response](const Caller& caller) {
          return RunBatchLookup(*cache_, caller, *request, response, PrefetchWait::kStarted);
        });
  }
  absl::Status status = RunLimited(*ctx, "BatchLookup", [&](const Caller& caller) -> absl::Status {
    return RunBatchLookup(*cache_, caller, *request, response, PrefetchWait::kStarted);
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
  StartedPrefetches started = StartWaitedPrefetches(*cache_, *caller, lookups);
  grpc::ServerUnaryReactor* reactor = ctx->DefaultReactor();
  // The model's strings live in the request, which outlives the reactor's Finish.
  AwaitPrefetches(prefetch_timer_, std::move(started.tickets), started.timeout,
                  [this, ctx, reactor, method, start, model, caller = *std::move(caller),
                   held = std::move(held), answer = std::move(answer)](bool in_time) {
                    if (!in_time) cache_->CountLatePrefetch();
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
  if (const std::shared_ptr<DeviceTier>& device = cache_->device_tier(); device != nullptr) {
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

// --- Append -------------------------------------------------------------------

class AppendReactor final : public grpc::ServerReadReactor<grpc::ByteBuffer> {
 public:
  AppendReactor(CacheService* service, grpc::CallbackServerContext* ctx, grpc::ByteBuffer* response)
      : service_(service),
        ctx_(ctx),
        response_(response),
        lifecycle_(service, ctx, "Append", "no message arrived"),
        request_id_(RequestIdOf(*ctx)) {
    ctx_->AddTrailingMetadata(kRequestIdHeader, request_id_);
    if (absl::Status s = lifecycle_.Begin(); !s.ok()) {
      Done(s);
      return;
    }
    if (service_->options_.inflight != nullptr) {
      inflight_ = service_->options_.inflight->Register("Append", request_id_, lifecycle_.peer());
    }
    StartRead(&request_);
  }

  void OnReadDone(bool ok) override {
    if (!ok) {
      // The client closed its side: a clean end commits; a broken stream
      // (cancelled, reset, idle too long) stores nothing.
      if (ctx_->IsCancelled() || lifecycle_.timed_out()) {
        return Done(lifecycle_.BrokeOff(absl::CancelledError("append stream broke off")));
      }
      if (session_ == nullptr) {
        return Done(absl::InvalidArgumentError("append stream had no header"));
      }
      return lifecycle_.RunStep([this](absl::Status admitted) {
        if (!admitted.ok()) return Done(admitted);
        Commit();
      });
    }
    lifecycle_.Progress();
    lifecycle_.RunStep([this](absl::Status admitted) {
      if (!admitted.ok()) return Done(admitted);
      absl::Status status = Handle();
      if (!status.ok()) return Done(status);
      StartRead(&request_);
    });
  }

  void OnDone() override {
    lifecycle_.End();
    inflight_.Reset();
    ReportCallDone(service_->observer_, {.method = "Append",
                                         .request_id = request_id_,
                                         .peer = lifecycle_.peer(),
                                         .model = model_,
                                         .status = status_,
                                         .latency = absl::Now() - start_,
                                         .bytes = bytes_});
    delete this;
  }

 private:
  absl::Status Handle() {
    std::vector<grpc::Slice> slices;
    if (!request_.Dump(&slices).ok()) return absl::InternalError("cannot read the request");
    request_.Clear();
    DecodedAppend decoded;
    absl::Status status = DecodeAppendRequest(
        slices,
        [this](std::span<const std::byte> kv) {
          if (session_ == nullptr) {
            return absl::InvalidArgumentError("the first message of an append must be its header");
          }
          bytes_ += kv.size();
          inflight_.AddBytes(kv.size());
          return session_->Write(kv);
        },
        &decoded);
    if (!status.ok()) return status;
    if (!decoded.has_header) return absl::OkStatus();
    if (session_ != nullptr || decoded.kv_bytes > 0) {
      return absl::InvalidArgumentError("an append carries exactly one header, first, alone");
    }
    const v1::AppendHeader& h = decoded.header;
    model_ = ModelField({h.namespace_(), h.model_id()});
    auto key = ScopedModelKey(lifecycle_.caller(), h.namespace_(), h.model_id());
    if (!key.ok()) return key.status();
    std::vector<Token> tokens(h.tokens().begin(), h.tokens().end());
    std::vector<uint64_t> checksums(h.block_checksums().begin(), h.block_checksums().end());
    auto session = service_->cache_->BeginAppend(*key, std::move(tokens), h.start_token(),
                                                 FromProto(h.hints()), std::move(checksums));
    if (!session.ok()) return session.status();
    session_ = *std::move(session);
    return absl::OkStatus();
  }

  void Commit() {
    auto result = session_->Commit();
    if (!result.ok()) return Done(result.status());
    v1::AppendResponse response = ToProto(*result);
    bool own_buffer;
    grpc::Status s =
        grpc::SerializationTraits<v1::AppendResponse>::Serialize(response, response_, &own_buffer);
    if (!s.ok()) return Done(absl::InternalError("cannot encode AppendResponse"));
    Done(absl::OkStatus());
  }

  void Done(const absl::Status& status) {
    status_ = status;
    session_.reset();  // an uncommitted session frees its blocks
    lifecycle_.ReleaseSlot();
    Finish(ToGrpcStatus(status));
  }

  CacheService* const service_;
  grpc::CallbackServerContext* const ctx_;
  grpc::ByteBuffer* const response_;
  const absl::Time start_ = absl::Now();
  grpc::ByteBuffer request_;
  std::unique_ptr<AppendSession> session_;
  StreamLifecycle lifecycle_;
  const std::string request_id_;
  std::string model_;  // once the header arrived
  InflightCalls::Handle inflight_;
  uint64_t bytes_ = 0;
  absl::Status status_;
};

grpc::ServerReadReactor<grpc::ByteBuffer>* CacheService::Append(grpc::CallbackServerContext* ctx,
                                                                grpc::ByteBuffer* response) {
  return new AppendReactor(this, ctx, response);
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

// --- Fetch --------------------------------------------------------------------

namespace {

size_t VarintSize(uint64_t v) {
  size_t n = 1;
  while (v >= 0x80) {
    v >>= 7;
    ++n;
  }
  return n;
}

uint8_t* PutVarint(uint8_t* p, uint64_t v) {
  while (v >= 0x80) {
    *p++ = static_cast<uint8_t>(v) | 0x80;
    v >>= 7;
  }
  *p++ = static_cast<uint8_t>(v);
  return p;
}

// Encodes a FetchResponse whose `data` is `size` bytes of `block` at
// `offset`, without copying them: the data slice holds a pinned reference
// to the block (pin.h: the cache does not evict what gRPC is still sending)
// and points into its memory. `kept` goes out only on a first chunk.
grpc::ByteBuffer EncodeChunk(uint64_t matched_tokens, uint64_t withheld_tokens,
                             uint32_t block_index, const PinnedBlock& block, uint64_t offset,
                             uint64_t size, v1::BlockEncoding encoding,
                             const std::vector<uint32_t>& kept) {
  const bool with_kept = offset == 0 && !kept.empty();
  // At most 8 tags + 8 ten-byte varints, plus the kept list: no heap
  // allocation for an ordinary chunk.
  absl::InlinedVector<uint8_t, 96> head(96 + (with_kept ? 10 + 5 * kept.size() : 0));
  uint8_t* p = head.data();
  *p++ = 0x08;  // matched_tokens = 1, varint
  p = PutVarint(p, matched_tokens);
  *p++ = 0x10;  // block_index = 2
  p = PutVarint(p, block_index);
  *p++ = 0x18;  // block_bytes = 3
  p = PutVarint(p, block->size());
  *p++ = 0x20;  // block_checksum = 4
  p = PutVarint(p, block->checksum());
  *p++ = 0x28;  // offset = 5
  p = PutVarint(p, offset);
  if (encoding != v1::BLOCK_ENCODING_RAW) {
    *p++ = 0x30;  // encoding = 6, varint
    p = PutVarint(p, static_cast<uint64_t>(encoding));
  }
  if (with_kept) {
    uint64_t packed = 0;
    for (uint32_t t : kept) packed += VarintSize(t);
    *p++ = 0x3A;  // kept_tokens = 7, packed
    p = PutVarint(p, packed);
    for (uint32_t t : kept) p = PutVarint(p, t);
  }
  if (withheld_tokens != 0) {
    *p++ = 0x40;  // withheld_tokens = 8, varint
    p = PutVarint(p, withheld_tokens);
  }
  *p++ = 0x7A;  // data = 15, length-delimited
  p = PutVarint(p, size);
  grpc::Slice slices[2] = {
      grpc::Slice(head.data(), static_cast<size_t>(p - head.data())),
      grpc::Slice(
          const_cast<std::byte*>(block->data().data()) + offset, size,
          [](void* ref) { delete static_cast<PinnedBlock*>(ref); }, new PinnedBlock(block))};
  return grpc::ByteBuffer(slices, 2);
}

}  // namespace

class FetchReactor final : public grpc::ServerWriteReactor<grpc::ByteBuffer> {
 public:
  FetchReactor(CacheService* service, grpc::CallbackServerContext* ctx,
               const grpc::ByteBuffer* raw_request)
      : service_(service),
        ctx_(ctx),
        lifecycle_(service, ctx, "Fetch", "a write did not complete"),
        request_id_(RequestIdOf(*ctx)) {
    ctx_->AddTrailingMetadata(kRequestIdHeader, request_id_);
    if (absl::Status s = lifecycle_.Begin([this] { ReleasePlan(); }); !s.ok()) {
      Done(s);
      return;
    }
    if (service_->options_.inflight != nullptr) {
      inflight_ = service_->options_.inflight->Register("Fetch", request_id_, lifecycle_.peer());
    }
    // The request is gRPC's only until this returns: parse it now.
    absl::StatusOr<v1::FetchRequest> request = Parse(raw_request);
    if (!request.ok()) {
      Done(request.status());
      return;
    }
    lifecycle_.RunStep([this, request = *std::move(request)](absl::Status admitted) {
      if (!admitted.ok()) return Done(admitted);
      Prepare(request);
    });
  }

  void OnWriteDone(bool ok) override {
    if (!ok) return Done(lifecycle_.BrokeOff(absl::CancelledError("fetch stream broke off")));
    lifecycle_.Progress();
    lifecycle_.RunStep([this](absl::Status admitted) {
      if (!admitted.ok()) return Done(admitted);
      WriteNext();
    });
  }

  void OnDone() override {
    lifecycle_.End();
    if (finished_with_write_ && ctx_->IsCancelled()) {
      status_ = lifecycle_.BrokeOff(absl::CancelledError("fetch stream broke off"));
    }
    inflight_.Reset();
    ReportCallDone(service_->observer_, {.method = "Fetch",
                                         .request_id = request_id_,
                                         .peer = lifecycle_.peer(),
                                         .model = model_,
                                         .status = status_,
                                         .latency = absl::Now() - start_,
                                         .bytes = bytes_});
    delete this;
  }

 private:
  static absl::StatusOr<v1::FetchRequest> Parse(const grpc::ByteBuffer* raw_request) {
    v1::FetchRequest request;
    grpc::ByteBuffer copy(*raw_request);  // shares the slices
    grpc::Status parsed = grpc::SerializationTraits<v1::FetchRequest>::Deserialize(&copy, &request);
    if (!parsed.ok()) return absl::InvalidArgumentError("FetchRequest does not parse");
    return request;
  }

  // Checks the request and plans the fetch. The plan is made on the cache's
  // fetch-read threads when blocks must be read back from the SSD tier, so
  // this step never waits on the disk: the stream goes on from OnPlanned.
  void Prepare(const v1::FetchRequest& request) {
    model_ = ModelField({request.namespace_(), request.model_id()});
    auto key = ScopedModelKey(lifecycle_.caller(), request.namespace_(), request.model_id());
    if (!key.ok()) return Done(key.status());
    chunk_bytes_ = service_->options_.fetch_chunk_bytes;
    if (request.max_chunk_bytes() != 0) {
      if (request.max_chunk_bytes() < 4096) {
        return Done(absl::InvalidArgumentError(
            absl::StrCat("max_chunk_bytes is ", request.max_chunk_bytes(),
                         "; it must be 0 (default) or >= 4096")));
      }
      chunk_bytes_ = std::min<uint64_t>(chunk_bytes_, request.max_chunk_bytes());
    }
    // Lossy KV only to a worker that opted in.
    if (request.lossy_as_stored() && !request.accept_lossy()) {
      return Done(absl::InvalidArgumentError(
          "lossy_as_stored needs accept_lossy: lossy blocks are sent only to a worker that opts "
          "in"));
    }
    if (request.lease_id() != 0 && !request.tokens().empty()) {
      return Done(absl::InvalidArgumentError("set either tokens or lease_id, not both"));
    }
    lossy_as_stored_ = request.lossy_as_stored();
    const FetchQuery query{.tokens = TokensOf(request.tokens()),
                           .lease_id = request.lease_id(),
                           .accept_lossy = request.accept_lossy()};
    const std::thread::id step_thread = std::this_thread::get_id();
    service_->cache_->PrepareFetchAsync(*key, query, [this, step_thread](auto plan) {
      OnPlanned(std::move(plan), /*in_step=*/std::this_thread::get_id() == step_thread);
    });
  }

  // The plan is made: streams it, at once when still in the step that asked
  // for it, else (the reads ran on a fetch-read thread) from a step of its
  // own, admitted by the fair scheduler as every step of the stream is.
  void OnPlanned(absl::StatusOr<FetchPlan> plan, bool in_step) ABSL_LOCKS_EXCLUDED(plan_mu_) {
    if (!plan.ok()) return Done(plan.status());
    if (plan->withheld_tokens != 0) {
      ctx_->AddTrailingMetadata("kvcache-withheld-tokens", absl::StrCat(plan->withheld_tokens));
    }
    {
      MutexLock lock(&plan_mu_);
      // Cancelled while the reads ran: keep nothing pinned (EncodeNext ends it).
      if (!plan_released_) plan_ = *std::move(plan);
    }
    if (in_step) return WriteNext();
    lifecycle_.RunStep([this](absl::Status admitted) {
      if (!admitted.ok()) return Done(admitted);
      WriteNext();
    });
  }

  // On the watchdog thread, as an idle stream is cancelled: drops the blocks
  // not yet handed to gRPC at once. The pending write fails only when the
  // transport gives up on the peer, which for a peer that stopped reading
  // can be as late as keepalive notices.
  void ReleasePlan() ABSL_LOCKS_EXCLUDED(plan_mu_) {
    MutexLock lock(&plan_mu_);
    plan_released_ = true;
    plan_.blocks = {};
    current_ = FetchBlock();
  }

  // Sends the next chunk, or finishes. It starts the write (or Finish) only
  // after letting go of plan_mu_: on a kv-fair thread, outside any
  // reaction, the next reaction (and OnDone, which deletes the reactor) may
  // run as soon as the write is started.
  void WriteNext() ABSL_LOCKS_EXCLUDED(plan_mu_) {
    absl::Status end;
    const Next next = EncodeNext(&end);
    if (next == Next::kEnd) return Done(end);
    if (next == Next::kWrite) return StartWrite(&buffer_);
    // The last chunk goes out with the status in one batch (one write, no
    // further reaction); the slot is free once it is handed to gRPC.
    status_ = absl::OkStatus();
    finished_with_write_ = true;
    lifecycle_.ReleaseSlot();
    StartWriteAndFinish(&buffer_, grpc::WriteOptions(), grpc::Status::OK);
  }

  enum class Next { kWrite, kWriteLast, kEnd };
  // Encodes the next chunk into buffer_ and says whether it is the last; or
  // ends the stream with `*end` (OK when there was nothing left to send).
  Next EncodeNext(absl::Status* end) ABSL_LOCKS_EXCLUDED(plan_mu_) {
    MutexLock lock(&plan_mu_);
    if (plan_released_) {
      *end = lifecycle_.BrokeOff(absl::CancelledError("fetch stream broke off"));
      return Next::kEnd;
    }
    if (block_ >= plan_.blocks.size()) return Next::kEnd;
    if (offset_ == 0) {
      // Compression switched off since planning: off means lossless for
      // fetches in flight too.
      if (plan_.blocks[block_]->compressed() && !plan_.MaySendLossy()) {
        *end = absl::AbortedError(
            "compression was switched off for this model while the fetch streamed; lossy "
            "blocks are no longer sent: retry the fetch");
        return Next::kEnd;
      }
      // What this block goes out as: stored bytes, or decoded ones.
      absl::StatusOr<FetchBlock> sent = MaterializeForFetch(plan_.blocks[block_], lossy_as_stored_);
      if (!sent.ok()) {
        *end = sent.status();
        return Next::kEnd;
      }
      current_ = *std::move(sent);
    }
    const PinnedBlock& block = current_.bytes;
    const uint64_t size = std::min(chunk_bytes_, block->size() - offset_);
    buffer_ = EncodeChunk(plan_.matched_tokens, plan_.withheld_tokens,
                          static_cast<uint32_t>(block_), block, offset_, size,
                          static_cast<v1::BlockEncoding>(current_.encoding), current_.kept_tokens);
    bytes_ += size;
    inflight_.AddBytes(size);
    offset_ += size;
    if (offset_ == block->size()) {
      // The chunks' slices hold their own references: drop ours, so a slow
      // reader pins only the blocks gRPC has not sent yet.
      plan_.blocks[block_].reset();
      current_ = FetchBlock();
      ++block_;
      offset_ = 0;
    }
    return block_ < plan_.blocks.size() ? Next::kWrite : Next::kWriteLast;
  }

  void Done(const absl::Status& status) {
    status_ = status;
    lifecycle_.ReleaseSlot();
    Finish(ToGrpcStatus(status));
  }

  CacheService* const service_;
  grpc::CallbackServerContext* const ctx_;
  const absl::Time start_ = absl::Now();
  // Guards plan_ and current_ against ReleasePlan(); reactions hold it
  // while they use them.
  Mutex plan_mu_;
  bool plan_released_ ABSL_GUARDED_BY(plan_mu_) = false;
  FetchPlan plan_ ABSL_GUARDED_BY(plan_mu_);
  bool lossy_as_stored_ = false;
  FetchBlock current_ ABSL_GUARDED_BY(plan_mu_);  // the block being sent
  uint64_t chunk_bytes_ = 0;
  size_t block_ = 0;
  uint64_t offset_ = 0;
  grpc::ByteBuffer buffer_;
  bool finished_with_write_ = false;  // the last chunk carried the status
  StreamLifecycle lifecycle_;
  const std::string request_id_;
  std::string model_;  // once the request parsed
  InflightCalls::Handle inflight_;
  uint64_t bytes_ = 0;
  absl::Status status_;
};

grpc::ServerWriteReactor<grpc::ByteBuffer>* CacheService::Fetch(grpc::CallbackServerContext* ctx,
                                                                const grpc::ByteBuffer* request) {
  return new FetchReactor(this, ctx, request);
}

}  // namespace kvcache
