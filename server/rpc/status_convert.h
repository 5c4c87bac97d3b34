// The one place where core errors become gRPC statuses (and back, for tests).
#ifndef KVCACHE_SERVER_RPC_STATUS_CONVERT_H_
#define KVCACHE_SERVER_RPC_STATUS_CONVERT_H_

#include <grpcpp/support/status.h>

#include "absl/status/status.h"

namespace kvcache {

// absl status codes are the gRPC codes, so the code maps one to one.
grpc::Status ToGrpcStatus(const absl::Status& status);

}  // namespace kvcache

#endif  // KVCACHE_SERVER_RPC_STATUS_CONVERT_H_
