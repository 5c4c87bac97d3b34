#include "server/rpc/server.h"

#include <grpcpp/ext/proto_server_reflection_plugin.h>
#include <grpcpp/health_check_service_interface.h>
#include <grpcpp/resource_quota.h>
#include <grpcpp/security/server_credentials.h>
#include <grpcpp/server_builder.h>
#include <unistd.h>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"

namespace kvcache {

absl::StatusOr<std::unique_ptr<GrpcServer>> GrpcServer::Start(GrpcServerOptions options,
                                                              Cache* cache, RpcObserver* observer) {
  if (options.tcp_address.empty() && options.unix_socket.empty()) {
    return absl::InvalidArgumentError("listen: enable tcp_address, unix_socket or both");
  }
  grpc::EnableDefaultHealthCheckService(true);
  grpc::reflection::InitProtoReflectionServerBuilderPlugin();

  std::unique_ptr<GrpcServer> server(new GrpcServer());
  grpc::ServerBuilder builder;
  const int max_message = static_cast<int>(
      std::min<uint64_t>(options.max_message_bytes, std::numeric_limits<int>::max()));
  builder.SetMaxReceiveMessageSize(max_message);
  builder.SetMaxSendMessageSize(max_message);
  // Without this a second daemon could bind the same TCP port and silently
  // take half of the connections.
  builder.AddChannelArgument(GRPC_ARG_ALLOW_REUSEPORT, 0);
  // What gRPC itself may buffer (connections, messages being read) is capped.
  grpc::ResourceQuota quota("kvcached");
  quota.Resize(static_cast<size_t>(options.grpc_memory_quota_bytes));
  builder.SetResourceQuota(quota);
  // Ping every connection every keepalive_time, with or without calls and
  // data, and close it when a ping goes unanswered for keepalive_timeout: a
  // peer that died or hangs loses its streams and their slots.
  builder.AddChannelArgument(GRPC_ARG_KEEPALIVE_TIME_MS,
                             static_cast<int>(absl::ToInt64Milliseconds(options.keepalive_time)));
  builder.AddChannelArgument(
      GRPC_ARG_KEEPALIVE_TIMEOUT_MS,
      static_cast<int>(absl::ToInt64Milliseconds(options.keepalive_timeout)));
  builder.AddChannelArgument(GRPC_ARG_KEEPALIVE_PERMIT_WITHOUT_CALLS, 1);
  builder.AddChannelArgument(GRPC_ARG_HTTP2_MAX_PINGS_WITHOUT_DATA, 0);
  // Clients may keep their connections alive with pings every 5 s or more.
  builder.AddChannelArgument(GRPC_ARG_HTTP2_MIN_RECV_PING_INTERVAL_WITHOUT_DATA_MS, 5000);
  if (!options.tcp_address.empty()) {
    builder.AddListeningPort(options.tcp_address, grpc::InsecureServerCredentials(),
                             &server->tcp_port_);
    server->listen_addresses_.push_back(options.tcp_address);
  }
  if (!options.unix_socket.empty()) {
    ::unlink(options.unix_socket.c_str());  // a stale socket from an earlier run
    std::string uri = absl::StrCat("unix:", options.unix_socket);
    builder.AddListeningPort(uri, grpc::InsecureServerCredentials());
    server->listen_addresses_.push_back(uri);
  }
  options.identity.listen_addresses = server->listen_addresses_;
  server->cache_service_ = std::make_unique<CacheService>(options.cache_service, cache, observer);
  server->admin_service_ = std::make_unique<AdminService>(options.identity, cache, observer);
  builder.RegisterService(server->cache_service_.get());
  builder.RegisterService(server->admin_service_.get());
  server->server_ = builder.BuildAndStart();
  if (server->server_ == nullptr) {
    return absl::UnavailableError(absl::StrCat("cannot listen on ",
                                               absl::StrJoin(server->listen_addresses_, " and "),
                                               " (address in use or not permitted?)"));
  }
  if (!options.tcp_address.empty() && server->tcp_port_ == 0) {
    return absl::UnavailableError(absl::StrCat("cannot bind ", options.tcp_address));
  }
  return server;
}

GrpcServer::~GrpcServer() {
  if (server_ != nullptr) Shutdown(absl::ZeroDuration());
}

void GrpcServer::Shutdown(absl::Duration drain) {
  if (shut_down_) return;
  shut_down_ = true;
  server_->GetHealthCheckService()->SetServingStatus(false);
  server_->Shutdown(absl::ToChronoTime(absl::Now() + drain));
}

void GrpcServer::Wait() { server_->Wait(); }

}  // namespace kvcache
