// CacheService: the kvcache.v1.Cache gRPC service, on the callback API.
//
// It translates messages to core calls and errors to gRPC statuses; the
// Cache decides everything. Append and Fetch are registered raw: Append's
// reactor decodes each request's slices itself and copies kv_chunk bytes
// straight into pool memory (AppendDecoder); Fetch's reactor sends block
// payloads as slices pointing into pool memory. A payload byte is copied once
// on the way in and only by the transport on the way out.
//
// Limits (docs/api.md, "Timeouts and limits"): Append and Fetch streams count
// against max_concurrent_streams and, per peer, max_streams_per_client;
// Lookup, BatchLookup, Evict, ReportAttention and PlaceOnDevice against max_concurrent_unary. A
// stream that makes no progress for stream_idle_timeout_ms is cancelled with DEADLINE_EXCEEDED and
// gives back its slot, its append session and its blocks. With a FairScheduler,
// each Append message (and its commit) and each Fetch write is a data-path
// step: it runs on the callback thread when a slot is free, else on a kv-fair
// thread once admitted; no callback thread waits for a slot. A Fetch holds a reference only to
// blocks not yet handed to gRPC (and gRPC to those it has not yet sent), so a slow reader pins only
// what is in flight.
//
// Thread-safe; the Cache and RpcObserver must outlive the service.
#ifndef KVCACHE_SERVER_RPC_CACHE_SERVICE_H_
#define KVCACHE_SERVER_RPC_CACHE_SERVICE_H_

#include <cstdint>
#include <functional>
#include <span>

#include "absl/functional/function_ref.h"
#include "absl/time/time.h"
#include "kvcache/v1/kvcache.grpc.pb.h"
#include "server/common/clock.h"
#include "server/core/cache.h"
#include "server/frontdoor/call_log.h"
#include "server/frontdoor/fair_scheduler.h"
#include "server/frontdoor/inflight_calls.h"
#include "server/frontdoor/rpc_observer.h"
#include "server/frontdoor/shared_tier.h"
#include "server/rpc/call_limits.h"
#include "server/rpc/deadline_timer.h"
#include "server/rpc/stream_watchdog.h"
#include "server/security/access_control.h"

namespace kvcache {

struct CacheServiceOptions {
  uint64_t fetch_chunk_bytes = uint64_t{1} << 20;
  uint32_t max_concurrent_streams = 256;
  uint32_t max_streams_per_client = 256;  // <= max_concurrent_streams
  uint32_t max_concurrent_unary = 64;
  absl::Duration stream_idle_timeout = absl::Seconds(30);
  Clock* clock = SystemClock::Get();  // what the idle timeout reads
  InflightCalls* inflight = nullptr;  // where Append and Fetch register; null: nowhere
  // Who may call what, in which namespaces; null: everyone, everywhere.
  AccessControl* access = nullptr;
  // Admits each Append message and Fetch write as a data-path step
  // (limits.data_path_concurrency), shared with the shared-memory plane;
  // null: no admission. Outlives the service.
  FairScheduler* fair = nullptr;
  // The tier shared with other daemons, told of appends and short lookups
  // (SharedTier); null: none. Outlives the service.
  SharedTier* shared = nullptr;
};

using CacheServiceBase =
    v1::Cache::WithCallbackMethod_RegisterModel<v1::Cache::WithCallbackMethod_Lookup<
        v1::Cache::WithCallbackMethod_BatchLookup<v1::Cache::WithCallbackMethod_ReleaseLease<
            v1::Cache::WithRawCallbackMethod_Append<v1::Cache::WithRawCallbackMethod_Fetch<
                v1::Cache::WithCallbackMethod_Evict<v1::Cache::WithCallbackMethod_ReportAttention<
                    v1::Cache::WithCallbackMethod_PlaceOnDevice<
                        v1::Cache::WithCallbackMethod_GetDeviceArenas<v1::Cache::Service>>>>>>>>>>;

class CacheService final : public CacheServiceBase {
 public:
  CacheService(const CacheServiceOptions& options, Cache* cache, RpcObserver* observer);

  grpc::ServerUnaryReactor* RegisterModel(grpc::CallbackServerContext* ctx,
                                          const v1::RegisterModelRequest* request,
                                          v1::RegisterModelResponse* response) override;
  grpc::ServerUnaryReactor* Lookup(grpc::CallbackServerContext* ctx,
                                   const v1::LookupRequest* request,
                                   v1::LookupResponse* response) override;
  grpc::ServerUnaryReactor* BatchLookup(grpc::CallbackServerContext* ctx,
                                        const v1::BatchLookupRequest* request,
                                        v1::BatchLookupResponse* response) override;
  grpc::ServerUnaryReactor* ReleaseLease(grpc::CallbackServerContext* ctx,
                                         const v1::ReleaseLeaseRequest* request,
                                         v1::ReleaseLeaseResponse* response) override;
  grpc::ServerReadReactor<grpc::ByteBuffer>* Append(grpc::CallbackServerContext* ctx,
                                                    grpc::ByteBuffer* response) override;
  grpc::ServerWriteReactor<grpc::ByteBuffer>* Fetch(grpc::CallbackServerContext* ctx,
                                                    const grpc::ByteBuffer* request) override;
  grpc::ServerUnaryReactor* Evict(grpc::CallbackServerContext* ctx, const v1::EvictRequest* request,
                                  v1::EvictResponse* response) override;
  grpc::ServerUnaryReactor* ReportAttention(grpc::CallbackServerContext* ctx,
                                            const v1::ReportAttentionRequest* request,
                                            v1::ReportAttentionResponse* response) override;

  grpc::ServerUnaryReactor* PlaceOnDevice(grpc::CallbackServerContext* ctx,
                                          const v1::PlaceOnDeviceRequest* request,
                                          v1::PlaceOnDeviceResponse* response) override;
  grpc::ServerUnaryReactor* GetDeviceArenas(grpc::CallbackServerContext* ctx,
                                            const v1::GetDeviceArenasRequest* request,
                                            v1::GetDeviceArenasResponse* response) override;

  // Streams in flight now.
  int active_streams() const { return streams_.active(); }

  // Answers every PREFETCH_WAIT lookup waiting for its timeout now, with
  // what is cached (shutdown: the drain need not wait out their timeouts).
  void AnswerWaitingLookups() { prefetch_timer_.FireAllNow(); }

 private:
  friend class AppendReactor;
  friend class FetchReactor;
  friend class StreamLifecycle;

  // Admits the call and runs `body` as its caller, in a max_concurrent_unary
  // slot and one of the caller's tenant's share of them; or refuses it.
  absl::Status RunLimited(grpc::CallbackServerContext& ctx, std::string_view method,
                          absl::FunctionRef<absl::Status(const Caller&)> body);
  // A slot in `caller`'s tenant's share of max_concurrent_unary (empty when
  // there is no share or no access control).
  absl::StatusOr<TenantStreamSlot> OpenTenantUnary(const Caller& caller, std::string_view method);
  grpc::ServerUnaryReactor* FinishUnary(grpc::CallbackServerContext* ctx, std::string_view method,
                                        absl::Time start, const absl::Status& status,
                                        const ModelRef& model = {});
  // A lookup (or batch) with PREFETCH_WAIT: admits the call, starts the
  // prefetches its lookups wait for and returns at once; `answer` runs (and
  // the call finishes) when they are done or at the longest timeout asked.
  grpc::ServerUnaryReactor* AnswerAfterPrefetches(
      grpc::CallbackServerContext* ctx, std::string_view method, absl::Time start,
      const ModelRef& model, std::span<const v1::LookupRequest* const> lookups,
      std::function<absl::Status(const Caller&)> answer);
  // Whether a PREFETCH_WAIT lookup has anything to wait for: a level below
  // host memory, or a shared tier.
  bool MayPrefetch() const {
    return cache_->tiers().lower_tier() != nullptr || options_.shared != nullptr;
  }

  const CacheServiceOptions options_;
  Cache* const cache_;
  RpcObserver* const observer_;
  StreamLimiter streams_;
  UnaryLimiter unary_;
  StreamWatchdog watchdog_;
  // Deadlines of PREFETCH_WAIT lookups; destroyed first, answering them all.
  DeadlineTimer prefetch_timer_;
};

}  // namespace kvcache

#endif  // KVCACHE_SERVER_RPC_CACHE_SERVICE_H_
