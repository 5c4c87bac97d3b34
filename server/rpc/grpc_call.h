// What every gRPC handler does with its call's context: read the request id
// the client sent and finish a unary call (trailers, metrics, the log line).
// The log line itself and the request-id rules are the front doors' shared
// ones (server/frontdoor/call_log.h).
//
// Thread-safe.
#ifndef KVCACHE_SERVER_RPC_GRPC_CALL_H_
#define KVCACHE_SERVER_RPC_GRPC_CALL_H_

#include <grpcpp/server_context.h>

#include <string>
#include <string_view>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "server/frontdoor/call_log.h"
#include "server/frontdoor/rpc_observer.h"

namespace kvcache {

// The client's x-request-id (characters outside printable ASCII become '?'),
// or a new id when it sent none or an empty one.
std::string RequestIdOf(const grpc::CallbackServerContext& ctx);

// Finishes a unary call with `status`: echoes its request id in the trailers,
// reports it to `observer`, logs it and calls reactor->Finish. `model` as in
// CallOutcome. From any thread, once per call.
void FinishUnaryCall(grpc::CallbackServerContext* ctx, grpc::ServerUnaryReactor* reactor,
                     RpcObserver* observer, std::string_view method, absl::Time start,
                     const absl::Status& status, const ModelRef& model = {});

}  // namespace kvcache

#endif  // KVCACHE_SERVER_RPC_GRPC_CALL_H_
