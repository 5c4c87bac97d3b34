#include "server/shm/shm_session.h"

#include <algorithm>
#include <atomic>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "server/common/status_macros.h"
#include "server/core/fetch_block.h"
#include "server/frontdoor/cache_calls.h"
#include "server/frontdoor/call_log.h"
#include "server/frontdoor/call_scope.h"
#include "server/frontdoor/proto_convert.h"

namespace kvcache {
namespace {

// What the response says of one fetched block once its bytes were copied.
struct FetchedMeta {
  uint64_t checksum = 0;
  FetchEncoding encoding = FetchEncoding::kRaw;
  std::vector<uint32_t> kept_tokens;
};

void SetStatus(const absl::Status& status, v1::ShmResponse* response) {
  response->set_code(static_cast<int>(status.code()));
  response->set_message(std::string(status.message()));
}

// The name an operation is counted under (kvcached_rpcs_total{method=...}).
std::string_view MethodName(v1::ShmRequest::OpCase op) {
  switch (op) {
    case v1::ShmRequest::kHello:
      return "ShmHello";
    case v1::ShmRequest::kAttachRegion:
      return "ShmAttachRegion";
    case v1::ShmRequest::kDetachRegion:
      return "ShmDetachRegion";
    case v1::ShmRequest::kLookup:
      return "ShmLookup";
    case v1::ShmRequest::kBatchLookup:
      return "ShmBatchLookup";
    case v1::ShmRequest::kFetchInto:
      return "ShmFetchInto";
    case v1::ShmRequest::kAppendFrom:
      return "ShmAppendFrom";
    case v1::ShmRequest::kReleaseLease:
      return "ShmReleaseLease";
    case v1::ShmRequest::OP_NOT_SET:
      break;
  }
  return "ShmUnknown";
}

// The model a request names, for its log line.
ModelRef ModelOf(const v1::ShmRequest& request) {
  switch (request.op_case()) {
    case v1::ShmRequest::kLookup:
      return {request.lookup().namespace_(), request.lookup().model_id()};
    case v1::ShmRequest::kFetchInto:
      return {request.fetch_into().namespace_(), request.fetch_into().model_id()};
    case v1::ShmRequest::kAppendFrom:
      return {request.append_from().header().namespace_(),
              request.append_from().header().model_id()};
    default:
      return {};
  }
}

}  // namespace

ShmSession::ShmSession(const ShmLimits& limits, Cache* cache, CopyEngine* copier,
                       RpcObserver* observer, ShmPeer who, MappingBudget* budget)
    : limits_(limits),
      cache_(cache),
      copier_(copier),
      observer_(observer),
      who_(std::move(who)),
      budget_(budget) {}

ShmSession::~ShmSession() = default;

// One request from its arrival to its answer. A request that waits (for a
// data-path slot, for reads below host memory) travels as one of these to the
// thread that finishes it.
struct ShmSession::Call {
  v1::ShmRequest request;
  std::vector<UniqueFd> fds;
  Respond respond;
  std::string_view method;
  std::string request_id;
  absl::Time start;
  InflightCalls::Handle inflight;
  // Who the request runs as (set once admitted).
  std::optional<Caller> caller;
  TenantStreamSlot stream;   // fetch_into and append_from: a tenant stream slot
  FairScheduler::Slot step;  // ... and a data-path slot
  v1::ShmResponse response;
  uint64_t bytes = 0;  // KV bytes moved
};

void ShmSession::Handle(v1::ShmRequest request, std::vector<UniqueFd> fds, Respond respond) {
  auto call = std::make_unique<Call>();
  call->start = absl::Now();
  call->method = MethodName(request.op_case());
  call->request_id = NewRequestId();
  call->request = std::move(request);
  call->fds = std::move(fds);
  call->respond = std::move(respond);
  const bool moves_kv = MovesKv(call->request);
  if (moves_kv && who_.inflight != nullptr) {
    call->inflight = who_.inflight->Register(call->method, call->request_id, who_.peer);
  }
  if (absl::Status admitted = Admit(*call); !admitted.ok()) {
    return Finish(std::move(call), admitted);
  }
  if (!moves_kv || who_.fair == nullptr) return Run(std::move(call));
  // A data-path slot, shared fairly with the gRPC streams and the other
  // connections: the step runs here when one is free, else on a kv-fair
  // thread once granted (this thread goes back to its other connections).
  const std::string& tenant = call->caller->principal().tenant;
  if (flow_ == nullptr || flow_tenant_ != tenant) {
    static std::atomic<uint64_t> connections{0};
    flow_ = who_.fair->Join(tenant, absl::StrCat(who_.peer, "#", connections.fetch_add(1)),
                            DataPathKind::kSharedMemory);
    flow_tenant_ = tenant;
  }
  who_.fair->Submit(
      flow_, [this, call = std::move(call)](absl::StatusOr<FairScheduler::Slot> slot) mutable {
        if (!slot.ok()) return Finish(std::move(call), slot.status());
        call->step = *std::move(slot);
        Run(std::move(call));
      });
}

bool ShmSession::MovesKv(const v1::ShmRequest& request) {
  return request.op_case() == v1::ShmRequest::kFetchInto ||
         request.op_case() == v1::ShmRequest::kAppendFrom;
}

absl::Status ShmSession::Admit(Call& call) {
  const v1::ShmRequest& request = call.request;
  // A hello's token stands for the rest of the session; every request is
  // admitted on its own (a reload or a rate limit applies at once).
  if (request.op_case() == v1::ShmRequest::kHello && !request.hello().token().empty()) {
    token_ = request.hello().token();
    principal_ = SessionPrincipal();
  }
  absl::StatusOr<Caller> caller = Caller::Anonymous();
  if (who_.access != nullptr && who_.access->enabled()) {
    Credentials credentials{.unix_uid = who_.uid};
    if (!token_.empty()) credentials.bearer_token = token_;
    caller = who_.access->AdmitSession(credentials, call.method, &principal_);
  }
  if (!caller.ok()) return caller.status();
  KVCACHE_RETURN_IF_ERROR(HoldConnectionSlot(*caller));
  // A fetch_into or append_from holds one of its tenant's stream slots
  // while it runs, as a gRPC Fetch or Append stream does
  // (security.tenant_limits.max_concurrent_streams).
  if (MovesKv(request) && who_.access != nullptr) {
    absl::StatusOr<TenantStreamSlot> slot = who_.access->OpenStream(*caller);
    if (!slot.ok()) {
      observer_->OnLimitReached(call.method, "tenant max_concurrent_streams");
      return slot.status();
    }
    call.stream = *std::move(slot);
  }
  if (request.op_case() != v1::ShmRequest::kAttachRegion && !call.fds.empty()) {
    return absl::InvalidArgumentError(
        "file descriptors came with a request that is not attach_region; they were closed");
  }
  call.caller = *std::move(caller);
  return absl::OkStatus();
}

void ShmSession::Run(std::unique_ptr<Call> call) {
  // A fetch_into may finish on another thread (StartFetchInto); the rest
  // finish here.
  if (call->request.op_case() == v1::ShmRequest::kFetchInto) {
    return StartFetchInto(std::move(call));
  }
  const v1::ShmRequest& request = call->request;
  const Caller& caller = *call->caller;
  v1::ShmResponse& response = call->response;
  absl::Status status = [&]() -> absl::Status {
    switch (request.op_case()) {
      case v1::ShmRequest::kHello: {
        v1::ShmHelloResponse* hello = response.mutable_hello();
        hello->set_version(v1::SHM_VERSION_1);
        hello->set_max_frame_bytes(limits_.max_frame_bytes);
        hello->set_max_regions(limits_.max_regions);
        hello->set_max_region_bytes(limits_.max_region_bytes);
        return absl::OkStatus();
      }
      case v1::ShmRequest::kAttachRegion: {
        auto attached = Attach(caller, request.attach_region(), call->fds);
        if (!attached.ok()) return attached.status();
        *response.mutable_attach_region() = *std::move(attached);
        return absl::OkStatus();
      }
      case v1::ShmRequest::kDetachRegion:
        response.mutable_detach_region();
        return Detach(request.detach_region());
      case v1::ShmRequest::kLookup:
        return RunLookup(*cache_, who_.shared, caller, request.lookup(), response.mutable_lookup());
      case v1::ShmRequest::kBatchLookup:
        return RunBatchLookup(*cache_, who_.shared, caller, request.batch_lookup(),
                              response.mutable_batch_lookup());
      case v1::ShmRequest::kReleaseLease:
        response.mutable_release_lease()->set_released(
            cache_->ReleaseLease(request.release_lease().lease_id(),
                                 [&](const ModelKey& model) { return caller.MaySee(model.ns); }));
        return absl::OkStatus();
      case v1::ShmRequest::kFetchInto:  // above
      case v1::ShmRequest::kAppendFrom: {
        auto appended = AppendFrom(caller, request.append_from(), &call->bytes);
        if (!appended.ok()) return appended.status();
        *response.mutable_append_from() = *std::move(appended);
        return absl::OkStatus();
      }
      case v1::ShmRequest::OP_NOT_SET:
        break;
    }
    return absl::InvalidArgumentError("the request names no operation this daemon knows");
  }();
  Finish(std::move(call), status);
}

void ShmSession::Finish(std::unique_ptr<Call> call, const absl::Status& status) {
  call->inflight.Reset();
  call->step.Release();
  call->stream = TenantStreamSlot();
  const absl::Duration latency = absl::Now() - call->start;
  if (ShouldLogCall(status.code())) {
    const std::string model = ModelField(ModelOf(call->request));
    LogCallDone({.method = call->method,
                 .request_id = call->request_id,
                 .peer = who_.peer,
                 .model = model,
                 .status = status,
                 .latency = latency,
                 .bytes = call->bytes});
  }
  v1::ShmResponse& response = call->response;
  if (!status.ok()) {
    response.clear_result();
    SetStatus(status, &response);
    response.set_message(absl::StrCat(response.message(), " (request id ", call->request_id, ")"));
  }
  observer_->OnRpcDone(call->method, status.code(), latency, call->bytes);
  std::move(call->respond)(std::move(response));
}

absl::StatusOr<v1::AttachRegionResponse> ShmSession::Attach(const Caller& caller,
                                                            const v1::AttachRegionRequest& request,
                                                            std::vector<UniqueFd>& fds) {
  if (fds.size() != 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "attach_region carries exactly one file descriptor (SCM_RIGHTS); ", fds.size(), " came"));
  }
  if (regions_.size() >= limits_.max_regions) {
    observer_->OnLimitReached("ShmAttachRegion", "shm.max_regions_per_connection");
    return absl::ResourceExhaustedError(
        absl::StrCat("this connection has ", regions_.size(),
                     " regions attached, the limit (shm.max_regions_per_connection); detach one"));
  }
  MappingBudget::Grant grant;
  if (budget_ != nullptr) {
    // Who the mapping is charged to: the principal's tenant with
    // authentication on, the peer's uid otherwise.
    const bool by_tenant = who_.access != nullptr && who_.access->enabled();
    const std::string owner = by_tenant ? absl::StrCat("tenant ", caller.principal().tenant)
                                        : absl::StrCat("uid ", who_.uid);
    std::string_view limit;
    auto granted = budget_->Reserve(owner, request.bytes(), &limit);
    if (!granted.ok()) {
      observer_->OnLimitReached("ShmAttachRegion", limit);
      return granted.status();
    }
    grant = *std::move(granted);
  }
  auto region = MappedRegion::Map(fds[0].get(), request.bytes(), limits_.max_region_bytes);
  if (!region.ok()) return region.status();
  uint64_t id = 0;
  while (id == 0 || regions_.contains(id)) id = absl::Uniform<uint64_t>(ids_);
  mapped_bytes_ += (*region)->size();
  regions_.emplace(id, Attached{*std::move(region), std::move(grant)});
  v1::AttachRegionResponse response;
  response.set_region_id(id);
  return response;
}

absl::Status ShmSession::Detach(const v1::DetachRegionRequest& request) {
  auto it = regions_.find(request.region_id());
  if (it == regions_.end()) {
    return absl::NotFoundError(
        absl::StrCat("region ", request.region_id(), " is not attached on this connection"));
  }
  mapped_bytes_ -= it->second.region->size();
  regions_.erase(it);
  return absl::OkStatus();
}

absl::StatusOr<std::span<std::byte>> ShmSession::Resolve(
    const v1::RegionRange& range, std::shared_ptr<MappedRegion>* region) const {
  auto it = regions_.find(range.region_id());
  if (it == regions_.end()) {
    return absl::NotFoundError(absl::StrCat(
        "region ", range.region_id(),
        " is not attached on this connection (regions are bound to the connection that "
        "attached them)"));
  }
  *region = it->second.region;
  return it->second.region->Range(range.offset(), range.length());
}

absl::Status ShmSession::HoldConnectionSlot(const Caller& caller) {
  if (who_.access == nullptr || connection_tenant_ == caller.principal().tenant) {
    return absl::OkStatus();
  }
  connection_slot_ = TenantStreamSlot();  // a new tenant: the old one's slot goes back
  connection_tenant_.reset();
  absl::StatusOr<TenantStreamSlot> slot = who_.access->OpenShmConnection(caller);
  if (!slot.ok()) {
    refused_ = true;
    observer_->OnLimitReached("ShmConnect", "tenant share of shm.max_connections");
    return slot.status();
  }
  connection_slot_ = *std::move(slot);
  connection_tenant_ = caller.principal().tenant;
  return absl::OkStatus();
}

void ShmSession::StartFetchInto(std::unique_ptr<Call> call) {
  const Caller& caller = *call->caller;
  const v1::FetchIntoRequest& request = call->request.fetch_into();
  std::shared_ptr<MappedRegion> region;
  auto destination = Resolve(request.destination(), &region);
  if (!destination.ok()) return Finish(std::move(call), destination.status());
  auto key = ScopedModelKey(caller, request.namespace_(), request.model_id());
  if (!key.ok()) return Finish(std::move(call), key.status());
  if (request.lease_id() != 0 && !request.tokens().empty()) {
    return Finish(std::move(call),
                  absl::InvalidArgumentError("set either tokens or lease_id, not both"));
  }
  // The query's tokens stay in call->request, which the callback owns.
  const FetchQuery query{.tokens = TokensOf(request.tokens()),
                         .lease_id = request.lease_id(),
                         .accept_lossy = request.accept_lossy(),
                         .max_blocks = request.max_blocks()};
  // Blocks below host memory are read on the cache's fetch-read threads,
  // and the copy and the answer follow there: this thread does not wait.
  cache_->PrepareFetchAsync(*key, query,
                            [this, call = std::move(call), region = std::move(region),
                             destination = *destination](absl::StatusOr<FetchPlan> plan) mutable {
                              absl::StatusOr<v1::FetchIntoResponse> fetched =
                                  plan.ok() ? CopyFetched(*std::move(plan),
                                                          call->request.fetch_into().max_blocks(),
                                                          destination, &call->bytes)
                                            : plan.status();
                              if (fetched.ok())
                                *call->response.mutable_fetch_into() = *std::move(fetched);
                              Finish(std::move(call), fetched.status());
                            });
}

absl::StatusOr<v1::FetchIntoResponse> ShmSession::CopyFetched(FetchPlan plan, uint32_t max_blocks,
                                                              std::span<std::byte> destination,
                                                              uint64_t* bytes) {
  const uint64_t block_bytes = plan.layout.BlockBytes();
  const uint64_t block_tokens = plan.layout.block_tokens;
  if (max_blocks != 0 && plan.blocks.size() > max_blocks) {
    plan.blocks.resize(max_blocks);
    plan.matched_tokens = plan.blocks.size() * block_tokens;
  }
  const uint64_t needed = plan.blocks.size() * block_bytes;
  if (needed > destination.size()) {
    return absl::InvalidArgumentError(
        absl::StrCat("the destination range holds ", destination.size(), " bytes; the ",
                     plan.blocks.size(), " cached blocks need ", needed, " (", block_bytes,
                     " each): give a range of at least that, or set max_blocks"));
  }
  // Raw blocks are copied (by the CopyEngine, all at once); compressed ones
  // (lossy blocks only when the plan accepted them) are decoded straight into
  // the destination, with the checksum recorded for their decoding, which the
  // worker verifies (fetch_block.h).
  std::vector<FetchedMeta> sent;
  sent.reserve(plan.blocks.size());
  std::vector<CopyRange> copies;
  bool lossy = false;
  for (size_t i = 0; i < plan.blocks.size(); ++i) {
    const BlockPayload& stored = *plan.blocks[i];
    std::byte* into = destination.data() + i * block_bytes;
    if (!stored.compressed()) {
      copies.push_back({into, stored.data().data(), block_bytes});
      sent.push_back({.checksum = stored.checksum()});
      continue;
    }
    lossy = true;
    absl::StatusOr<DecodedForFetch> decoded =
        DecodeForFetchInto(stored, std::span<std::byte>(into, block_bytes));
    if (!decoded.ok()) return decoded.status();
    sent.push_back({.checksum = decoded->checksum,
                    .encoding = FetchEncoding::kDequantized,
                    .kept_tokens = std::move(decoded->kept_tokens)});
  }
  copier_->Copy(copies);
  // Compression switched off while copying: lossy KV of a model that is off
  // is not handed out, even if its bytes already landed.
  if (lossy && !plan.MaySendLossy()) {
    return absl::AbortedError(
        "compression was switched off for this model during the fetch; lossy blocks are no "
        "longer sent: retry the fetch");
  }
  v1::FetchIntoResponse response;
  response.set_matched_tokens(plan.matched_tokens);
  response.set_withheld_tokens(plan.withheld_tokens);
  response.set_block_bytes(block_bytes);
  for (size_t i = 0; i < sent.size(); ++i) {
    v1::FetchedBlock* b = response.add_blocks();
    b->set_index(static_cast<uint32_t>(i));
    b->set_checksum(sent[i].checksum);
    b->set_encoding(static_cast<v1::BlockEncoding>(sent[i].encoding));
    b->mutable_kept_tokens()->Add(sent[i].kept_tokens.begin(), sent[i].kept_tokens.end());
  }
  *bytes = needed;
  return response;
}

absl::StatusOr<v1::AppendResponse> ShmSession::AppendFrom(const Caller& caller,
                                                          const v1::AppendFromRequest& request,
                                                          uint64_t* bytes) {
  std::shared_ptr<MappedRegion> region;
  auto source = Resolve(request.source(), &region);
  if (!source.ok()) return source.status();
  const v1::AppendHeader& h = request.header();
  auto key = ScopedModelKey(caller, h.namespace_(), h.model_id());
  if (!key.ok()) return key.status();
  std::vector<Token> tokens(h.tokens().begin(), h.tokens().end());
  std::vector<uint64_t> checksums(h.block_checksums().begin(), h.block_checksums().end());
  auto session = cache_->BeginAppend(*key, std::move(tokens), h.start_token(), FromProto(h.hints()),
                                     std::move(checksums));
  if (!session.ok()) return session.status();
  if ((*session)->expected_bytes() != source->size()) {
    return absl::InvalidArgumentError(absl::StrCat("the source range holds ", source->size(),
                                                   " bytes; the append's blocks are ",
                                                   (*session)->expected_bytes(), " bytes"));
  }
  for (uint64_t at = 0; at < source->size(); at += kAppendPieceBytes) {
    const uint64_t n = std::min<uint64_t>(kAppendPieceBytes, source->size() - at);
    KVCACHE_RETURN_IF_ERROR((*session)->Write(source->subspan(at, n)));
  }
  auto result = (*session)->Commit();
  if (!result.ok()) return result.status();
  if (who_.shared != nullptr && result->stored_blocks > 0) {
    who_.shared->Stored(*key, TokensOf(h.tokens()), h.start_token());
  }
  *bytes = source->size();
  return ToProto(*result);
}

}  // namespace kvcache
