#include "server/rpc/grpc_call.h"

#include <algorithm>

#include "absl/time/clock.h"
#include "kvcache/request_id.h"
#include "server/rpc/status_convert.h"

namespace kvcache {

std::string RequestIdOf(const grpc::CallbackServerContext& ctx) {
  const auto& metadata = ctx.client_metadata();
  auto it = metadata.find(kRequestIdHeader);
  if (it == metadata.end() || it->second.empty()) return NewRequestId();
  std::string id(it->second.data(), std::min(it->second.size(), kMaxRequestIdBytes));
  for (char& c : id) {
    if (c < 0x21 || c > 0x7e) c = '?';
  }
  return id;
}

void FinishUnaryCall(grpc::CallbackServerContext* ctx, grpc::ServerUnaryReactor* reactor,
                     RpcObserver* observer, std::string_view method, absl::Time start,
                     const absl::Status& status, const ModelRef& model) {
  const absl::Duration latency = absl::Now() - start;
  const std::string request_id = RequestIdOf(*ctx);
  ctx->AddTrailingMetadata(kRequestIdHeader, request_id);
  observer->OnRpcDone(method, status.code(), latency, 0);
  if (ShouldLogCall(status.code())) {
    const std::string peer = ctx->peer();
    const std::string model_field = ModelField(model);
    LogCallDone({.method = method,
                 .request_id = request_id,
                 .peer = peer,
                 .model = model_field,
                 .status = status,
                 .latency = latency});
  }
  reactor->Finish(ToGrpcStatus(status));
}

}  // namespace kvcache
