// CacheService::Append (cache_service.h): the AppendReactor, which decodes
// each message's slices (AppendDecoder), copies kv_chunk bytes into the
// cache's AppendSession and commits when the client closes its side.
#include <memory>
#include <optional>
#include <span>
#include <utility>
#include <vector>

#include "absl/time/clock.h"
#include "server/frontdoor/cache_calls.h"
#include "server/frontdoor/call_scope.h"
#include "server/frontdoor/proto_convert.h"
#include "server/rpc/append_decoder.h"
#include "server/rpc/cache_service.h"
#include "server/rpc/grpc_call.h"
#include "server/rpc/status_convert.h"
#include "server/rpc/stream_lifecycle.h"

namespace kvcache {

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
    if (service_->options_.shared != nullptr) {
      shared_ = SharedAppend{.model = *key, .tokens = tokens, .start_token = h.start_token()};
    }
    auto session = service_->cache_->BeginAppend(*key, std::move(tokens), h.start_token(),
                                                 FromProto(h.hints()), std::move(checksums));
    if (!session.ok()) return session.status();
    session_ = *std::move(session);
    return absl::OkStatus();
  }

  void Commit() {
    auto result = session_->Commit();
    if (!result.ok()) return Done(result.status());
    if (shared_.has_value() && result->stored_blocks > 0) {
      service_->options_.shared->Stored(shared_->model, shared_->tokens, shared_->start_token);
    }
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
  // What the shared tier is told once the append stored blocks; only with one.
  struct SharedAppend {
    ModelKey model;
    std::vector<Token> tokens;
    uint64_t start_token = 0;
  };
  std::optional<SharedAppend> shared_;
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

}  // namespace kvcache
