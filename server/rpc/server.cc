#include "server/rpc/server.h"

#include <grpcpp/ext/proto_server_reflection_plugin.h>
#include <grpcpp/health_check_service_interface.h>
#include <grpcpp/resource_quota.h>
#include <grpcpp/security/server_credentials.h>
#include <grpcpp/security/tls_certificate_provider.h>
#include <grpcpp/security/tls_credentials_options.h>
#include <grpcpp/server_builder.h>
#include <netdb.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "server/common/status_macros.h"
#include "server/frontdoor/unix_socket.h"
#include "server/rpc/unix_acceptor.h"

namespace kvcache {

namespace {

// The HTTP/2 flow-control window each stream starts with (the client uses the
// same for fetches): a few of the largest usual values (KV blocks of 0.5 to
// 4 MiB).
constexpr int kStreamWindowBytes = 8 << 20;

// The TCP listener's credentials: TLS (mutual with a client CA) from files
// gRPC re-reads every reload_interval, or plaintext.
std::shared_ptr<grpc::ServerCredentials> TcpCredentials(const TlsFiles& tls) {
  if (!tls.enabled()) return grpc::InsecureServerCredentials();
  const auto interval =
      static_cast<unsigned int>(std::max<int64_t>(1, absl::ToInt64Seconds(tls.reload_interval)));
  std::shared_ptr<grpc::experimental::CertificateProviderInterface> provider;
  if (tls.mutual()) {
    provider = std::make_shared<grpc::experimental::FileWatcherCertificateProvider>(
        tls.key_file, tls.cert_file, tls.client_ca_file, interval);
  } else {
    provider = std::make_shared<grpc::experimental::FileWatcherCertificateProvider>(
        tls.key_file, tls.cert_file, interval);
  }
  grpc::experimental::TlsServerCredentialsOptions options(provider);
  options.watch_identity_key_cert_pairs();
  if (tls.mutual()) {
    options.watch_root_certs();
    options.set_cert_request_type(GRPC_SSL_REQUEST_AND_REQUIRE_CLIENT_CERTIFICATE_AND_VERIFY);
  } else {
    options.set_cert_request_type(GRPC_SSL_DONT_REQUEST_CLIENT_CERTIFICATE);
  }
  return grpc::experimental::TlsServerCredentials(options);
}

}  // namespace

absl::Status CheckTcpAddressFree(const std::string& tcp_address) {
  std::string host;
  std::string port;
  if (!tcp_address.empty() && tcp_address.front() == '[') {
    const size_t close = tcp_address.find(']');
    if (close == std::string::npos || close + 1 >= tcp_address.size() ||
        tcp_address[close + 1] != ':') {
      return absl::OkStatus();
    }
    host = tcp_address.substr(1, close - 1);
    port = tcp_address.substr(close + 2);
  } else {
    const size_t colon = tcp_address.rfind(':');
    if (colon == std::string::npos) return absl::OkStatus();
    host = tcp_address.substr(0, colon);
    port = tcp_address.substr(colon + 1);
  }
  if (port.empty() || port == "0") return absl::OkStatus();
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE | AI_NUMERICSERV;
  addrinfo* found = nullptr;
  if (::getaddrinfo(host.empty() ? nullptr : host.c_str(), port.c_str(), &hints, &found) != 0) {
    return absl::OkStatus();
  }
  absl::Status status = absl::OkStatus();
  for (addrinfo* a = found; a != nullptr && status.ok(); a = a->ai_next) {
    const int fd = ::socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC, a->ai_protocol);
    if (fd < 0) continue;
    UniqueFd closer(fd);
    const int one = 1;
    ::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    if (::bind(fd, a->ai_addr, a->ai_addrlen) != 0 && errno == EADDRINUSE) {
      status = absl::UnavailableError(absl::StrCat("cannot listen on ", tcp_address,
                                                   ": the address is in use (another kvcached?)"));
    }
  }
  ::freeaddrinfo(found);
  return status;
}

absl::StatusOr<std::unique_ptr<GrpcServer>> GrpcServer::Start(GrpcServerOptions options,
                                                              Cache* cache, RpcObserver* observer) {
  if (options.tcp_address.empty() && options.unix_socket.empty()) {
    return absl::InvalidArgumentError("listen: enable tcp_address, unix_socket or both");
  }
  // The TCP port first: a start that cannot have it must not touch the socket.
  if (!options.tcp_address.empty()) {
    KVCACHE_RETURN_IF_ERROR(CheckTcpAddressFree(options.tcp_address));
    KVCACHE_RETURN_IF_ERROR(CheckTlsFiles(options.tls));
  }
  std::unique_ptr<GrpcServer> server(new GrpcServer());
  if (!options.unix_socket.empty()) {
    absl::StatusOr<std::unique_ptr<UnixAcceptor>> acceptor =
        UnixAcceptor::Listen(options.unix_socket, options.socket_gid);
    if (!acceptor.ok()) return acceptor.status();
    server->unix_acceptor_ = *std::move(acceptor);
  }
  grpc::EnableDefaultHealthCheckService(true);
  grpc::reflection::InitProtoReflectionServerBuilderPlugin();

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
  // Let a stream carry a whole large value before it waits for a window
  // update: with HTTP/2's 64 KiB default a 2 MiB Append waited for the
  // server's WINDOW_UPDATE about 30 times. What this lets clients buffer in
  // the daemon stays under the memory quota above.
  builder.AddChannelArgument(GRPC_ARG_HTTP2_STREAM_LOOKAHEAD_BYTES, kStreamWindowBytes);
  if (!options.tcp_address.empty()) {
    builder.AddListeningPort(options.tcp_address, TcpCredentials(options.tls), &server->tcp_port_);
    server->listen_addresses_.push_back(options.tcp_address);
  }
  if (!options.unix_socket.empty()) {
    // Accepted by the UnixAcceptor, which tells calls their peer's uid.
    server->listen_addresses_.push_back(absl::StrCat("unix:", options.unix_socket));
  }
  options.identity.listen_addresses = server->listen_addresses_;
  options.cache_service.inflight = options.inflight;
  options.cache_service.access = options.access;
  server->cache_service_ = std::make_unique<CacheService>(options.cache_service, cache, observer);
  server->admin_service_ =
      std::make_unique<AdminService>(options.identity, cache, observer,
                                     AdminSources{.checkpoints = options.checkpoints,
                                                  .rpc_tally = options.rpc_tally,
                                                  .inflight = options.inflight,
                                                  .access = options.access,
                                                  .memory = options.memory,
                                                  .remote_tier = options.remote_tier});
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
  if (server->unix_acceptor_ != nullptr) server->unix_acceptor_->Start(server->server_.get());
  return server;
}

GrpcServer::~GrpcServer() {
  if (server_ != nullptr) Shutdown(absl::ZeroDuration());
}

void GrpcServer::Shutdown(absl::Duration drain) {
  if (shut_down_) return;
  shut_down_ = true;
  if (unix_acceptor_ != nullptr) unix_acceptor_->Stop();
  server_->GetHealthCheckService()->SetServingStatus(false);
  cache_service_->AnswerWaitingLookups();
  server_->Shutdown(absl::ToChronoTime(absl::Now() + drain));
}

void GrpcServer::Wait() { server_->Wait(); }

}  // namespace kvcache
