#include "server/rpc/server.h"

#include <grpcpp/ext/proto_server_reflection_plugin.h>
#include <grpcpp/health_check_service_interface.h>
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
